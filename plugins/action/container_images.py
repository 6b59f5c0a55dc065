# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Runs on the controller: fetch the container images of a Kubernetes version's row as OCI archives, verified
against the digests the row pins or the lock file records, into the cache."""

from __future__ import annotations

import os

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.confidential.kubernetes.plugins.module_utils import _images
from ansible_collections.confidential.kubernetes.plugins.module_utils import _versions
from ansible_collections.confidential.kubernetes.plugins.plugin_utils import _artifacts
from ansible_collections.confidential.kubernetes.plugins.plugin_utils import _image_cache

display = Display()

ARGUMENT_SPEC = dict(
    _artifacts.FETCH_ARGUMENT_SPEC,
    images=dict(type="list", elements="str", default=list(_versions.IMAGES)),
    images_extra=dict(type="dict", default={}),
    lock_file=dict(type="path", default=""),
)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        validation, dummy = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        params = validation.validated_parameters
        result["changed"] = False
        if params["mirror_url"] and params["source_dir"]:
            result.update(failed=True, msg=_artifacts.SOURCES_CONFLICT)
            return result
        unknown = [name for name in params["images"] if name not in _versions.IMAGE_NAMES]
        if unknown:
            result.update(
                failed=True, msg=f"unknown images {', '.join(unknown)}; a row has {', '.join(_versions.IMAGE_NAMES)}"
            )
            return result
        clashing = [name for name in params["images_extra"] if name in _versions.IMAGE_NAMES]
        if clashing:
            result.update(failed=True, msg=f"images_extra names {', '.join(clashing)}, which are the row's images")
            return result
        try:
            row = _artifacts.row_of(params)
            arches = tuple(sorted({_versions.node_arch(machine) for machine in params["architectures"]}))
            pinned = row.all_images
            absent = [name for name in params["images"] if name not in pinned]
            if absent:
                raise _versions.VersionTableError(
                    f"the versions table row of Kubernetes {row.version} pins no image {', '.join(absent)} (its charts "
                    "name the images they deploy under `images`); add them to the row or leave them out of the images "
                    "this node imports"
                )
            images = _images.row_images(pinned, tuple(n for n in _versions.IMAGE_NAMES if n in params["images"]))
            images += [_images.parse_image(name, value) for name, value in sorted(params["images_extra"].items())]
        except (_versions.VersionTableError, ValueError) as exc:
            result.update(failed=True, msg=str(exc))
            return result
        cache_dir = os.path.abspath(os.path.expanduser(params["cache_dir"]))
        lock_file = os.path.abspath(
            os.path.expanduser(params["lock_file"] or os.path.join(cache_dir, _image_cache.LOCK_FILE))
        )
        host = task_vars.get("inventory_hostname", "controller")
        try:
            if self._task.check_mode:
                cached, fetched = _image_cache.cached_images(images, cache_dir, lock_file)
                locked: list[str] = []
                result["msg"] = "check mode: nothing fetched"
            else:
                cached, fetched, locked = _image_cache.fetch_images(
                    images,
                    cache_dir,
                    lock_file,
                    arches,
                    mirror_url=params["mirror_url"] or None,
                    source_dir=params["source_dir"] or None,
                    timeout=params["timeout"],
                    progress=lambda line: display.display(f"[{host}] container_images: {line}"),
                )
        except _image_cache.ImageCacheError as exc:
            result.update(failed=True, msg=str(exc))
            return result
        result.update(
            changed=bool(fetched),
            fetched=fetched,
            locked=locked,
            cache_dir=cache_dir,
            lock_file=lock_file,
            images=[
                dict(
                    name=entry.image.name,
                    reference=entry.image.reference,
                    digest=entry.digest,
                    path=entry.path,
                    filename=os.path.basename(entry.path),
                )
                for entry in cached
            ],
        )
        return result
