# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Disk bindings in the cluster's API: the arbiter every control plane's join service asks before it binds a disk.

One ConfigMap per disk, ``kube-system/confidential-kubernetes-disk-<uuid>`` (label ``confidential.kubernetes/disk-binding``),
data ``disk_uuid``, ``ek``, ``node_name``, ``enrolment_id``, ``bound_at``. ``kubectl create`` succeeds for one caller
only, so two services that bind the same disk at the same moment cannot both win; a binding that no longer counts
(its node was enrolled afresh) is replaced with ``kubectl replace``, whose resourceVersion makes that a
compare-and-swap. Nothing in it is secret: the disk key is derived from the UUID and the master secret.
"""

from __future__ import annotations

import json
from typing import Callable

from .kubectl import Kubectl, KubectlError
from .registry import Binding, RegistryError, binding_of

NAMESPACE = "kube-system"
LABEL = "confidential.kubernetes/disk-binding"
NAME_PREFIX = "confidential-kubernetes-disk-"


class BindingConflict(RuntimeError):
    """The API could not settle a binding now (a concurrent change, or the API is unreachable); the node retries."""


def object_name(disk_uuid: str) -> str:
    return NAME_PREFIX + disk_uuid


def manifest(binding: Binding, resource_version: str | None = None) -> bytes:
    metadata = {"name": object_name(binding.disk_uuid), "namespace": NAMESPACE, "labels": {LABEL: "v1"}}
    if resource_version:
        metadata["resourceVersion"] = resource_version
    return json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": binding.to_document()}).encode()


class KubectlDiskBindings(Kubectl):
    """Claims and lists disk bindings through kubectl (manifests on stdin). Tests replace ``_run_command``."""

    async def claim(self, binding: Binding, counts: Callable[[Binding], bool]) -> Binding:
        """The binding of ``binding.disk_uuid`` after the claim: ``binding`` itself, or the one of the EK that holds the disk."""
        try:
            await self.kubectl(["create", "--filename=-"], manifest(binding))
            return binding
        except KubectlError as exc:
            if "AlreadyExists" not in exc.output and "already exists" not in exc.output:
                raise BindingConflict(f"claiming disk {binding.disk_uuid} in the cluster's API failed ({exc})") from None
        existing, version = await self._get(binding.disk_uuid)
        if existing.ek != binding.ek and counts(existing):
            return existing
        if existing.ek == binding.ek and existing.enrolment_id == binding.enrolment_id:
            return existing
        try:
            await self.kubectl(["replace", "--filename=-"], manifest(binding, version))
        except KubectlError as exc:
            raise BindingConflict(f"the binding of disk {binding.disk_uuid} changed while it was claimed ({exc})") from None
        return binding

    async def _get(self, disk_uuid: str) -> tuple[Binding, str]:
        try:
            document = json.loads(await self.kubectl(["get", "configmap", object_name(disk_uuid), f"--namespace={NAMESPACE}", "--output=json"]))
            return binding_of(document.get("data"), f"ConfigMap {object_name(disk_uuid)}"), document["metadata"]["resourceVersion"]
        except KubectlError as exc:
            raise BindingConflict(f"reading the binding of disk {disk_uuid} failed ({exc})") from None
        except (ValueError, KeyError, TypeError, RegistryError) as exc:
            raise BindingConflict(f"the binding of disk {disk_uuid} in the cluster's API is unreadable: {exc}") from None

    async def all_bindings(self) -> list[Binding]:
        """Every binding in the cluster's API (unreadable objects are skipped: only a valid binding grants a disk)."""
        try:
            document = json.loads(await self.kubectl(["get", "configmaps", f"--namespace={NAMESPACE}", f"--selector={LABEL}", "--output=json"]))
        except KubectlError as exc:
            raise BindingConflict(f"listing the disk bindings failed ({exc})") from None
        except ValueError:
            raise BindingConflict("kubectl listed the disk bindings in a form that is not JSON") from None
        bindings = []
        for item in document.get("items", []) if isinstance(document, dict) else []:
            try:
                bindings.append(binding_of(item.get("data"), f"ConfigMap {item.get('metadata', {}).get('name')}"))
            except (RegistryError, AttributeError):
                continue
        return bindings
