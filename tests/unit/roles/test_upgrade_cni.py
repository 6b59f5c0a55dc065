"""The upgrade role's cni entry point against the real API server on loopback with the real helm: the chart the
versions table row pins (the lab's stand-in for Cilium's, tests/doubles/cilium-chart, packaged by the real helm) is
fetched from a local directory, verified, pushed and installed with the collection's values and the inventory's
overrides; a re-run changes nothing; a chart whose sha256 is not the row's is refused and nothing is installed;
confidential_cni: none installs nothing."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))
CHART_SOURCE = REPO / "tests" / "doubles" / "cilium-chart"
IMAGES = {
    name: f"registry.example/{name}:v9.9.9"
    for name in (
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kube-proxy",
        "etcd",
        "coredns",
        "pause",
    )
}
URL_PATH = "charts/cilium-1.18.0-standin.tgz"


@pytest.fixture(scope="module")
def chart(tmp_path_factory, kube_control_plane) -> Path:
    """The stand-in chart packaged by the real helm, laid out as an artefact tree (source_dir)."""
    tree = tmp_path_factory.mktemp("tree")
    helm = kube_control_plane.bin / "helm-3.17.2"
    subprocess.run(
        [str(helm), "package", str(CHART_SOURCE), "--destination", str(tree / "charts")],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return tree / URL_PATH


def _row(sha256: str, chart_images: dict | None = None) -> dict:
    binaries = dict.fromkeys(("kubeadm", "kubelet", "kubectl", "crictl", "containerd", "runc", "cni_plugins", "helm"))
    chart = {"version": "1.18.0-standin", "url": f"http://mirror.invalid/{URL_PATH}", "sha256": sha256}
    return {
        "artifacts": {**binaries, "cilium": {**chart, **({"images": chart_images} if chart_images else {})}},
        "images": IMAGES,
    }


def _play(
    tmp_path: Path,
    control_plane,
    tree: Path,
    sha256: str,
    entry: str = "cni",
    check: bool = False,
    chart_images: dict | None = None,
    **variables,
) -> subprocess.CompletedProcess:
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "hosts": "localhost",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "ansible.builtin.include_role": {
                                "name": "confidential.kubernetes.upgrade",
                                "tasks_from": entry,
                            }
                        }
                    ],
                }
            ]
        )
    )
    extra = dict(
        ansible_python_interpreter=sys.executable,
        inventory_dir=str(tmp_path),
        kubernetes_version="9.9.9",
        kubernetes_versions_extra={"9.9.9": _row(sha256, chart_images)},
        kubernetes_artifacts_dir=str(tree),
        kubernetes_artifacts_cache=str(tmp_path / "cache"),
        kubernetes_api_endpoint="192.0.2.10:7443",
        upgrade_kubeconfig=str(control_plane.admin_kubeconfig),
        upgrade_controller_kubeconfig=str(control_plane.admin_kubeconfig),
        upgrade_helm_binary=str(control_plane.bin / "helm-3.17.2"),
        **variables,
    )
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=str(REPO / ".venv" / "collections"),
        ANSIBLE_NOCOLOR="1",
        TMPDIR=str(tmp_path),
    )
    return subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", "localhost,", "-c", "local", "-e", json.dumps(extra), str(playbook)]
        + (["--check"] if check else []),
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )


def _recap(run: subprocess.CompletedProcess) -> dict:
    match = re.search(r"localhost\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", run.stdout)
    assert match, run.stdout + run.stderr
    return dict(zip(("ok", "changed", "unreachable", "failed"), map(int, match.groups())))


def _namespace(control_plane, name: str) -> str:
    control_plane.kubectl("create", "namespace", name)
    return name


def _get(control_plane, namespace: str, *what: str) -> subprocess.CompletedProcess:
    return control_plane.kubectl("-n", namespace, "get", *what, "-o", "json", check=False)


def test_installs_the_pinned_chart_with_the_values_and_overrides_and_a_rerun_changes_nothing(
    tmp_path, kube_control_plane, chart
):
    # helm --wait holds the chart's DaemonSet until the controller-manager reports it ready, and no pod runs on this
    # API server (no kubelet): the DaemonSet is ready only while fewer Nodes exist than its maxUnavailable (2).
    assert kube_control_plane.processes["kube-controller-manager"].poll() is None, "the controller-manager exited"
    nodes = kube_control_plane.kubectl("get", "nodes", "-o", "name").stdout.decode().split()
    assert nodes == [], f"Nodes left on the shared API server by another test (use nodes_deleted_after): {nodes}"
    namespace = _namespace(kube_control_plane, "cni-install")
    sha256 = hashlib.sha256(chart.read_bytes()).hexdigest()
    overrides = {"ipam": {"mode": "cluster-pool"}}
    first = _play(
        tmp_path,
        kube_control_plane,
        chart.parents[1],
        sha256,
        upgrade_cni_namespace=namespace,
        confidential_cni_values=overrides,
    )
    assert first.returncode == 0, first.stdout + first.stderr
    assert _recap(first)["changed"] > 0
    config = json.loads(_get(kube_control_plane, namespace, "configmap", "cilium-config").stdout)["data"]
    # The collection's values (the API endpoint kubernetes_api_endpoint, WireGuard) with the inventory's override
    # merged over them (ipam).
    assert config == {
        "k8s-service-host": "192.0.2.10",
        "k8s-service-port": "7443",
        "ipam": "cluster-pool",
        "enable-wireguard": "true",
    }
    for kind in ("daemonset", "serviceaccount"):
        assert _get(kube_control_plane, namespace, kind, "cilium").returncode == 0
    again = _play(
        tmp_path,
        kube_control_plane,
        chart.parents[1],
        sha256,
        upgrade_cni_namespace=namespace,
        confidential_cni_values=overrides,
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert _recap(again)["changed"] == 0, again.stdout
    checked = _play(
        tmp_path,
        kube_control_plane,
        chart.parents[1],
        sha256,
        check=True,
        upgrade_cni_namespace=namespace,
        confidential_cni_values={"ipam": {"mode": "kubernetes"}},
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert (
        "kube-system" not in checked.stdout
        and f"{namespace}/cilium: 1.18.0-standin -> 1.18.0-standin (upgrade" in checked.stdout
    )
    assert (
        json.loads(_get(kube_control_plane, namespace, "configmap", "cilium-config").stdout)["data"]["ipam"]
        == "cluster-pool"
    )


@pytest.mark.parametrize("entry", ["cni", "cni_chart"])
def test_a_chart_whose_sha256_is_not_the_rows_is_refused_and_nothing_is_installed(
    tmp_path, kube_control_plane, chart, entry
):
    namespace = _namespace(kube_control_plane, f"cni-tampered-{entry.replace('_', '-')}")
    tree = tmp_path / "tree"
    (tree / "charts").mkdir(parents=True)
    (tree / URL_PATH).write_bytes(chart.read_bytes() + b"\0")
    run = _play(
        tmp_path,
        kube_control_plane,
        tree,
        hashlib.sha256(chart.read_bytes()).hexdigest(),
        entry,
        upgrade_cni_namespace=namespace,
    )
    assert run.returncode != 0
    assert "sha256 mismatch for cilium 1.18.0-standin (chart)" in run.stdout and URL_PATH in run.stdout
    assert _get(kube_control_plane, namespace, "configmap", "cilium-config").returncode != 0
    assert not list((tmp_path / "cache").rglob("*.tgz"))


def test_where_nodes_preload_images_the_chart_runs_the_rows_images_by_the_tag_they_were_imported_under(
    tmp_path, kube_control_plane, chart
):
    namespace = _namespace(kube_control_plane, "cni-images")
    sha256 = hashlib.sha256(chart.read_bytes()).hexdigest()
    agent = "registry.example/cilium/cilium:v9.9.9"
    images = {
        "cilium": f"{agent}@sha256:{'a' * 64}",
        "cilium-operator": f"registry.example/cilium/operator-generic:v9.9.9@sha256:{'b' * 64}",
    }

    def install(**variables) -> str:
        run = _play(
            tmp_path,
            kube_control_plane,
            chart.parents[1],
            sha256,
            chart_images=images,
            upgrade_cni_namespace=namespace,
            **variables,
        )
        assert run.returncode == 0, run.stdout + run.stderr
        daemonset = json.loads(_get(kube_control_plane, namespace, "daemonset", "cilium").stdout)
        return daemonset["spec"]["template"]["spec"]["containers"][0]["image"]

    # Nodes that pull: the chart's own reference stands.
    assert install() == "quay.io/cilium/cilium:v1.18.0-standin"
    # Nodes that imported the row's images (from a directory here): the chart runs the row's image, by the tag it was
    # imported under (its digest was checked on import).
    assert install(kubernetes_images_dir=str(tmp_path / "site")) == agent
    assert install(confidential_air_gapped=True) == agent
    # The inventory's values still have the last word.
    own = {"image": {"override": "registry.example/site/agent:1"}}
    assert install(confidential_air_gapped=True, confidential_cni_values=own) == "registry.example/site/agent:1"


def test_confidential_cni_none_installs_nothing(tmp_path, kube_control_plane, chart):
    namespace = _namespace(kube_control_plane, "cni-none")
    run = _play(
        tmp_path,
        kube_control_plane,
        chart.parents[1],
        "0" * 64,
        upgrade_cni_namespace=namespace,
        confidential_cni="none",
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert _recap(run)["changed"] == 0
    assert _get(kube_control_plane, namespace, "configmap", "cilium-config").returncode != 0
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("entry", ["cni", "cni_chart"])
def test_an_unknown_cni_is_refused_naming_the_variable(tmp_path, kube_control_plane, chart, entry):
    run = _play(tmp_path, kube_control_plane, chart.parents[1], "0" * 64, entry, confidential_cni="calico")
    assert run.returncode != 0
    assert "confidential_cni is calico; supported: cilium, none" in run.stdout


def test_site_checks_the_chart_before_anything_changes_and_installs_the_cni_before_the_joins():
    plays = yaml.safe_load((REPO / "playbooks" / "site.yml").read_text())

    def position(predicate) -> int:
        return next(index for index, play in enumerate(plays) if predicate(play))

    def includes(entry: str):
        return lambda play: any(
            task.get("ansible.builtin.include_role", {}).get("tasks_from") == entry for task in play.get("tasks", [])
        )

    def imports(name: str):
        return lambda play: play.get("ansible.builtin.import_playbook") == name

    chart = position(includes("cni_chart"))
    nodes = position(lambda play: "confidential.kubernetes.node" in str(play.get("roles")))
    assert chart < nodes < position(imports("init.yml")) < position(imports("cni.yml")) < position(imports("join.yml"))
