# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Disk bindings in the cluster's API: the arbiter every control plane's join service asks before it binds a disk.

One ConfigMap per disk, ``kube-system/confidential-kubernetes-disk-<uuid>`` (label ``confidential.kubernetes/disk-binding``),
data ``disk_uuid``, ``ek``, ``node_name``, ``enrolment_id``, ``bound_at``. A create succeeds for one caller only
(409 AlreadyExists for every other), so two services that bind the same disk at the same moment cannot both win. A disk held by another EK stays
its own whatever the enrolment says: only an operator releases it (``remove_node.yml`` deletes the node's bindings).
An EK's first disk is claimed first in a second object, ``kube-system/confidential-kubernetes-ek-<EK identity>`` (label
``confidential.kubernetes/ek-binding``), also created only if absent, so one TPM that starts several first joins at
once (with other disk UUIDs, through one or several services) binds one disk. Either object made under an older
enrolment of the same EK (the node was reset and enrolled afresh) is replaced with an update whose resourceVersion
makes that a compare-and-swap (409 Conflict when it changed). Every service watches the bindings (``follow``) to keep
its mirror current. Nothing in them is secret: the disk key is derived from the UUID and
the master secret.
"""

from __future__ import annotations

from typing import Callable

from .kubeapi import NAMESPACE, ApiStatusError, ApiUnavailable, ClusterApi
from .registry import Binding, RegistryError, binding_of

LABEL = "confidential.kubernetes/disk-binding"
NAME_PREFIX = "confidential-kubernetes-disk-"
EK_LABEL = "confidential.kubernetes/ek-binding"
EK_NAME_PREFIX = "confidential-kubernetes-ek-"


class BindingConflict(RuntimeError):
    """The API could not settle a binding now (a concurrent change, or the API is unreachable); the node retries."""


def object_name(disk_uuid: str) -> str:
    return NAME_PREFIX + disk_uuid


def ek_object_name(ek: str) -> str:
    return EK_NAME_PREFIX + ek


def manifest(binding: Binding, resource_version: str | None = None, name: str = "", label: str = LABEL) -> dict:
    metadata = {"name": name or object_name(binding.disk_uuid), "namespace": NAMESPACE, "labels": {label: "v1"}}
    if resource_version:
        metadata["resourceVersion"] = resource_version
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": binding.to_document()}


def disk_binding_of(configmap: dict) -> Binding | None:
    """The disk binding a ConfigMap holds; None for an EK object or an unreadable one (only a valid binding grants a
    disk)."""
    name = str((configmap.get("metadata") or {}).get("name", ""))
    if not name.startswith(NAME_PREFIX):
        return None
    try:
        return binding_of(configmap.get("data"), f"ConfigMap {name}")
    except RegistryError:
        return None


class ApiDiskBindings:
    """Claims and watches disk bindings through the service's one API client."""

    def __init__(self, api: ClusterApi):
        self.api = api
        self._watched = None

    async def claim(self, binding: Binding) -> Binding:
        """What holds after the claim: ``binding`` itself; the binding of the EK that holds the disk; or this EK's
        binding of another disk (its first join claimed that one)."""
        first = await self._create_or_get(binding, ek_object_name(binding.ek), EK_LABEL)
        if first.disk_uuid != binding.disk_uuid:
            return first
        existing = await self._create_or_get(binding, object_name(binding.disk_uuid), LABEL)
        if existing.ek != binding.ek:
            # Another TPM's disk, however the enrolment reads: only an operator releases it (remove_node.yml).
            return existing
        return binding

    async def _create_or_get(self, binding: Binding, name: str, label: str) -> Binding:
        """Create the object ``name`` for ``binding`` if absent; an object of this EK made under an older enrolment is
        replaced (compare-and-swap); otherwise the binding it holds."""
        try:
            await self.api.create("configmaps", manifest(binding, name=name, label=label))
            return binding
        except ApiUnavailable as exc:
            raise BindingConflict(f"claiming disk {binding.disk_uuid} in the cluster's API failed ({exc})") from None
        except ApiStatusError as exc:
            if exc.status != 409:
                raise BindingConflict(
                    f"claiming disk {binding.disk_uuid} in the cluster's API failed ({exc})"
                ) from None
        existing, version = await self._get(name, binding.disk_uuid)
        if existing.ek != binding.ek or existing.enrolment_id == binding.enrolment_id:
            return existing
        try:
            await self.api.replace("configmaps", name, manifest(binding, version, name, label))
        except (ApiStatusError, ApiUnavailable) as exc:
            raise BindingConflict(
                f"the binding of disk {binding.disk_uuid} changed while it was claimed ({exc})"
            ) from None
        return binding

    async def _get(self, name: str, disk_uuid: str) -> tuple[Binding, str]:
        try:
            document = await self.api.read("configmaps", name)
            return binding_of(document.get("data"), f"ConfigMap {name}"), document["metadata"]["resourceVersion"]
        except (ApiStatusError, ApiUnavailable) as exc:
            raise BindingConflict(f"reading the binding of disk {disk_uuid} failed ({exc})") from None
        except (KeyError, TypeError, AttributeError, RegistryError) as exc:
            raise BindingConflict(f"the binding {name} in the cluster's API is unreadable: {exc}") from None

    def follow(self, on_change: Callable[[], None], on_failure: Callable[[str], None]) -> None:
        """Start watching the bindings; ``on_change`` is called (from the watch's thread) after each sync and change."""
        self._watched = self.api.watch("configmaps", disk_binding_of, on_change, on_failure, label_selector=LABEL)

    def watched(self) -> list[Binding]:
        """Every valid binding in the cluster's API, as far as the watch has seen."""
        return list(self._watched.snapshot().values()) if self._watched is not None else []
