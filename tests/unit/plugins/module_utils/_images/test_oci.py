"""OCI archive verification: a good archive, and one mutation per check, each refused naming what is wrong."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._images import oci
from tests.unit.plugins.module_utils._images.oci_layout import build_layout, crafted, write_archive, write_entries

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


EVIL = b"the image the attacker wants run\n"


def _entries(members) -> list:
    return [(name, content, tarfile.REGTYPE) for name, content in members.items()]


def _verify_entries(tmp_path, entries, expected=None, reference=None):
    path = tmp_path / "crafted.oci.tar"
    write_entries(path, entries)
    return oci.verify_archive(str(path), "etcd", expected, ("amd64",), reference)


@pytest.mark.parametrize(
    ("genuine_index_as", "kind", "reason"),
    [
        ("/index.json", tarfile.REGTYPE, "'/index.json' has an absolute name"),
        ("../index.json", tarfile.REGTYPE, "'../index.json' escapes the archive's root"),
        ("index.json", tarfile.CONTTYPE, "'index.json' is a contiguous file (CONTTYPE)"),
    ],
)
def test_the_findings_archives_are_refused_naming_the_member(tmp_path, genuine_index_as, kind, reason):
    """The genuine index.json hidden where containerd does not read it, behind an evil one it does."""
    genuine, digest = build_layout(REFERENCE)
    evil, dummy = build_layout(REFERENCE, EVIL)
    with pytest.raises(oci.ImageArchiveError) as error:
        _verify_entries(tmp_path, crafted(genuine, evil, genuine_index_as, kind), digest)
    assert str(error.value).startswith("etcd: the image archive member ") and reason in str(error.value)


@pytest.mark.parametrize(
    ("case", "edit", "reason"),
    [
        (
            "duplicate",
            lambda e: e + [("index.json", e[1][1], tarfile.REGTYPE)],
            "is a second member named 'index.json'",
        ),
        ("duplicate after cleaning", lambda e: e + [("./index.json", e[1][1], tarfile.REGTYPE)], "second member"),
        ("dot segment", lambda e: [("blobs/./sha256/" + e[2][0][13:], e[2][1], tarfile.REGTYPE)], "non-canonical"),
        ("double slash", lambda e: [("blobs//sha256/" + e[2][0][13:], e[2][1], tarfile.REGTYPE)], "non-canonical"),
        ("dot-dot inside", lambda e: [("blobs/../index.json", b"{}", tarfile.REGTYPE)], "non-canonical"),
        ("escaping", lambda e: [("blobs/../../x", b"", tarfile.REGTYPE)], "escapes the archive's root"),
        ("Docker manifest.json", lambda e: e + [("manifest.json", b"[]", tarfile.REGTYPE)], "Docker archive"),
        ("Docker repositories", lambda e: e + [("./repositories", b"{}", tarfile.REGTYPE)], "Docker archive"),
        ("hard link", lambda e: e + [("blobs/sha256/" + "c" * 64, b"", tarfile.LNKTYPE)], "hard link"),
        ("character device", lambda e: e + [("dev", b"", tarfile.CHRTYPE)], "a device or FIFO"),
        ("FIFO", lambda e: e + [("fifo", b"", tarfile.FIFOTYPE)], "a device or FIFO"),
        ("unexpected directory", lambda e: e + [("etc", b"", tarfile.DIRTYPE)], "unexpected directory 'etc'"),
        ("unexpected file", lambda e: e + [("blobs/sha512/" + "d" * 64, b"", tarfile.REGTYPE)], "unexpected member"),
    ],
)
def test_members_containerd_could_read_otherwise_are_refused(tmp_path, case, edit, reason):
    members, digest = build_layout(REFERENCE)
    entries = _entries(members)
    edited = edit(entries)
    # The edits that return one entry replace the first blob (entries 2..): index.json and oci-layout stay.
    if len(edited) == 1:
        edited = [entries[0], entries[1], *edited, *entries[3:]]
    with pytest.raises(oci.ImageArchiveError) as error:
        _verify_entries(tmp_path, edited, digest)
    assert reason in str(error.value), case


def test_a_sparse_member_is_refused(tmp_path):
    members, digest = build_layout(REFERENCE)
    path = tmp_path / "sparse.oci.tar"
    write_entries(path, _entries(members), tarfile.GNU_FORMAT)
    # GNU tar's old sparse type: the same header, type 'S' (Python and Go read the data differently).
    data = bytearray(path.read_bytes())
    data[156:157] = tarfile.GNUTYPE_SPARSE
    data[148:156] = b"%06o\0 " % (sum(data[0:148]) + 8 * 32 + sum(data[156:512]))
    path.write_bytes(bytes(data))
    with pytest.raises(oci.ImageArchiveError) as error:
        oci.verify_archive(str(path), "etcd", digest)
    assert "'oci-layout' is a sparse file" in str(error.value)


def test_a_pax_sparse_member_is_refused(tmp_path):
    members, digest = build_layout(REFERENCE)
    path = tmp_path / "sparse.oci.tar"
    with tarfile.open(path, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name, content in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(content), 0
            if name == "index.json":
                info.pax_headers = {"GNU.sparse.size": str(len(content)), "GNU.sparse.map": f"0,{len(content)}"}
            archive.addfile(info, io.BytesIO(content))
    with pytest.raises(oci.ImageArchiveError) as error:
        oci.verify_archive(str(path), "etcd", digest)
    assert "'index.json' is a sparse file" in str(error.value)


def test_a_tar_of_the_layout_directory_is_read_with_its_dot_prefixes(tmp_path):
    """``tar -C layout .``: ./, ./blobs/, ./index.json ... - containerd cleans them to the same names."""
    members, digest = build_layout(REFERENCE)
    entries = [
        ("./", b"", tarfile.DIRTYPE),
        ("./blobs", b"", tarfile.DIRTYPE),
        ("./blobs/sha256", b"", tarfile.DIRTYPE),
    ]
    entries += [("./" + name, content, tarfile.REGTYPE) for name, content in members.items()]
    assert _verify_entries(tmp_path, entries, digest, REFERENCE).digest == digest


def test_data_after_a_damaged_header_is_refused(tmp_path):
    """Python's reader takes a header with a bad checksum for the end of the archive; Go's reader fails there."""
    members, digest = build_layout(REFERENCE)
    path = tmp_path / "damaged.oci.tar"
    write_entries(path, [*_entries(members), ("index.json", b"{}", tarfile.REGTYPE)], tarfile.USTAR_FORMAT)
    data = bytearray(path.read_bytes())
    last = data.rindex(b"index.json\0")
    data[last + 148 : last + 156] = b"0000000\0"
    path.write_bytes(bytes(data))
    with pytest.raises(oci.ImageArchiveError) as error:
        oci.verify_archive(str(path), "etcd", digest)
    assert "data after its end" in str(error.value)


@pytest.mark.parametrize(
    ("annotations", "accepted"),
    [
        ({}, True),
        ({"io.containerd.image.name": REFERENCE}, True),
        ({"org.opencontainers.image.ref.name": "3.6.14-0"}, True),
        ({"org.opencontainers.image.ref.name": REFERENCE}, True),
        ({"io.containerd.image.name": "registry.k8s.io/kube-proxy:v1.20.2"}, False),
        ({"org.opencontainers.image.ref.name": "v1.20.2"}, False),
        ({"io.containerd.image.name": REFERENCE, "org.opencontainers.image.ref.name": "registry.k8s.io/x:1"}, False),
    ],
)
def test_index_json_may_name_only_the_wanted_reference(tmp_path, annotations, accepted):
    members, digest = build_layout(REFERENCE)
    index = json.loads(members["index.json"])
    index["manifests"][0]["annotations"] = annotations
    members["index.json"] = json.dumps(index).encode()
    if accepted:
        assert _verify_entries(tmp_path, _entries(members), digest, REFERENCE).digest == digest
        return
    with pytest.raises(oci.ImageArchiveError) as error:
        _verify_entries(tmp_path, _entries(members), digest, REFERENCE)
    assert "index.json names its image" in str(error.value) and f"not {REFERENCE}" in str(error.value)


def test_the_canonical_archive_holds_the_verified_blobs_and_an_index_of_its_own(tmp_path):
    members, digest = build_layout(REFERENCE)
    path, canonical = tmp_path / "source.oci.tar", tmp_path / "canonical.oci.tar"
    write_entries(path, [("./", b"", tarfile.DIRTYPE), *(("./" + n, c, tarfile.REGTYPE) for n, c in members.items())])
    found = oci.write_canonical_archive(str(path), "etcd", digest, ("amd64",), REFERENCE, str(canonical), "staged:1")
    assert found.digest == digest
    with tarfile.open(canonical) as archive:
        names = archive.getnames()
        index = json.loads(archive.extractfile("index.json").read())
    assert names == [n for n in members if n.startswith("blobs/")] + ["oci-layout", "index.json"]
    assert index["manifests"] == [
        {
            "mediaType": oci.MANIFEST_TYPES[0],
            "digest": digest,
            "size": len(members[_blob(members, b'"schemaVersion"')]),
            "annotations": {"io.containerd.image.name": "staged:1"},
        }
    ]
    assert oci.verify_archive(str(canonical), "etcd", digest, ("amd64",), "staged:1") == found


@pytest.mark.parametrize(
    ("name", "cleaned"),
    [
        ("index.json", "index.json"),
        ("./index.json", "index.json"),
        ("/index.json", "/index.json"),
        ("../index.json", "../index.json"),
        ("a/../../b", "../b"),
        ("/../a", "/a"),
        ("a//b/./c/", "a/b/c"),
        ("", "."),
        ("./", "."),
    ],
)
def test_member_names_are_cleaned_like_gos_path_clean(name, cleaned):
    assert oci.clean_name(name) == cleaned
