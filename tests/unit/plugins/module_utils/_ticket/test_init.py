"""Where the first control plane stands (``init_state``), against a real swtpm and a node's files in a temp root: only a
node locked for this cluster, PCR 15 marked, kubeadm init completed and this cluster's secrets kept is initialised;
every other node is not, and the reason says what is missing."""

from __future__ import annotations

import hashlib
import os

import pytest
from init_harness import ADMIN_KUBECONFIG, SECRETS, InitialisedNode

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.issuer import Tpm, TpmError
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.root_secrets import RootSecrets
from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm import ADMIN_CONF, CA_CERT, Kubeadm
from ansible_collections.confidential.kubernetes.plugins.module_utils._nodelock import NodeLock
from ansible_collections.confidential.kubernetes.plugins.module_utils._ticket.init import init_state


@pytest.fixture
def initialised(tmp_path, swtpm):
    return InitialisedNode(tmp_path, swtpm.tcti)


def test_a_node_initialised_for_this_cluster_is_initialised_with_its_admin_kubeconfig_digest(initialised):
    state = initialised.state()
    assert state.initialised and state.reason == "" and state.admin_kubeconfig_exists
    assert state.node_lock["cluster_id"] == initialised.cluster_id and state.node_lock["pcr15_state"] == "marked"
    assert state.admin_kubeconfig_sha256 == hashlib.sha256(ADMIN_KUBECONFIG).hexdigest()


def _remove(node, absolute):
    os.unlink(node.kubeadm.path(absolute))


# Each case breaks one thing the init leaves behind; the node must then get the whole hand-over, and say why.
CASES = {
    "no cluster secrets on the controller yet": (
        lambda node: None,
        None,
        "the controller holds no cluster secrets yet",
    ),
    "another cluster's secrets on the controller": (lambda node: None, "ab" * 32, "the node is locked for cluster"),
    "kubeadm init never wrote admin.conf": (
        lambda node: _remove(node, ADMIN_CONF),
        "this",
        "has not written the admin kubeconfig",
    ),
    "kubeadm init interrupted (no completion record)": (
        lambda node: _remove(node, "/etc/kubernetes/confidential-kubernetes-init.done"),
        "this",
        "kubeadm init did not run to the end",
    ),
    "completion recorded for another cluster CA": (
        lambda node: node.kubeadm.record_init_completed("sha256:" + "0" * 64),
        "this",
        "kubeadm init did not run to the end",
    ),
    "cluster CA unreadable": (
        lambda node: node.write(CA_CERT, b"not a certificate"),
        "this",
        "the cluster CA cannot be read",
    ),
    "root secrets not kept": (lambda node: _remove(node, SECRETS), "this", "the node keeps no root secrets"),
    "root secrets readable by others": (lambda node: node.keep(node.secrets, 0o644), "this", "not 0600"),
    "root secrets of another cluster": (
        lambda node: node.keep(RootSecrets(os.urandom(32), os.urandom(32), os.urandom(32))),
        "this",
        "are those of cluster",
    ),
    "root secrets malformed": (lambda node: node.write(SECRETS, b'{"master_key": 1}', 0o600), "this", "master_key"),
    "lock record malformed": (lambda node: open(node.lock_record, "w").write("{"), "this", "lock record"),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_a_node_missing_one_piece_is_not_initialised_and_says_why(initialised, case):
    damage, cluster_id, reason = CASES[case]
    damage(initialised)
    state = initialised.state(cluster_id)
    assert not state.initialised and reason in state.reason and state.admin_kubeconfig_sha256 is None


def test_a_fresh_node_is_not_initialised(tmp_path, swtpm):
    lock = NodeLock(lambda: Tpm(swtpm.tcti), str(tmp_path / "nodelock.json"))
    state = init_state("ab" * 32, lock, Kubeadm(root=str(tmp_path)), str(tmp_path / "cluster-secrets.json"))
    assert (state.initialised, state.reason, state.admin_kubeconfig_exists) == (False, "the node is not locked", False)
    assert state.node_lock["pcr15_state"] == "unlocked"


def test_a_rebooted_node_is_not_initialised_so_the_hand_over_marks_pcr15_again(initialised, start_swtpm):
    """The same TPM after a reboot: PCR 15 is zero again while the lock record stays."""
    initialised.tcti = start_swtpm("lab").tcti
    state = initialised.state()
    assert not state.initialised and "PCR 15 does not carry the cluster's mark (unlocked" in state.reason
    assert state.node_lock["locked"] and state.admin_kubeconfig_exists


def test_an_unreachable_tpm_is_an_error_not_a_verdict(initialised, tmp_path):
    initialised.tcti = f"swtpm:path={tmp_path / 'no-such.sock'}"
    with pytest.raises(TpmError):
        initialised.state()
