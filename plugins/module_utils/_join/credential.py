# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Binding a sealed ticket to credential activation (AK trust level 2 in a single round trip).

The service cannot ask the node to activate a credential and then wait for the
answer inside one RPC, so it wraps the HPKE envelope under a key derived from
the credential's secret: only the TPM holding both the EK and the AK can
activate the credential, so only that node can unwrap and then open the ticket.

    key     = HKDF-SHA256(ikm=credential secret, salt=nonce, info=WRAP_INFO, L=32)
    wrapped = IV (12 random bytes) || AES-256-GCM(key, IV, envelope, AAD=nonce)
"""

from __future__ import annotations

import os

try:
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
except ImportError:  # reported by the service and the client at start
    pass

WRAP_INFO = b"confidential.kubernetes/credential-wrap/v1"
IV_BYTES = 12
TAG_BYTES = 16
KEY_BYTES = 32
NONCE_BYTES = 32


class CredentialWrapError(ValueError):
    """A wrapped ticket does not unwrap: wrong credential secret, wrong nonce, or tampered bytes."""


def wrap_key(credential_secret: bytes, nonce: bytes) -> bytes:
    if not credential_secret:
        raise CredentialWrapError("credential secret is empty")
    if len(nonce) != NONCE_BYTES:
        raise CredentialWrapError(f"nonce must be {NONCE_BYTES} bytes, got {len(nonce)}")
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=nonce, info=WRAP_INFO).derive(credential_secret)


def wrap(envelope: bytes, credential_secret: bytes, nonce: bytes) -> bytes:
    iv = os.urandom(IV_BYTES)
    return iv + AESGCM(wrap_key(credential_secret, nonce)).encrypt(iv, envelope, nonce)


def unwrap(wrapped: bytes, credential_secret: bytes, nonce: bytes) -> bytes:
    if len(wrapped) < IV_BYTES + TAG_BYTES:
        raise CredentialWrapError(f"wrapped ticket has {len(wrapped)} bytes, too short for IV and tag")
    try:
        return AESGCM(wrap_key(credential_secret, nonce)).decrypt(wrapped[:IV_BYTES], wrapped[IV_BYTES:], nonce)
    except InvalidTag:
        raise CredentialWrapError("wrapped ticket does not open with the activated credential and this nonce "
                                  "(the AK is not in the TPM of the EK, or the ticket was altered)") from None
