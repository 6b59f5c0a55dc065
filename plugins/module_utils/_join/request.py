# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a joining node asks for, bound into its quote, and who the node is (its TPM's endorsement key).

The quote's qualifying data stays ``SHA-256(nonce || SHA-256(user_data))`` (DESIGN section 3); for a join or a
rejoin the node builds ``user_data`` as its ephemeral HPKE public key followed by the request digest:

    request_digest = SHA-256("confidential.kubernetes/join-request/v1\\n" || JSON{"control_plane", "disk_uuid", "flow",
                                                                                  "kubelet_key", "node_name"})

(JSON with sorted keys, no spaces, ASCII; ``kubelet_key`` is the hex SHA-256 of the kubelet CSR's SubjectPublicKeyInfo
DER, empty for a rejoin). A relay or a second process on the node that swaps the name, the role, the disk or the
kubelet key after quoting no longer matches the digest the TPM signed.

A node's identity is the hex SHA-256 of its EK's SubjectPublicKeyInfo DER, the same value whether it is computed
from the EK's TPMT_PUBLIC (what the evidence carries) or from the EK certificate.
"""

from __future__ import annotations

import hashlib
import hmac
import json

try:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
except ImportError:  # reported by the service and the client at start
    pass

from .._attestation import tpm2

REQUEST_LABEL = b"confidential.kubernetes/join-request/v1\n"
DIGEST_BYTES = 32
# Short EK digests name the nodes of an autoscaled pool: 10 hex digits, 40 bits.
SHORT_IDENTITY = 10


class BindingError(ValueError):
    """The evidence's user_data is not an ephemeral key followed by a request digest."""


def public_key_digest(public_key) -> bytes:
    """SHA-256 of a public key's SubjectPublicKeyInfo DER."""
    return hashlib.sha256(
        public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    ).digest()


def csr_key_digest(csr_pem: bytes) -> bytes:
    """The kubelet CSR's key digest as the node computes it; empty for no CSR (a rejoin)."""
    if not csr_pem:
        return b""
    return public_key_digest(x509.load_pem_x509_csr(csr_pem).public_key())


def request_digest(flow: str, node_name: str, control_plane: bool, disk_uuid: str, kubelet_key: bytes) -> bytes:
    """The digest of what a node asks for, exactly as sent (no normalisation: the service hashes the wire fields)."""
    fields = {
        "flow": flow,
        "node_name": node_name,
        "control_plane": bool(control_plane),
        "disk_uuid": disk_uuid,
        "kubelet_key": kubelet_key.hex(),
    }
    return hashlib.sha256(
        REQUEST_LABEL + json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    ).digest()


def bind_user_data(ephemeral_public: bytes, digest: bytes) -> bytes:
    return ephemeral_public + digest


def split_user_data(user_data: bytes) -> tuple[bytes, bytes]:
    """(ephemeral public key, request digest) from a join evidence's user_data."""
    if len(user_data) <= DIGEST_BYTES:
        raise BindingError(
            f"the evidence's user_data has {len(user_data)} bytes: a join binds an ephemeral key followed by the "
            f"{DIGEST_BYTES}-byte request digest"
        )
    return user_data[:-DIGEST_BYTES], user_data[-DIGEST_BYTES:]


def digest_matches(user_data_digest: bytes, expected: bytes) -> bool:
    return hmac.compare_digest(user_data_digest, expected)


def ek_identity(ek_public: bytes) -> str:
    """The node identity of an EK given as TPMT_PUBLIC (raises tpm2.StructureError for one that names no usable key)."""
    return identity_of(tpm2.parse_public(ek_public))


def identity_of(ek: tpm2.Public) -> str:
    """The node identity of a parsed EK."""
    return public_key_digest(ek.public_key()).hex()


def pool_node_name(prefix: str, identity: str) -> str:
    """The name an autoscaled pool node gets: ``<prefix>-<first 10 hex digits of its EK identity>``."""
    return f"{prefix}-{identity[:SHORT_IDENTITY]}"
