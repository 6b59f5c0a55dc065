"""The versions table and its one parser: every shipped row well formed and current, the runc and end-of-life rules,
and a new row needing nothing but the table."""

from __future__ import annotations

import copy
import re
import datetime
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ansible_collections.confidential.kubernetes.plugins.module_utils import _versions

REPO = Path(__file__).resolve().parents[4]
TODAY = datetime.date(2026, 11, 26)
TABLE = _versions.load_table()
VERSIONS = _versions.supported(TABLE)
NEWEST = VERSIONS[-1]
# docs.cilium.io, Kubernetes compatibility: the Kubernetes minors each Cilium release e2e-tests. 1.20: the minors
# upstream supported when it branched (Cilium's rule; its page was not reachable when this was written).
CILIUM_TESTED = {"1.18": ("1.30", "1.33"), "1.19": ("1.32", "1.35"), "1.20": ("1.33", "1.36")}
# kubernetes.io/releases: the end of life of each minor.
END_OF_LIFE = {
    "1.31": "2025-11-11",
    "1.32": "2026-02-28",
    "1.33": "2026-06-28",
    "1.34": "2026-10-27",
    "1.35": "2027-02-28",
    "1.36": "2027-06-28",
}


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def test_the_table_is_the_file_beside_its_parser():
    beside = REPO / "plugins" / "module_utils" / "_versions" / "kubernetes_versions.yml"
    assert Path(_versions.TABLE_FILE).resolve() == beside
    assert not (REPO / "roles" / "node" / "vars" / "kubernetes_versions.yml").exists()


@pytest.mark.parametrize("version", VERSIONS)
def test_every_row_is_complete_and_well_formed(version):
    row = TABLE[version]
    assert _versions.row_problems(version, row) == []
    for name in ("kubeadm", "kubelet", "kubectl"):
        assert row["artifacts"][name]["version"] == version
        for arch in _versions.ARCHITECTURES:
            url = f"https://dl.k8s.io/release/v{version}/bin/linux/{arch}/{name}"
            assert row["artifacts"][name][arch]["url"] == url
    for name in _versions.ARTIFACTS:
        entry = row["artifacts"][name]
        assert set(entry) == {"version", *_versions.ARCHITECTURES}
        for arch in _versions.ARCHITECTURES:
            assert f"{arch}" in entry[arch]["url"] and f"{entry['version']}" in entry[arch]["url"]
        assert entry["amd64"]["sha256"] != entry["arm64"]["sha256"]
    cilium = row["artifacts"]["cilium"]
    assert set(cilium) == {"version", "url", "sha256", "images"}
    assert cilium["url"] == f"https://helm.cilium.io/cilium-{cilium['version']}.tgz"
    # The agent and operator by the release notes' digests, Envoy by tag (its digest is locked on first fetch).
    digest = "@sha256:[0-9a-f]{64}"
    agent, operator = (f"quay.io/cilium/{name}:v{cilium['version']}{digest}" for name in ("cilium", "operator-generic"))
    assert re.fullmatch(agent, cilium["images"]["cilium"]), cilium["images"]
    assert re.fullmatch(operator, cilium["images"]["cilium-operator"]), cilium["images"]
    assert re.fullmatch(r"quay.io/cilium/cilium-envoy:v1\.\d+\.\d+-\d+-[0-9a-f]{40}", cilium["images"]["cilium-envoy"])
    for image in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy"):
        assert row["images"][image] == f"registry.k8s.io/{image}:v{version}"
    assert row["images"]["pause"].startswith("registry.k8s.io/pause:3.")
    crictl = row["artifacts"]["crictl"]["version"]
    assert _minor(crictl) == _minor(version), "crictl is the row's minor, as kubespray pairs them"


@pytest.mark.parametrize("version", VERSIONS)
def test_every_row_is_current_and_safe(version):
    row = _versions.parse_row(version, TABLE[version])
    assert row.end_of_life.isoformat() == END_OF_LIFE[row.minor]
    assert _versions.runc_problems(version, row.artifact_version("runc")) == []
    assert _minor(row.artifact_version("containerd")) >= (2, 3), "containerd 2.3 is the one supported branch"
    first, last = CILIUM_TESTED[".".join(row.artifact_version("cilium").split(".")[:2])]
    assert _minor(first) <= _minor(version) <= _minor(last), (
        f"Cilium {row.artifact_version('cilium')}: not on {version}"
    )
    assert set(row.kubespray) == {"kubernetes", "runtime"}


def test_the_minors_are_the_supported_ones_and_1_35_1_36():
    assert {".".join(v.split(".")[:2]) for v in VERSIONS} == set(END_OF_LIFE)
    assert [v for v in VERSIONS if not _versions.parse_row(v, TABLE[v]).is_end_of_life(TODAY)] == ["1.35.8", "1.36.4"]


def test_no_checksum_is_shared_by_two_different_files():
    seen: dict[str, str] = {}
    for version, row in TABLE.items():
        for name in _versions.ARTIFACTS:
            for arch in _versions.ARCHITECTURES:
                item = row["artifacts"][name][arch]
                assert seen.setdefault(item["sha256"], item["url"]) == item["url"], f"{version} {name} {arch}"


@pytest.mark.parametrize(
    "runc, refused",
    [
        ("1.1.15", True),
        ("1.2.6", True),
        ("1.2.7", True),
        ("1.2.8", False),
        ("1.2.9", False),
        ("1.3.0", True),
        ("1.3.2", True),
        ("1.3.3", False),
        ("1.4.0", False),
        ("1.4.3", False),
        ("1.10.0", False),
        ("latest", True),
    ],
)
def test_a_row_naming_a_runc_below_the_fixed_versions_fails(runc, refused):
    row = copy.deepcopy(TABLE[NEWEST])
    row["artifacts"]["runc"]["version"] = runc
    problems = _versions.row_problems(NEWEST, row)
    assert bool(problems) is refused, problems
    if refused:
        assert f"runc {runc}" in problems[0]
        with pytest.raises(_versions.VersionTableError, match=f"{NEWEST}: runc {runc} "):
            _versions.select_row({NEWEST: row}, NEWEST, frozenset([NEWEST]))


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda row: row["artifacts"].pop("runc"), "artefact runc is missing"),
        (lambda row: row["artifacts"]["helm"].pop("arm64"), None),
        (lambda row: row["artifacts"]["kubelet"]["amd64"].update(sha256="ABC"), "kubelet amd64 sha256 is not 64"),
        (lambda row: row["artifacts"]["kubeadm"]["amd64"].update(sha256="0" * 63 + "G"), "kubeadm amd64 sha256"),
        (
            lambda row: row["artifacts"]["crictl"]["arm64"].update(url="http://example.com/crictl.tgz"),
            "crictl arm64 url",
        ),
        (lambda row: row["artifacts"]["containerd"]["amd64"].update(url="ftp://x/y"), "containerd amd64 url"),
        (lambda row: row["images"].update(etcd="registry.k8s.io/etcd"), "image etcd"),
        (lambda row: row["images"].pop("pause"), "image pause"),
        (
            lambda row: row["artifacts"]["kubectl"].update(s390x={"url": "https://a/b", "sha256": "0" * 64}),
            "unknown architecture 's390x'",
        ),
        (lambda row: row["artifacts"].pop("cilium"), "artefact cilium is missing"),
        (lambda row: row["artifacts"]["cilium"].update(sha256="0" * 63), "cilium sha256 is not 64"),
        (lambda row: row["artifacts"]["cilium"].update(url="http://helm.cilium.io/cilium.tgz"), "cilium url"),
        (lambda row: row["artifacts"]["cilium"].pop("version"), "artefact cilium has no version"),
        (
            lambda row: row["artifacts"]["cilium"].update(amd64={"url": "https://a/b", "sha256": "0" * 64}),
            "artefact cilium is the same on every architecture; unknown keys ['amd64']",
        ),
        (lambda row: row["artifacts"]["cilium"].pop("images"), "chart cilium has no 'images' mapping"),
        (lambda row: row["artifacts"]["cilium"]["images"].pop("cilium-envoy"), "chart cilium image cilium-envoy"),
        (
            lambda row: row["artifacts"]["cilium"]["images"].update(cilium="quay.io/cilium/cilium@sha256:" + "0" * 64),
            "chart cilium image cilium is missing or not registry/path:tag",
        ),
        (
            lambda row: row["artifacts"]["cilium"]["images"].update(hubble="quay.io/cilium/hubble-relay:v1"),
            "chart cilium names unknown images ['hubble']",
        ),
        (lambda row: row.pop("end_of_life"), "end_of_life is not a date"),
        (lambda row: row.update(end_of_life="soon"), "end_of_life is not a date"),
        (lambda row: row["kubespray"].update(kubernetes="7576585"), "kubespray is not"),
        (lambda row: row.pop("kubespray"), "kubespray is not"),
        (lambda row: row.update(host_packages=["iptables", "rm -rf /"]), "host_packages is not a list"),
        (lambda row: row.update(packages=[]), "unknown keys ['packages']"),
    ],
)
def test_a_malformed_row_is_named(mutate, expected):
    row = copy.deepcopy(TABLE[NEWEST])
    mutate(row)
    problems = _versions.row_problems(NEWEST, row)
    if expected is None:  # one arch fewer is allowed: a row may serve only the arches it has
        assert problems == []
        with pytest.raises(_versions.VersionTableError, match="no helm for arm64"):
            _versions.row_artifacts(_versions.parse_row(NEWEST, row), ["amd64", "arm64"])
    else:
        assert any(expected in problem for problem in problems), problems


def test_an_unknown_version_is_refused_with_the_supported_list():
    with pytest.raises(_versions.VersionTableError) as error:
        _versions.select_row(TABLE, "1.30.0", frozenset(TABLE))
    assert f"Kubernetes 1.30.0 is not in the versions table; supported: {', '.join(VERSIONS)}" == str(error.value)


def test_an_end_of_life_row_is_refused_unless_allowed():
    oldest = _versions.select_row(TABLE, VERSIONS[0], frozenset(TABLE))
    with pytest.raises(_versions.VersionTableError) as error:
        _versions.refuse_end_of_life(oldest, TODAY, allow=False)
    assert str(error.value) == (
        f"Kubernetes {oldest.minor} is end of life since {END_OF_LIFE[oldest.minor]}; upgrade, "
        "or set kubernetes_allow_end_of_life: true"
    )
    _versions.refuse_end_of_life(oldest, TODAY, allow=True)
    _versions.refuse_end_of_life(oldest, oldest.end_of_life - datetime.timedelta(days=1), allow=False)
    with pytest.raises(_versions.VersionTableError, match="end of life since"):
        _versions.refuse_end_of_life(oldest, oldest.end_of_life, allow=False)
    newest = _versions.select_row(TABLE, NEWEST, frozenset(TABLE))
    _versions.refuse_end_of_life(newest, TODAY, allow=False)


def test_an_extra_row_is_merged_and_may_use_http_and_record_no_end_of_life():
    lab = copy.deepcopy(TABLE[NEWEST])
    del lab["end_of_life"], lab["kubespray"]
    for name in _versions.ARTIFACTS:
        lab["artifacts"][name]["amd64"]["url"] = f"http://10.77.5.1:8080/{name}"
    merged = _versions.merged_table(TABLE, {"1.20.2": lab})
    row = _versions.select_row(merged, "v1.20.2", frozenset(TABLE))
    assert row.artifacts is lab["artifacts"] and row.end_of_life is None and not row.is_end_of_life(TODAY)
    with pytest.raises(_versions.VersionTableError, match="is not an https URL"):
        _versions.select_row(merged, "1.20.2", frozenset(merged))
    assert set(TABLE) == set(VERSIONS)


def test_only_an_extra_row_may_say_explicitly_that_it_provides_no_artefact():
    lab = copy.deepcopy(TABLE[NEWEST])
    lab["artifacts"]["crictl"] = None
    assert _versions.row_problems("1.20.2", lab, shipped=False) == []
    assert [a.name for a in _versions.row_artifacts(_versions.parse_row("1.20.2", lab, False), ["amd64"])] == [
        "kubeadm",
        "kubelet",
        "kubectl",
        "containerd",
        "runc",
        "cni_plugins",
        "helm",
    ]
    assert f"{NEWEST}: artefact crictl is missing" in _versions.row_problems(NEWEST, lab, shipped=True)
    del lab["artifacts"]["crictl"]
    assert "1.20.2: artefact crictl is missing" in _versions.row_problems("1.20.2", lab, shipped=False)


def test_a_chart_is_one_file_for_every_architecture_and_only_fetched_when_named():
    row = _versions.parse_row(NEWEST, TABLE[NEWEST])
    chart = row.artifacts["cilium"]
    assert "cilium" not in [a.name for a in _versions.row_artifacts(row, ["amd64", "arm64"])]
    charts = _versions.row_artifacts(row, ["amd64", "arm64"], ("cilium",))
    assert charts == [
        _versions.Artifact(
            "cilium", chart["version"], None, f"https://helm.cilium.io/cilium-{chart['version']}.tgz", chart["sha256"]
        )
    ]
    assert charts[0].label == f"cilium {chart['version']} (chart)"
    assert charts[0].filename == f"cilium-{chart['version']}.tgz"
    lab = dict(TABLE[NEWEST], artifacts=dict(TABLE[NEWEST]["artifacts"], cilium=None))
    assert _versions.row_problems("1.20.2", lab, shipped=False) == []
    assert _versions.row_artifacts(_versions.parse_row("1.20.2", lab, False), ["amd64"], ("cilium",)) == []


def test_a_rows_images_are_kubeadms_and_its_charts():
    row = _versions.parse_row(NEWEST, TABLE[NEWEST])
    chart_images = TABLE[NEWEST]["artifacts"]["cilium"]["images"]
    assert row.all_images == {**TABLE[NEWEST]["images"], **chart_images}
    assert set(row.all_images) == set(_versions.IMAGES) | set(_versions.CHART_IMAGES["cilium"])
    # An inventory's row may name only some of its chart's images (the lab's stand-in deploys the agent alone), or
    # none, or have no chart at all; a shipped row names them all.
    lab = copy.deepcopy(TABLE[NEWEST])
    lab["artifacts"]["cilium"]["images"] = {"cilium": "cklab.invalid/lab-tools:2"}
    assert _versions.row_problems("1.20.2", lab, shipped=False) == []
    assert _versions.parse_row("1.20.2", lab, False).all_images["cilium"] == "cklab.invalid/lab-tools:2"
    assert "cilium-operator" not in _versions.parse_row("1.20.2", lab, False).all_images
    assert any("image cilium-operator" in p for p in _versions.row_problems(NEWEST, lab, shipped=True))
    del lab["artifacts"]["cilium"]["images"]
    assert _versions.row_problems("1.20.2", lab, shipped=False) == []
    lab["artifacts"]["cilium"] = None
    assert set(_versions.parse_row("1.20.2", lab, False).all_images) == set(_versions.IMAGES)


def test_node_architectures():
    assert _versions.node_arch("x86_64") == "amd64"
    assert _versions.node_arch("aarch64") == "arm64"
    with pytest.raises(_versions.VersionTableError, match="ppc64le"):
        _versions.node_arch("ppc64le")


def _gen_docs(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen-docs-versions.py"), "--root", str(root), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def _docs_copy(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    for relative in (
        "README.md",
        "docs/roles/node.md",
        "docs/playbooks/cni.md",
        "plugins/module_utils/_versions/kubernetes_versions.yml",
    ):
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / relative, root / relative)
    return root


def test_the_docs_lists_are_the_tables():
    run = _gen_docs(REPO, "--check")
    assert run.returncode == 0, run.stderr


def test_a_drifted_docs_list_fails_the_check(tmp_path):
    root = _docs_copy(tmp_path)
    node = root / "docs" / "roles" / "node.md"
    node.write_text(node.read_text().replace(f"| {NEWEST} |", "| 1.36.3 |"))
    run = _gen_docs(root, "--check")
    assert run.returncode == 1 and "docs/roles/node.md" in run.stderr and "README.md" not in run.stderr
    assert _gen_docs(root).returncode == 0
    assert _gen_docs(root, "--check").returncode == 0
    assert node.read_text() == (REPO / "docs" / "roles" / "node.md").read_text()


def test_a_new_row_needs_only_the_table(tmp_path):
    """Add a row to a copy of the table: the parser accepts it, the docs generator lists it everywhere."""
    root = _docs_copy(tmp_path)
    table_file = root / "plugins" / "module_utils" / "_versions" / "kubernetes_versions.yml"
    document = yaml.safe_load(table_file.read_text())
    row = copy.deepcopy(document["kubernetes_versions"][NEWEST])
    new = "1.37.0"
    for name in ("kubeadm", "kubelet", "kubectl"):
        row["artifacts"][name]["version"] = new
        for arch in _versions.ARCHITECTURES:
            row["artifacts"][name][arch] = {
                "url": f"https://dl.k8s.io/release/v{new}/bin/linux/{arch}/{name}",
                "sha256": f"{len(name)}{arch[0]}".ljust(64, "7"),
            }
    row["end_of_life"] = datetime.date(2027, 10, 28)
    document["kubernetes_versions"][new] = row
    table_file.write_text(yaml.safe_dump(document))
    table = _versions.load_table(str(table_file))
    parsed = _versions.select_row(table, new, frozenset(table))
    assert parsed.version == new and _versions.supported(table)[-1] == new
    _versions.refuse_end_of_life(parsed, TODAY, allow=False)
    assert _gen_docs(root, "--check").returncode == 1
    assert _gen_docs(root).returncode == 0
    assert f"{NEWEST}, {new}**" in (root / "README.md").read_text()
    assert f"| {new} | 2027-10-28 |" in (root / "docs" / "roles" / "node.md").read_text()
    assert f"and {new}" in (root / "docs" / "playbooks" / "cni.md").read_text()
