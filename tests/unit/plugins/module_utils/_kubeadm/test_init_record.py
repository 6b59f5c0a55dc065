# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""kubeadm init is complete only when recorded for the node's cluster CA (admin.conf comes too early to tell)."""

from __future__ import annotations

from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm import INIT_RECORD, Kubeadm

CA_HASH = "sha256:" + "ab" * 32


def _kubeadm(tmp_path) -> Kubeadm:
    (tmp_path / "etc" / "kubernetes").mkdir(parents=True)
    return Kubeadm(root=str(tmp_path))


def test_interrupted_init_is_not_complete(tmp_path):
    kubeadm = _kubeadm(tmp_path)
    (tmp_path / "etc" / "kubernetes" / "admin.conf").write_text("apiVersion: v1\n")
    assert not kubeadm.init_completed(CA_HASH)


def test_recorded_init_is_complete(tmp_path):
    kubeadm = _kubeadm(tmp_path)
    kubeadm.record_init_completed(CA_HASH)
    assert kubeadm.init_completed(CA_HASH)
    assert (tmp_path / INIT_RECORD.lstrip("/")).read_text() == CA_HASH + "\n"


def test_record_of_another_cluster_ca_does_not_count(tmp_path):
    """kubeadm reset leaves the record behind; a new init makes a new CA, so the stale record must not match."""
    kubeadm = _kubeadm(tmp_path)
    kubeadm.record_init_completed("sha256:" + "cd" * 32)
    assert not kubeadm.init_completed(CA_HASH)
