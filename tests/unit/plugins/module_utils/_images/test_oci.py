"""OCI archive verification: a good archive, and one mutation per check, each refused naming what is wrong."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._images import oci
from tests.unit.plugins.module_utils._images.oci_layout import build_layout, write_archive

REFERENCE = "registry.k8s.io/etcd:3.6.14-0"


def _verify(tmp_path, members, expected=None, architectures=("amd64",)):
    path = tmp_path / "image.oci.tar"
    write_archive(path, members)
    return oci.verify_archive(str(path), "etcd", expected, architectures)


def _blob(members, marker: bytes) -> str:
    return next(name for name, blob in members.items() if name.startswith("blobs/") and marker in blob)


def test_a_good_archive_names_its_digest_and_platform(tmp_path):
    members, digest = build_layout(REFERENCE)
    assert _verify(tmp_path, members, digest) == oci.ArchiveImage(digest, oci.MANIFEST_TYPES[0], ("amd64",))


@pytest.mark.parametrize(
    ("case", "mutate", "expected"),
    [
        ("missing layer", lambda m: m.pop(_blob(m, b"hello.txt")), "layer sha256:"),
        ("missing config", lambda m: m.pop(_blob(m, b'"architecture"')), "the image config"),
        ("missing manifest", lambda m: m.pop(_blob(m, b'"schemaVersion"')), "the image's manifest"),
        ("no oci-layout", lambda m: m.pop("oci-layout"), "oci-layout"),
        ("two images", lambda m: m.update({"index.json": _twice(m["index.json"])}), "exactly one image"),
        ("stray member", lambda m: m.update({"etc/passwd": b"root::0:0"}), "unexpected member etc/passwd"),
    ],
)
def test_an_incomplete_archive_is_refused(tmp_path, case, mutate, expected):
    members, dummy = build_layout(REFERENCE)
    mutate(members)
    with pytest.raises(oci.ImageArchiveError) as error:
        _verify(tmp_path, members)
    assert expected in str(error.value) and str(error.value).startswith("etcd: ")


def _twice(index: bytes) -> bytes:
    document = json.loads(index)
    document["manifests"] *= 2
    return json.dumps(document).encode()


def test_another_digest_than_the_pinned_one_is_refused_naming_both(tmp_path):
    members, digest = build_layout(REFERENCE)
    with pytest.raises(oci.ImageArchiveError) as error:
        _verify(tmp_path, members, "sha256:" + "a" * 64)
    assert digest in str(error.value) and "a" * 64 in str(error.value)


def test_a_symlink_member_is_refused(tmp_path):
    members, dummy = build_layout(REFERENCE)
    path = tmp_path / "image.oci.tar"
    write_archive(path, members)
    with tarfile.open(path, "a") as archive:
        link = tarfile.TarInfo("blobs/sha256/" + "b" * 64)
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/shadow"
        archive.addfile(link, io.BytesIO())
    with pytest.raises(oci.ImageArchiveError) as error:
        oci.verify_archive(str(path), "etcd")
    assert "not a regular file" in str(error.value)
