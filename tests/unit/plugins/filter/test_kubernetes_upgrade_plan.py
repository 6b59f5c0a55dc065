"""The kubernetes_upgrade_plan filter: the preflight's decision over `kubectl get nodes -o json`."""

from __future__ import annotations

from ansible_collections.confidential.kubernetes.plugins.filter.kubernetes_upgrade_plan import kubernetes_upgrade_plan


def _nodes(*nodes: tuple[str, str, str]) -> dict:
    return {
        "items": [
            {
                "metadata": {"name": name},
                "status": {"nodeInfo": {"kubeletVersion": version}, "conditions": [{"type": "Ready", "status": ready}]},
            }
            for name, version, ready in nodes
        ]
    }


def test_the_pending_nodes_are_those_not_at_the_target_in_the_apis_order():
    node_list = _nodes(
        ("cp-0", "v1.20.3-lab.1", "True"), ("worker-0", "v1.20.2", "True"), ("worker-1", "v1.20.2", "True")
    )
    assert kubernetes_upgrade_plan(node_list, "v1.20.3-lab.1", "1.20.3-lab.1", True) == {
        "problems": [],
        "pending": ["worker-0", "worker-1"],
    }
    assert kubernetes_upgrade_plan(node_list, "v1.20.3-lab.1", "v1.20.3-lab.1", True)["pending"] == [
        "worker-0",
        "worker-1",
    ]


def test_a_refused_upgrade_has_no_pending_nodes():
    plan = kubernetes_upgrade_plan(_nodes(("cp-0", "v1.20.2", "False")), "v1.20.2", "1.21.0")
    assert plan["pending"] == []
    assert plan["problems"] == ["node cp-0 is not Ready: fix or remove it before an upgrade"]
