"""Image-import attacks (issue 36): archives that pass a digest check while containerd would import another image
under the pinned name, against a private real containerd (Debian's 1.6.20, what scripts/setup.sh installs) and the
node's containerd_images module. Each crafted archive is first shown to fool containerd itself (``ctr images import``
of it, in a namespace of its own, names the evil image); the module then refuses it naming the member, and the pinned
reference is afterwards absent or still at the genuine digest.
"""

from __future__ import annotations

import json
import subprocess
import tarfile

import pytest

from ansible_collections.confidential.kubernetes.plugins.modules import containerd_images
from tests.unit.plugins.module_utils._images.oci_layout import build_layout, crafted, write_archive, write_entries
from tests.unit.plugins.modules.module_runner import module_outcome, run_main  # noqa: F401  # pylint: disable=unused-import

PAUSE = "registry.k8s.io/pause:3.10.2"
KUBE_PROXY = "registry.k8s.io/kube-proxy:v1.20.2"


def _ctr(address: str, namespace: str, *arguments: str) -> str:
    argv = ["ctr", "--address", address, "--namespace", namespace, *arguments]
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout


def _listed(address: str, namespace: str = "k8s.io") -> dict[str, str]:
    return {line.split()[0]: line.split()[2] for line in _ctr(address, namespace, "images", "ls").splitlines()[1:]}


def _import(address: str, reference: str, digest: str, archive) -> dict:
    images = [
        dict(name=reference.rsplit("/", 1)[1].split(":")[0], reference=reference, digest=digest, archive=str(archive))
    ]
    return run_main(containerd_images.main, dict(images=images, architecture="amd64", address=address))


def _images_obtained(address: str, genuine: dict[str, str]) -> int:
    """The names containerd's k8s.io namespace gives another image than the genuine one."""
    listed = _listed(address)
    return sum(1 for reference, digest in genuine.items() if reference in listed and listed[reference] != digest)


@pytest.mark.parametrize(
    ("genuine_index_as", "kind", "reason"),
    [
        ("/index.json", tarfile.REGTYPE, "'/index.json' has an absolute name"),
        ("../index.json", tarfile.REGTYPE, "'../index.json' escapes the archive's root"),
        ("index.json", tarfile.CONTTYPE, "'index.json' is a contiguous file (CONTTYPE)"),
    ],
    ids=["absolute", "parent", "CONTTYPE"],
)
def test_an_evil_index_json_first_and_the_genuine_one_hidden_is_refused(
    containerd, tmp_path, attack, genuine_index_as, kind, reason
):
    genuine, digest = build_layout(PAUSE)
    evil, evil_digest = build_layout(PAUSE, b"the attacker's pause\n")
    archive = tmp_path / "crafted.oci.tar"
    write_entries(archive, crafted(genuine, evil, genuine_index_as, kind))
    # containerd itself reads the evil index.json from this archive: the attack is real.
    _ctr(containerd, "poc", "images", "import", str(archive))
    assert _listed(containerd, "poc")[PAUSE] == evil_digest
    result = _import(containerd, PAUSE, digest, archive)
    attack.obtained("images under the pinned reference", _images_obtained(containerd, {PAUSE: digest}))
    assert result["failed"] and reason in result["msg"] and f"pause ({PAUSE})" in result["msg"], result
    assert "no image was imported" in result["msg"]
    assert PAUSE not in _listed(containerd)


def test_a_genuine_archive_naming_another_images_reference_is_refused(containerd, tmp_path, attack):
    """A genuine pause archive whose index.json (covered by no digest) names kube-proxy's reference."""
    proxy, proxy_digest = build_layout(KUBE_PROXY, b"kube-proxy\n")
    write_archive(tmp_path / "kube-proxy.oci.tar", proxy)
    assert not _import(containerd, KUBE_PROXY, proxy_digest, tmp_path / "kube-proxy.oci.tar")["failed"]
    pause, pause_digest = build_layout(PAUSE, b"pause\n")
    index = json.loads(pause["index.json"])
    index["manifests"][0]["annotations"] = {"io.containerd.image.name": KUBE_PROXY}
    pause["index.json"] = json.dumps(index).encode()
    write_archive(tmp_path / "pause.oci.tar", pause)
    _ctr(containerd, "poc", "images", "import", str(tmp_path / "pause.oci.tar"))
    assert _listed(containerd, "poc")[KUBE_PROXY] == pause_digest
    result = _import(containerd, PAUSE, pause_digest, tmp_path / "pause.oci.tar")
    attack.obtained(
        "images under a pinned reference", _images_obtained(containerd, {PAUSE: pause_digest, KUBE_PROXY: proxy_digest})
    )
    assert result["failed"] and f"names its image '{KUBE_PROXY}' (io.containerd.image.name)" in result["msg"], result
    listed = _listed(containerd)
    assert listed[KUBE_PROXY] == proxy_digest and PAUSE not in listed


def test_an_image_already_imported_keeps_its_genuine_digest_when_a_crafted_archive_follows(
    containerd, tmp_path, attack
):
    """A converged name that went missing (an alias removed) re-imports from a crafted archive: refused, and the
    reference still names the genuine image."""
    genuine, digest = build_layout(PAUSE)
    write_archive(tmp_path / "genuine.oci.tar", genuine)
    assert not _import(containerd, PAUSE, digest, tmp_path / "genuine.oci.tar")["failed"]
    _ctr(containerd, "k8s.io", "images", "rm", PAUSE.rsplit(":", 1)[0] + "@" + digest)
    evil, dummy = build_layout(PAUSE, b"the attacker's pause\n")
    archive = tmp_path / "crafted.oci.tar"
    write_entries(archive, crafted(genuine, evil, "index.json", tarfile.CONTTYPE))
    result = _import(containerd, PAUSE, digest, archive)
    attack.obtained("images under the pinned reference", _images_obtained(containerd, {PAUSE: digest}))
    assert result["failed"] and "CONTTYPE" in result["msg"]
    assert _listed(containerd)[PAUSE] == digest
