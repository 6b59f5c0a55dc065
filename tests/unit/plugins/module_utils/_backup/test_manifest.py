# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The snapshot manifest's codec and names: one document, strictly typed, and names checked whole."""

from __future__ import annotations

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._backup import manifest

GENUINE = manifest.Manifest(
    name="etcd-20261126T090000Z",
    time="20261126T090000Z",
    revision=42,
    member="cp-0",
    cluster_id="ab" * 32,
    size=3211,
    sha256="cd" * 32,
    snapshot_size=3000,
    total_keys=7,
    etcd_hash=12345,
)


def test_the_document_round_trips():
    document = GENUINE.to_document()
    assert document["version"] == 2 and document["format"] == 2 and "authenticated" not in document
    assert manifest.Manifest.from_document(document, "m") == GENUINE


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(revision="42"), "revision must be an integer"),
        (dict(revision=True), "revision must be an integer"),
        (dict(member=7), "member must be a string"),
        (dict(version=3), "not a snapshot manifest of version 1 or 2"),
    ],
)
def test_a_document_of_the_wrong_shape_is_refused(change, message):
    with pytest.raises(manifest.ManifestError, match=message):
        manifest.Manifest.from_document(dict(GENUINE.to_document(), **change), "m")


def test_a_missing_field_is_named():
    document = GENUINE.to_document()
    del document["member"]
    with pytest.raises(manifest.ManifestError, match="m lacks member"):
        manifest.Manifest.from_document(document, "m")


def test_a_version1_document_describes_a_format1_file():
    document = {k: v for k, v in GENUINE.to_document().items() if k not in ("format", "total_keys", "etcd_hash")}
    parsed = manifest.Manifest.from_document(dict(document, version=1), "m")
    assert parsed.format == 1 and not parsed.authenticated and parsed.total_keys == 0


@pytest.mark.parametrize(
    "name", ["etcd-20261126T090000Z\n", "../etcd-20261126T090000Z", "etcd-20261126T090000Z/x", "etcd-20261399T000000Z"]
)
def test_names_are_checked_whole(name):
    with pytest.raises(manifest.ManifestError, match="snapshot name"):
        manifest.check_name(name)


def test_a_name_is_its_time():
    seconds = manifest.check_name("etcd-20261126T090000Z")
    assert manifest.name_for(seconds) == "etcd-20261126T090000Z"
