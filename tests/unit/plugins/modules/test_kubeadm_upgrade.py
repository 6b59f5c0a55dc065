# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""kubeadm_upgrade against a scripted kubeadm and kubectl: what runs, when nothing runs, and that the bootstrap
tokens' certificate bindings `kubeadm upgrade apply` re-creates are deleted again."""

from __future__ import annotations

import pytest
from module_runner import module_outcome, run_main  # noqa: F401  # pylint: disable=unused-import

from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm import Kubeadm
from ansible_collections.confidential.kubernetes.plugins.modules import kubeadm_upgrade

MANIFEST = "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: kube-apiserver\n    image: k8s.gcr.io/kube-apiserver:{}\n"


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """A control plane's files, and a kubeadm/kubectl whose `upgrade apply` re-creates the token bindings."""
    manifest = tmp_path / "kube-apiserver.yaml"
    admin = tmp_path / "admin.conf"
    admin.write_text("kind: Config\n")
    state = {"calls": [], "bindings": set()}

    def run_command(self, argv, stdin=None):
        state["calls"].append(argv)
        if argv[1:3] == ["upgrade", "apply"]:
            # kubeadm's post-upgrade step: the bootstrap RBAC rules of kubeadm init, again.
            state["bindings"] |= {"kubeadm:node-autoapprove-bootstrap", "kubeadm:kubelet-bootstrap"}
            manifest.write_text(MANIFEST.format(argv[3]))
            return 0, "[upgrade/successful] SUCCESS!\n", ""
        if argv[1:3] == ["upgrade", "node"]:
            return 0, "[upgrade] The configuration for this node was successfully updated!\n", ""
        if argv[2] == "get":
            return 0, (f"clusterrolebinding/{argv[4]}\n" if argv[4] in state["bindings"] else ""), ""
        if argv[2] == "delete":
            state["bindings"].discard(argv[4])
            return 0, "", ""
        return 1, "", f"unexpected {argv}"

    monkeypatch.setattr(Kubeadm, "_run_command", run_command)
    monkeypatch.setattr(kubeadm_upgrade, "KUBE_APISERVER_MANIFEST", str(manifest))
    monkeypatch.setattr(kubeadm_upgrade, "ADMIN_CONF", str(admin))
    monkeypatch.setattr(
        "ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm.upgrade.ADMIN_CONF", str(admin)
    )
    manifest.write_text(MANIFEST.format("v1.20.2"))
    return state


def kubeadm_runs(state):
    return [argv[1:] for argv in state["calls"] if argv[0].endswith("kubeadm")]


def test_upgrade_apply_runs_once_and_the_token_bindings_it_recreates_are_deleted_again(cluster):
    args = {
        "kubernetes_version": "1.20.3-lab.1",
        "mode": "apply",
        "allow_pre_release": True,
        "binary_path": "/usr/local/bin/kubeadm",
    }
    result = run_main(kubeadm_upgrade.main, args)
    assert result["changed"] and result["ran"] and result["running_version"] == "v1.20.2", result
    assert kubeadm_runs(cluster) == [["upgrade", "apply", "v1.20.3-lab.1", "--yes", "--allow-experimental-upgrades"]]
    assert sorted(result["revoked_token_bindings"]) == [
        "kubeadm:kubelet-bootstrap",
        "kubeadm:node-autoapprove-bootstrap",
    ]
    assert cluster["bindings"] == set()

    # At the target: kubeadm is not run again, and the bindings stay absent.
    cluster["calls"].clear()
    again = run_main(kubeadm_upgrade.main, args)
    assert (again["changed"], again["ran"], again["revoked_token_bindings"]) == (False, False, [])
    assert kubeadm_runs(cluster) == []


def test_bindings_that_came_back_after_an_upgrade_are_deleted_on_a_re_run(cluster):
    args = {"kubernetes_version": "v1.20.2", "mode": "apply", "binary_path": "/usr/local/bin/kubeadm"}
    cluster["bindings"].add("kubeadm:node-autoapprove-bootstrap")
    result = run_main(kubeadm_upgrade.main, args)
    assert (result["changed"], result["ran"], result["revoked_token_bindings"]) == (
        True,
        False,
        ["kubeadm:node-autoapprove-bootstrap"],
    )


def test_check_mode_runs_no_kubeadm_and_deletes_nothing(cluster):
    cluster["bindings"].add("kubeadm:kubelet-bootstrap")
    args = {
        "kubernetes_version": "v1.20.3",
        "mode": "apply",
        "_ansible_check_mode": True,
        "binary_path": "/usr/local/bin/kubeadm",
    }
    result = run_main(kubeadm_upgrade.main, args)
    assert (result["changed"], result["ran"], result["revoked_token_bindings"]) == (
        True,
        True,
        ["kubeadm:kubelet-bootstrap"],
    )
    assert kubeadm_runs(cluster) == [] and cluster["bindings"] == {"kubeadm:kubelet-bootstrap"}


def test_upgrade_node_on_a_control_plane_at_the_target_runs_nothing(cluster):
    args = {"kubernetes_version": "v1.20.2", "mode": "node", "binary_path": "/usr/local/bin/kubeadm"}
    result = run_main(kubeadm_upgrade.main, args)
    assert (result["changed"], result["ran"]) == (False, False) and kubeadm_runs(cluster) == []
    assert "revoked_token_bindings" not in result
    moved = run_main(
        kubeadm_upgrade.main, {**args, "kubernetes_version": "v1.20.3", "ignore_preflight_errors": ["ImagePull"]}
    )
    assert moved["changed"] and kubeadm_runs(cluster) == [["upgrade", "node", "--ignore-preflight-errors=ImagePull"]]


def test_a_malformed_version_fails_naming_it_and_runs_nothing(cluster):
    result = run_main(kubeadm_upgrade.main, {"kubernetes_version": "latest", "mode": "apply"})
    assert result["failed"] and "'latest' is not a Kubernetes version" in result["msg"]
    assert cluster["calls"] == []
