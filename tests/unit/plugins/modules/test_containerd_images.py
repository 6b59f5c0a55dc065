"""containerd_images against a real containerd (Debian's package): a private instance per test, importing a tiny OCI
image the test builds itself."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._images.containerd import (
    STAGING_REPOSITORY,
    ContainerdImageError,
    ContainerdImages,
    wanted_images,
)
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


def _runner(sabotage):
    """ctr for real, except the calls ``sabotage(argv)`` answers itself (it returns None to let a call through)."""

    def run(argv):
        answer = sabotage(argv)
        if answer is not None:
            return answer
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
        return done.returncode, done.stdout, done.stderr

    return run


def _staging_names(address: str) -> list[str]:
    return [name for name in _listed(address) if name.startswith(STAGING_REPOSITORY)]


def test_a_failed_move_of_the_names_leaves_the_previous_image_in_place(containerd, tmp_path):
    stale, stale_digest, dummy = _archive(tmp_path, b"the image the node had\n")
    run_main(containerd_images.main, _args(containerd, stale, stale_digest))
    archive, digest, dummy = _archive(tmp_path, b"the pinned one\n")
    failing_tag = _runner(lambda argv: (1, "", "tag refused") if "tag" in argv else None)
    images = ContainerdImages("ctr", containerd, failing_tag)
    wanted = wanted_images([dict(name="pause", reference=REFERENCE, digest=digest, archive=str(archive))])
    with pytest.raises(ContainerdImageError, match="tag refused"):
        images.import_missing(images.missing(wanted), "amd64")
    assert _listed(containerd)[REFERENCE] == stale_digest and _staging_names(containerd) == []
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".canonical-")] == []


def test_names_that_end_up_at_another_image_are_removed(containerd, tmp_path):
    members, other_digest = build_layout("registry.k8s.io/other:1", b"another image\n")
    other = tmp_path / "other.oci.tar"
    write_archive(other, members)
    entry = dict(name="other", reference="registry.k8s.io/other:1", digest=other_digest, archive=str(other))
    assert not run_main(containerd_images.main, _args(containerd, other, other_digest) | {"images": [entry]})["failed"]
    archive, digest, dummy = _archive(tmp_path, b"the pinned one\n")

    def race(argv):
        # Someone re-points the reference right after the names moved.
        if "tag" in argv and "registry.k8s.io/other:1" not in argv:
            real = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
            subprocess.run([*argv[:5], "images", "tag", "--force", "registry.k8s.io/other:1", REFERENCE], check=True)
            return real.returncode, real.stdout, real.stderr
        return None

    images = ContainerdImages("ctr", containerd, _runner(race))
    wanted = wanted_images([dict(name="pause", reference=REFERENCE, digest=digest, archive=str(archive))])
    with pytest.raises(ContainerdImageError) as error:
        images.import_missing(wanted, "amd64")
    assert f"{other_digest} for {REFERENCE}" in str(error.value) and "those names were removed" in str(error.value)
    listed = _listed(containerd)
    assert REFERENCE not in listed and listed[REFERENCE.rsplit(":", 1)[0] + "@" + digest] == digest
    assert _staging_names(containerd) == []


def test_the_image_is_also_named_by_digest(containerd, tmp_path):
    archive, digest, dummy = _archive(tmp_path)
    alias = "registry.example.com/k8s/pause:3.10.2"
    result = run_main(
        containerd_images.main,
        _args(containerd, archive, digest)
        | {"images": [dict(name="pause", reference=REFERENCE, digest=digest, archive=str(archive), aliases=[alias])]},
    )
    assert not result["failed"], result
    by_digest = {"registry.k8s.io/pause@" + digest, "registry.example.com/k8s/pause@" + digest}
    assert set(_listed(containerd)) == {REFERENCE, alias, *by_digest}
    assert set(_listed(containerd).values()) == {digest}


def test_an_import_containerd_reads_as_another_image_moves_no_name(containerd, tmp_path):
    """containerd reading the canonical archive as another image (here: handed another archive under the staging
    name) is refused before any name moves: the reference keeps the image it had."""
    stale, stale_digest, dummy = _archive(tmp_path, b"the image the node had\n")
    run_main(containerd_images.main, _args(containerd, stale, stale_digest))
    archive, digest, dummy = _archive(tmp_path, b"the pinned one\n")
    staging = f"{STAGING_REPOSITORY}:{digest.split(':')[1]}"
    members, evil_digest = build_layout(staging, b"what containerd read instead\n")
    write_archive(tmp_path / "evil.oci.tar", members)

    def misread(argv):
        if "import" in argv:
            return _runner(lambda dummy: None)([*argv[:-1], str(tmp_path / "evil.oci.tar")])
        return None

    images = ContainerdImages("ctr", containerd, _runner(misread))
    wanted = wanted_images([dict(name="pause", reference=REFERENCE, digest=digest, archive=str(archive))])
    with pytest.raises(ContainerdImageError) as error:
        images.import_missing(wanted, "amd64")
    assert f"containerd imported {evil_digest} from the verified archive" in str(error.value)
    assert f"{REFERENCE} was left as it was" in str(error.value)
    assert _listed(containerd)[REFERENCE] == stale_digest and _staging_names(containerd) == []
