# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The proof of credential activation a node sends in step 2 of a join or rejoin.

Step 1 answers with TPM2_MakeCredential for the evidence's EK and AK name around a 32-byte secret: only the TPM
holding that EK, with that AK loaded, releases the secret. The node proves it did without sending the secret:

    activation_proof = HMAC-SHA256(key=credential secret, PROOF_INFO || nonce)

The nonce of step 1 names the pending request, so a proof answers one challenge only.
"""

from __future__ import annotations

import hashlib
import hmac

from .._attestation.nonces import NONCE_BYTES

PROOF_INFO = b"confidential.kubernetes/activation-proof/v1"


class ProofError(ValueError):
    """An activation proof cannot be computed (empty secret, nonce of the wrong length)."""


def activation_proof(credential_secret: bytes, nonce: bytes) -> bytes:
    if not credential_secret:
        raise ProofError("the activated credential secret is empty")
    if len(nonce) != NONCE_BYTES:
        raise ProofError(f"nonce must be {NONCE_BYTES} bytes, got {len(nonce)}")
    return hmac.new(credential_secret, PROOF_INFO + nonce, hashlib.sha256).digest()


def proof_matches(credential_secret: bytes, nonce: bytes, proof: bytes) -> bool:
    """Constant time: whether ``proof`` is the proof for this secret and nonce."""
    return hmac.compare_digest(activation_proof(credential_secret, nonce), proof)
