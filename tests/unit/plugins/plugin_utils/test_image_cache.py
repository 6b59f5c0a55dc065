"""The controller's image cache and lock file, against a real HTTP mirror on 127.0.0.1 and a local directory, with
tiny real OCI archives the tests build."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from ansible_collections.confidential.kubernetes.plugins.module_utils import _images
from ansible_collections.confidential.kubernetes.plugins.plugin_utils import _image_cache
from tests.unit.plugins.module_utils._images.oci_layout import build_layout, write_archive

REFERENCE = "registry.k8s.io/pause:3.10.2"
PATH = "images/registry.k8s.io/pause/3.10.2.oci.tar"


def _publish(root: Path, content: bytes = b"hello\n", members: dict | None = None) -> str:
    built, digest = build_layout(REFERENCE, content)
    target = root / PATH
    target.parent.mkdir(parents=True, exist_ok=True)
    write_archive(target, members if members is not None else built)
    return digest


def _fetch(tmp_path: Path, pin: str | None = None, architectures=("amd64",), **source):
    image = _images.parse_image("pause", REFERENCE + (f"@{pin}" if pin else ""))
    return _image_cache.fetch_images(
        [image], str(tmp_path / "cache"), str(tmp_path / "cache" / "images.lock.yml"), architectures, **source
    )


def _locked(tmp_path: Path) -> dict:
    return yaml.safe_load((tmp_path / "cache" / "images.lock.yml").read_text())["images"]


def test_a_first_fetch_records_the_digest_and_a_rerun_touches_no_network(server, tmp_path):
    base, root, requests = server
    digest = _publish(root)
    cached, fetched, locked = _fetch(tmp_path, mirror_url=base)
    assert fetched == [f"pause ({REFERENCE})"] and locked == [REFERENCE]
    assert cached[0].digest == digest
    assert cached[0].path == str(tmp_path / "cache" / "images" / digest[7:] / "registry.k8s.io_pause_3.10.2.oci.tar")
    assert _locked(tmp_path) == {REFERENCE: digest}
    assert requests == ["/" + PATH]
    again, fetched, locked = _fetch(tmp_path, mirror_url=base)
    assert (fetched, locked, again) == ([], [], cached)
    assert len(requests) == 1


def test_a_local_directory_is_a_source(tmp_path):
    digest = _publish(tmp_path / "site")
    cached, fetched, dummy = _fetch(tmp_path, source_dir=str(tmp_path / "site"))
    assert fetched and cached[0].digest == digest


def test_a_tampered_blob_from_the_mirror_is_refused_naming_the_image_and_nothing_is_cached_or_locked(server, tmp_path):
    base, root, dummy = server
    members, dummy = build_layout(REFERENCE)
    layer = next(name for name, blob in members.items() if name.startswith("blobs/") and b"hello.txt" in blob)
    members[layer] = members[layer].replace(b"hello\n", b"hellO\n")
    _publish(root, members=members)
    with pytest.raises(_image_cache.ImageCacheError) as error:
        _fetch(tmp_path, mirror_url=base)
    assert f"pause ({REFERENCE})" in str(error.value) and layer.split("/")[-1] in str(error.value)
    assert f"{base}/{PATH}" in str(error.value) and "nothing was installed" in str(error.value)
    assert not (tmp_path / "cache" / "images.lock.yml").exists()
    assert [p for p in (tmp_path / "cache").rglob("*") if p.is_file()] == []


def test_another_image_under_a_locked_tag_is_refused_naming_both_digests(server, tmp_path):
    base, root, dummy = server
    first = _publish(root, b"the image first fetched\n")
    _fetch(tmp_path, mirror_url=base)
    (tmp_path / "cache" / "images").rename(tmp_path / "moved")  # a fresh cache, the same lock
    second = _publish(root, b"a new image pushed under the same tag\n")
    with pytest.raises(_image_cache.ImageCacheError) as error:
        _fetch(tmp_path, mirror_url=base)
    message = str(error.value)
    assert f"pause ({REFERENCE})" in message and first in message and second in message and "locked in" in message
    assert _locked(tmp_path) == {REFERENCE: first}
    assert not (tmp_path / "cache" / "images" / second[7:]).exists()


def test_a_digest_pinned_by_the_table_is_required_and_not_locked(server, tmp_path):
    base, root, dummy = server
    digest = _publish(root)
    with pytest.raises(_image_cache.ImageCacheError) as error:
        _fetch(tmp_path, pin="sha256:" + "0" * 64, mirror_url=base)
    assert "pinned by the versions table" in str(error.value) and digest in str(error.value)
    cached, dummy, locked = _fetch(tmp_path, pin=digest, mirror_url=base)
    assert cached[0].digest == digest and locked == []


def test_a_table_digest_the_lock_contradicts_fails_naming_both(server, tmp_path):
    base, root, dummy = server
    digest = _publish(root)
    _fetch(tmp_path, mirror_url=base)
    with pytest.raises(_image_cache.ImageCacheError) as error:
        _fetch(tmp_path, pin="sha256:" + "1" * 64, mirror_url=base)
    assert digest in str(error.value) and "1" * 64 in str(error.value)


def test_no_source_names_the_sources_that_exist(tmp_path):
    with pytest.raises(_image_cache.ImageCacheError) as error:
        _fetch(tmp_path)
    assert "kubernetes_images_dir" in str(error.value) and "kubernetes_images_mirror_url" in str(error.value)
    assert PATH in str(error.value)


def test_an_altered_cached_archive_is_fetched_again(server, tmp_path):
    base, root, requests = server
    _publish(root)
    cached, dummy, dummy = _fetch(tmp_path, mirror_url=base)
    Path(cached[0].path).write_bytes(b"not an archive any more")
    again, fetched, dummy = _fetch(tmp_path, mirror_url=base)
    assert fetched and len(requests) == 2 and Path(again[0].path).read_bytes() == (root / PATH).read_bytes()


def test_an_archive_without_the_nodes_architecture_is_refused(server, tmp_path):
    base, root, dummy = server
    _publish(root)
    with pytest.raises(_image_cache.ImageCacheError) as error:
        _fetch(tmp_path, architectures=("arm64",), mirror_url=base)
    assert "for amd64, not for arm64" in str(error.value)


def test_a_malformed_lock_file_fails_naming_it(tmp_path):
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "images.lock.yml").write_text(json.dumps({"images": {REFERENCE: "md5:abc"}}))
    with pytest.raises(_image_cache.ImageCacheError) as error:
        _fetch(tmp_path, source_dir=str(tmp_path))
    assert "images.lock.yml" in str(error.value)
