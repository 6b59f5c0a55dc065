# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""HKDF-SHA256 derivations, byte-compatible with Constellation's key service."""

from __future__ import annotations

import re

try:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
except ImportError:  # reported by the modules through missing_required_lib()
    pass

KEY_LENGTH = 32
INFO_PREFIX = "key-"
MEASUREMENT_SECRET_INFO = "key-measurementSecret"
CLUSTER_ID_INFO = "key-clusterID"
# The API servers' EncryptionConfiguration key (DESIGN section 2): generation 0 is this info, generation n its "-<n>".
ETCD_SECRETS_INFO = "key-etcdSecrets"

_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


class DerivationError(ValueError):
    """A derivation input is malformed (wrong length, bad UUID)."""


def derive(secret: bytes, salt: bytes, info: str, length: int = KEY_LENGTH) -> bytes:
    if not info.startswith(INFO_PREFIX):
        raise DerivationError(f"derivation info {info!r} must start with {INFO_PREFIX!r}")
    if len(secret) < KEY_LENGTH:
        raise DerivationError(f"secret must be at least {KEY_LENGTH} bytes, got {len(secret)}")
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=salt, info=info.encode()).derive(secret)


def state_disk_key(master_key: bytes, master_salt: bytes, disk_uuid: str) -> bytes:
    """The raw 32-byte LUKS2 passphrase of the disk with this UUID."""
    uuid = disk_uuid.strip().lower()
    if not _UUID.match(uuid):
        raise DerivationError(f"disk UUID {disk_uuid!r} is not a UUID")
    return derive(master_key, master_salt, INFO_PREFIX + uuid)


def measurement_secret(master_key: bytes, master_salt: bytes) -> bytes:
    return derive(master_key, master_salt, MEASUREMENT_SECRET_INFO)


def cluster_id(measurement_secret_value: bytes, measurement_salt: bytes) -> bytes:
    return derive(measurement_secret_value, measurement_salt, CLUSTER_ID_INFO)


def etcd_secrets_key_name(generation: int) -> str:
    """The info string, and the key's name in the EncryptionConfiguration, of one generation of the at-rest key."""
    if isinstance(generation, bool) or not isinstance(generation, int) or generation < 0:
        raise DerivationError(f"the etcd Secrets key generation must be an integer >= 0, got {generation!r}")
    return ETCD_SECRETS_INFO if generation == 0 else f"{ETCD_SECRETS_INFO}-{generation}"


def etcd_secrets_key(master_key: bytes, master_salt: bytes, generation: int = 0) -> bytes:
    """The 32-byte key the API servers encrypt Secrets in etcd with (generation n after n rotations)."""
    return derive(master_key, master_salt, etcd_secrets_key_name(generation))
