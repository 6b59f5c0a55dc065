# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The upgrade preflight's decisions, one case per behaviour, over what the API would report."""

from __future__ import annotations

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm.upgrade import (
    NodeReport,
    UpgradeRefused,
    Version,
    nodes_from_api,
    pending_nodes,
    static_pod_version,
    upgrade_problems,
)

READY = [NodeReport("cp-0", "v1.20.2", True), NodeReport("worker-0", "v1.20.2", True)]


@pytest.mark.parametrize(
    ("name", "server", "nodes", "target", "allow_pre_release", "expected"),
    [
        ("a patch", "v1.20.2", READY, "1.20.5", False, []),
        ("the next minor", "v1.20.2", READY, "v1.21.0", False, []),
        (
            "two minors at once",
            "v1.20.2",
            READY,
            "v1.22.0",
            False,
            ["v1.22.0 is more than one minor above the control plane's v1.20.2: upgrade one minor at a time"],
        ),
        (
            "another major",
            "v1.20.2",
            READY,
            "v2.0.0",
            False,
            ["v2.0.0 is more than one minor above the control plane's v1.20.2"],
        ),
        (
            "a downgrade",
            "v1.21.1",
            [NodeReport("cp-0", "v1.21.1", True)],
            "v1.21.0",
            False,
            [
                "v1.21.0 is lower than the control plane's v1.21.1: a downgrade is not an upgrade",
                "node cp-0 runs kubelet v1.21.1, newer than the target v1.21.0",
            ],
        ),
        (
            "a pre-release without the switch",
            "v1.20.2",
            READY,
            "v1.20.3-lab.1",
            False,
            ["v1.20.3-lab.1 is a pre-release, which kubeadm upgrade treats as unstable"],
        ),
        ("a pre-release with the switch (the lab's relabelled build)", "v1.20.2", READY, "v1.20.3-lab.1", True, []),
        (
            "a node not Ready",
            "v1.20.2",
            [READY[0], NodeReport("worker-0", "v1.20.2", False)],
            "v1.20.3",
            False,
            ["node worker-0 is not Ready"],
        ),
        (
            "a resumed upgrade: the control plane and one node at the target already",
            "v1.20.3",
            [NodeReport("cp-0", "v1.20.3", True), NodeReport("worker-0", "v1.20.2", True)],
            "v1.20.3",
            False,
            [],
        ),
        (
            "a node newer than the target",
            "v1.20.2",
            [READY[0], NodeReport("worker-0", "v1.20.4", True)],
            "v1.20.3",
            False,
            ["node worker-0 runs kubelet v1.20.4, newer than the target v1.20.3"],
        ),
        (
            "not a version",
            "v1.20.2",
            READY,
            "latest",
            False,
            ["kubernetes_version: 'latest' is not a Kubernetes version"],
        ),
    ],
)
def test_upgrade_preflight_decisions(name, server, nodes, target, allow_pre_release, expected):
    problems = upgrade_problems(server, nodes, target, allow_pre_release)
    assert len(problems) == len(expected), (name, problems)
    for problem, start in zip(problems, expected):
        assert problem.startswith(start), (name, problem)


def test_every_problem_is_reported_not_only_the_first():
    nodes = [NodeReport("cp-0", "v1.20.2", False), NodeReport("worker-1", "v1.20.2", False)]
    problems = upgrade_problems("v1.20.2", nodes, "v1.22.0-rc.0")
    assert [p.split(" ")[0:2] for p in problems] == [
        ["v1.22.0-rc.0", "is"],
        ["v1.22.0-rc.0", "is"],
        ["node", "cp-0"],
        ["node", "worker-1"],
    ]


def test_a_pre_release_sorts_below_its_release_and_above_the_previous_patch():
    assert Version.parse("v1.20.2") < Version.parse("v1.20.3-lab.1") < Version.parse("v1.20.3")
    assert str(Version.parse("1.20.3-lab.1")) == "v1.20.3-lab.1"
    with pytest.raises(UpgradeRefused, match="'1.20' is not a Kubernetes version"):
        Version.parse("1.20")


def test_nodes_and_pending_nodes_from_the_api():
    node_list = {
        "items": [
            {
                "metadata": {"name": "cp-0"},
                "status": {
                    "nodeInfo": {"kubeletVersion": "v1.20.3-lab.1"},
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            },
            {
                "metadata": {"name": "worker-0"},
                "status": {
                    "nodeInfo": {"kubeletVersion": "v1.20.2"},
                    "conditions": [{"type": "Ready", "status": "Unknown"}],
                },
            },
        ]
    }
    nodes = nodes_from_api(node_list)
    assert nodes == [NodeReport("cp-0", "v1.20.3-lab.1", True), NodeReport("worker-0", "v1.20.2", False)]
    assert pending_nodes(nodes, "1.20.3-lab.1") == ["worker-0"]
    assert pending_nodes(nodes, "v1.20.2") == ["cp-0"]


@pytest.mark.parametrize(
    ("image", "version"),
    [
        ("k8s.gcr.io/kube-apiserver:v1.20.3-lab.1", "v1.20.3-lab.1"),
        ("registry.example:5000/kube-apiserver:v1.36.4", "v1.36.4"),
        ("registry.example:5000/kube-apiserver", ""),
    ],
)
def test_the_static_pods_version_is_its_image_tag(image, version):
    assert static_pod_version({"spec": {"containers": [{"image": image}]}}) == version
