# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Checks before the node lock: installed versions, the kubelet skew policy, and kubeadm's join preflight (the real
kubeadm where it is built) reaching discovery without a token or an endpoint."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm import JoinOptions, Kubeadm
from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm.preflight import (
    PreflightError,
    check_installed,
    check_kubelet_skew,
    join_preflight,
    max_kubelet_skew,
    parse_version,
    render_join_preflight_config,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._ticket import TicketError
from ansible_collections.confidential.kubernetes.plugins.module_utils._ticket.versions import check_cluster_version

import yaml

REAL_KUBEADM = Path(os.environ.get("CK_KUBERNETES_BIN", "/var/tmp/k8s-prebuilt/bin")) / "kubeadm"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("v1.20.2", (1, 20, 2)),
        ("1.34.4", (1, 34, 4)),
        ("Kubernetes v1.20.2\n", (1, 20, 2)),
        ("v1.31.0-rc.1", (1, 31, 0)),
    ],
)
def test_versions_are_read_from_every_form_the_tools_print(text, expected):
    assert parse_version(text, "x") == expected


def test_an_unreadable_version_names_its_source():
    with pytest.raises(PreflightError, match="cannot read the version of the kubelet from 'Kubernetes unknown'"):
        parse_version("Kubernetes unknown", "the kubelet")


def test_installed_binaries_must_equal_kubernetes_version():
    check_installed("1.20.2", {"kubeadm": "v1.20.2", "kubelet": "Kubernetes v1.20.2"})
    with pytest.raises(PreflightError) as failed:
        check_installed("v1.20.2", {"kubeadm": "v1.20.2", "kubelet": "Kubernetes v1.20.5"})
    assert "kubelet is v1.20.5 but kubernetes_version is v1.20.2" in str(failed.value)
    assert "kubeadm" not in str(failed.value).split(" but ", maxsplit=1)[0] and "not locked" in str(failed.value)


def test_no_kubernetes_version_means_no_equality_check():
    check_installed("", {"kubeadm": "v1.34.4", "kubelet": "Kubernetes v1.20.2"})


@pytest.mark.parametrize(
    "kubelet, cluster, allowed",
    [
        ("v1.20.2", "v1.20.2", True),
        ("v1.20.5", "v1.20.2", True),  # the policy counts minor versions
        ("v1.18.0", "v1.20.2", True),
        ("v1.17.9", "v1.20.2", False),  # three minors older: 1.20 allows two
        ("v1.21.0", "v1.20.2", False),  # newer than the API server
        ("v1.25.0", "v1.27.0", True),
        ("v1.24.0", "v1.27.0", False),  # three older before API server 1.28
        ("v1.25.0", "v1.28.0", True),  # three older from 1.28, for a kubelet from 1.25
        ("v1.24.0", "v1.27.0", False),
        ("v1.31.4", "v1.34.4", True),
        ("v1.30.9", "v1.34.4", False),
        ("v1.35.0", "v1.34.4", False),
        ("v2.0.0", "v1.34.4", False),
    ],
)
def test_kubelet_skew_policy(kubelet, cluster, allowed):
    if allowed:
        check_kubelet_skew(kubelet, cluster)
    else:
        with pytest.raises(PreflightError, match="newer than the cluster's API server|minor versions older"):
            check_kubelet_skew(kubelet, cluster)


def test_skew_allowance_follows_the_policy_of_the_supported_versions():
    assert max_kubelet_skew((1, 20, 2), (1, 20, 2)) == 2
    assert max_kubelet_skew((1, 27, 0), (1, 25, 0)) == 2
    assert max_kubelet_skew((1, 28, 0), (1, 24, 0)) == 2
    assert max_kubelet_skew((1, 34, 4), (1, 31, 0)) == 3


def test_ticket_version_check_refuses_with_a_ticket_error_and_skips_what_is_unknown():
    check_cluster_version("", "Kubernetes v1.35.0")
    check_cluster_version("v1.34.4", "")
    check_cluster_version("v1.34.4", "Kubernetes v1.32.1")
    with pytest.raises(TicketError, match=r"kubelet is v1\.35\.0, newer .*v1\.34\.4.*the node was not locked"):
        check_cluster_version("v1.34.4", "Kubernetes v1.35.0")


def test_join_preflight_configuration_has_no_token_and_no_endpoint(tmp_path):
    options = JoinOptions(
        api_server_endpoint=None,
        ca_cert_hashes=None,
        node_name="cp-1",
        control_plane=True,
        advertise_address="10.0.0.2",
        cri_socket="unix:///run/containerd/containerd.sock",
    )
    document = yaml.safe_load(render_join_preflight_config(options, "v1beta3", str(tmp_path / "placeholder")))
    assert document["discovery"] == {"file": {"kubeConfigPath": str(tmp_path / "placeholder")}}
    assert document["controlPlane"] == {"localAPIEndpoint": {"advertiseAddress": "10.0.0.2", "bindPort": 6443}}
    assert document["skipPhases"] == ["control-plane-prepare/download-certs"]
    assert "token" not in str(document) and "apiServerEndpoint" not in str(document)


def _real_kubeadm() -> Kubeadm:
    if os.geteuid() != 0 or not os.access(REAL_KUBEADM, os.X_OK):
        pytest.skip(f"needs root and the real kubeadm at {REAL_KUBEADM}")
    return Kubeadm(str(REAL_KUBEADM))


def test_real_kubeadm_join_preflight_reaches_discovery_without_a_token():
    """With every check made non-fatal (this host is no node), kubeadm gets to discovery and fails on the placeholder
    file, which the preflight counts as passed: the configuration names no endpoint, so there is nothing to dial."""
    kubeadm = _real_kubeadm()
    join_preflight(
        kubeadm,
        JoinOptions(api_server_endpoint=None, ca_cert_hashes=None, node_name="preflight-test"),
        "v1beta2",
        ["all"],
    )


def test_real_kubeadm_join_preflight_failing_before_discovery_is_reported():
    kubeadm = _real_kubeadm()
    with pytest.raises(PreflightError, match="kubeadm's join preflight failed .*the node was not locked"):
        join_preflight(
            kubeadm,
            JoinOptions(api_server_endpoint=None, ca_cert_hashes=None, node_name="Not_A_Node_Name"),
            "v1beta2",
            ["all"],
        )


def test_real_kubeadm_join_preflight_checks_fail_on_this_host_without_ignores():
    kubeadm = _real_kubeadm()
    if shutil.which("crictl") or os.path.exists("/etc/kubernetes/kubelet.conf"):
        pytest.skip("this host looks like a Kubernetes node")
    with pytest.raises(
        PreflightError,
        match=r"the node was not locked: error execution phase preflight: \[preflight\] Some fatal errors occurred",
    ):
        join_preflight(
            kubeadm,
            JoinOptions(api_server_endpoint=None, ca_cert_hashes=None, node_name="preflight-test"),
            "v1beta2",
            [],
        )
