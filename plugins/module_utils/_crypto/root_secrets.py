# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The cluster's root secrets: master key, master salt, measurement salt (32 bytes each, base64 in JSON).

One format for the controller's secrets file, the init hand-over, control-plane
join tickets and each join service's copy.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from . import derive

FIELDS = ("master_key", "master_salt", "measurement_salt")
SECRET_BYTES = 32


class RootSecretsError(ValueError):
    """A root secrets document is malformed; the message names the field (never its value)."""


@dataclass(frozen=True, repr=False)
class RootSecrets:
    master_key: bytes
    master_salt: bytes
    measurement_salt: bytes

    @classmethod
    def from_document(cls, doc: object, source: str) -> "RootSecrets":
        if not isinstance(doc, dict):
            raise RootSecretsError(f"{source} must be a mapping of {', '.join(FIELDS)}")
        values = {}
        for name in FIELDS:
            try:
                value = base64.b64decode(doc.get(name, ""), validate=True)
            except (binascii.Error, ValueError, TypeError):
                raise RootSecretsError(f"{source}: {name} is not base64") from None
            if len(value) != SECRET_BYTES:
                raise RootSecretsError(f"{source}: {name} must be {SECRET_BYTES} bytes")
            values[name] = value
        return cls(**values)

    def to_document(self) -> dict:
        return {name: base64.b64encode(getattr(self, name)).decode() for name in FIELDS}

    def measurement_secret(self) -> bytes:
        return derive.measurement_secret(self.master_key, self.master_salt)

    def cluster_id(self) -> bytes:
        return derive.cluster_id(self.measurement_secret(), self.measurement_salt)
