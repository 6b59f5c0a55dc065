"""containerd_images against a real containerd (Debian's package): a private instance per test, importing a tiny OCI
image the test builds itself."""

from __future__ import annotations

import subprocess
from pathlib import Path


from ansible_collections.confidential.kubernetes.plugins.modules import containerd_images
from tests.unit.plugins.module_utils._images.oci_layout import build_layout, write_archive
from tests.unit.plugins.modules.module_runner import module_outcome, run_main  # noqa: F401  # pylint: disable=unused-import

REFERENCE = "registry.k8s.io/pause:3.10.2"


def _listed(address: str) -> dict[str, str]:
    output = subprocess.run(
        ["ctr", "--address", address, "--namespace", "k8s.io", "images", "ls"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    return {line.split()[0]: line.split()[2] for line in output.splitlines()[1:]}


def _archive(tmp_path: Path, content: bytes = b"hello\n") -> tuple[Path, str, dict]:
    members, digest = build_layout(REFERENCE, content)
    path = tmp_path / "pause.oci.tar"
    write_archive(path, members)
    return path, digest, members


def _args(address: str, archive: Path, digest: str, **extra) -> dict:
    return dict(
        images=[dict(name="pause", reference=REFERENCE, digest=digest, archive=str(archive))],
        architecture="amd64",
        address=address,
        **extra,
    )


def test_the_pinned_image_imports_under_its_reference_and_a_rerun_changes_nothing(containerd, tmp_path):
    archive, digest, dummy = _archive(tmp_path)
    checked = run_main(containerd_images.main, dict(_args(containerd, archive, digest), _ansible_check_mode=True))
    assert checked["changed"] and checked["imported"] == [REFERENCE]
    assert REFERENCE not in _listed(containerd)
    result = run_main(containerd_images.main, _args(containerd, archive, digest))
    assert not result["failed"], result
    assert result["changed"] and result["imported"] == [REFERENCE]
    assert _listed(containerd)[REFERENCE] == digest
    again = run_main(containerd_images.main, _args(containerd, archive, digest))
    assert (again["changed"], again["imported"], again["failed"]) == (False, [], False)


def test_a_flipped_byte_in_a_blob_is_refused_naming_the_image_and_nothing_is_imported(containerd, tmp_path):
    dummy, digest, members = _archive(tmp_path)
    layer = next(name for name, blob in members.items() if name.startswith("blobs/") and b"hello.txt" in blob)
    tampered = bytearray(members[layer])
    tampered[tampered.index(b"hello\n")] ^= 0x01
    members[layer] = bytes(tampered)
    archive = tmp_path / "tampered.oci.tar"
    write_archive(archive, members)
    result = run_main(containerd_images.main, _args(containerd, archive, digest))
    assert result["failed"]
    assert f"pause ({REFERENCE})" in result["msg"]
    assert layer.split("/")[-1] in result["msg"] and "tampered" in result["msg"]
    assert "no image was imported" in result["msg"]
    assert REFERENCE not in _listed(containerd)


def test_an_archive_of_another_digest_than_the_lock_is_refused_naming_both(containerd, tmp_path):
    dummy, locked, dummy = _archive(tmp_path, b"the image the lock recorded\n")
    archive, other, dummy = _archive(tmp_path, b"another image under the same tag\n")
    result = run_main(containerd_images.main, _args(containerd, archive, locked))
    assert result["failed"]
    assert f"pause ({REFERENCE})" in result["msg"] and locked in result["msg"] and other in result["msg"]
    assert REFERENCE not in _listed(containerd)


def test_an_image_present_under_another_digest_is_replaced_by_the_pinned_one(containerd, tmp_path):
    stale, stale_digest, dummy = _archive(tmp_path, b"pulled from somewhere\n")
    run_main(containerd_images.main, _args(containerd, stale, stale_digest))
    archive, digest, dummy = _archive(tmp_path, b"the pinned one\n")
    result = run_main(containerd_images.main, _args(containerd, archive, digest))
    assert result["changed"] and _listed(containerd)[REFERENCE] == digest


def test_containerd_not_running_is_named(tmp_path):
    archive, digest, dummy = _archive(tmp_path)
    args = _args(str(tmp_path / "none.sock"), archive, digest, ctr_path="/usr/bin/ctr")
    result = run_main(containerd_images.main, args)
    assert result["failed"] and "containerd is not running" in result["msg"] and "none.sock" in result["msg"]
