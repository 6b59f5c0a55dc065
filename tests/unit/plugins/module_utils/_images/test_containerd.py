"""The node side of the images (module_utils._images.containerd): its input checks; the imports themselves run against
a real containerd in tests/unit/roles/test_node_images.py."""

from __future__ import annotations

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._images.containerd import (
    ContainerdImageError,
    wanted_images,
)

ENTRY = {
    "name": "pause",
    "reference": "registry.k8s.io/pause:3.10",
    "digest": "sha256:" + "a" * 64,
    "archive": "/var/cache/pause.oci.tar",
}


def test_aliases_are_optional_and_kept_in_order():
    assert wanted_images([ENTRY])[0].aliases == ()
    aliases = ["registry.example.com/k8s/pause:3.10", "mirror.example.com/pause:3.10"]
    assert wanted_images([{**ENTRY, "aliases": aliases}])[0].aliases == tuple(aliases)


@pytest.mark.parametrize("aliases", ["registry.example.com/k8s/pause:3.10", ["no-tag"], [3]])
def test_aliases_that_are_not_a_list_of_references_are_refused_naming_the_image(aliases):
    with pytest.raises(ContainerdImageError, match=r"^pause: aliases .* is not a list of registry/path:tag"):
        wanted_images([{**ENTRY, "aliases": aliases}])
