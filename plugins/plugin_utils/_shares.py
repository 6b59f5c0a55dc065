# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""k-of-n break-glass shares of the cluster's root secrets: Shamir secret sharing over GF(2^128).

The field and the polynomial evaluation are those of pycryptodome's ``Crypto.Protocol.SecretSharing.Shamir`` (without
its ``ssss`` option): field elements are 16-byte big-endian blocks, the reduction polynomial is
x^128 + x^7 + x^2 + x + 1, share ``i`` is the polynomial's value at the element ``i``, the secret its value at 0. The
root secrets document (master key, master salt, measurement salt: 96 bytes) is split as six 16-byte blocks, each with
its own random polynomial of degree k-1, all evaluated at the same points; share ``i`` carries the six values.

Why k-1 shares reveal nothing: for each block, the k-1 random coefficients are uniform and independent, so for any
candidate secret there is exactly one polynomial of degree k-1 through the k-1 given points and that candidate at 0;
every secret is equally likely given k-1 shares (perfect secrecy). Nothing in a share besides its value depends on the
secret except the cluster ID (public: it names the cluster) and the MAC (an HMAC under a key derived from the whole
secret, as hard to invert as the secret itself).

A share is one line (so that it can be typed or pasted into a prompt), in a small text file with comments::

    ck-share-v1.<cluster ID hex>.<k>.<n>.<index>.<value, base64url>.<MAC, base64url>.<checksum hex>

What each check proves, and when:

- the checksum (the first 4 bytes of SHA-256 over the rest of the line, unkeyed) names a share damaged by accident
  (a typo, a truncation, a flipped bit) before anything is combined; anyone can recompute it, so it proves nothing
  against a deliberate change;
- the cluster ID names a share of another cluster (or of a re-split with other parameters) before anything is combined;
- the MAC (HMAC-SHA256 under a key derived from the root secrets, over the whole header and value) can only be checked
  once the secrets are reconstructed, in memory: it proves that the share was made by a holder of this cluster's
  secrets and was not changed since; it cannot name which of exactly k shares was forged (a forged value yields
  different secrets, under which every MAC fails), it cannot tell a share holder who hands over a genuine share of an
  old split of the same secrets from a current one, and it proves nothing about who holds or copied a share.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from dataclasses import dataclass

from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.root_secrets import (
    FIELDS,
    SECRET_BYTES,
    RootSecrets,
)

PREFIX = "ck-share-v1"
BLOCK = 16
SECRET_LENGTH = len(FIELDS) * SECRET_BYTES
MAX_SHARES = 255
MAC_BYTES = 16
CHECKSUM_BYTES = 4
MAC_INFO = b"confidential.kubernetes/share-mac/v1"
_IRREDUCIBLE = (1 << 128) | 0x87


class ShareError(ValueError):
    """A share is malformed, damaged, of another cluster, or the shares given cannot reconstruct the secrets."""


def _multiply(a: int, b: int) -> int:
    product = 0
    while b:
        if b & 1:
            product ^= a
        b >>= 1
        a <<= 1
        if a >> 128:
            a ^= _IRREDUCIBLE
    return product


def _inverse(a: int) -> int:
    # Extended Euclid over GF(2)[x] against the reduction polynomial (as pycryptodome's _Element.inverse).
    r0, r1, s0, s1 = a, _IRREDUCIBLE, 1, 0
    while r1:
        shift = r0.bit_length() - r1.bit_length()
        if shift < 0:
            r0, r1, s0, s1 = r1, r0, s1, s0
            continue
        r0 ^= r1 << shift
        s0 ^= s1 << shift
    return s0


def split_block(secret: bytes, threshold: int, count: int, random=os.urandom) -> list[tuple[int, bytes]]:
    """Shares 1..count of one 16-byte block (pycryptodome's ``Shamir.split`` for the same coefficients)."""
    coefficients = [int.from_bytes(random(BLOCK), "big") for dummy in range(threshold - 1)]
    coefficients.append(int.from_bytes(secret, "big"))
    shares = []
    for index in range(1, count + 1):
        value = 0
        for coefficient in coefficients:
            value = _multiply(index, value) ^ coefficient
        shares.append((index, value.to_bytes(BLOCK, "big")))
    return shares


def combine_block(shares: list[tuple[int, bytes]]) -> bytes:
    """The block at 0 of the polynomial through ``shares`` (Lagrange interpolation, as pycryptodome's ``combine``)."""
    result = 0
    for j, (x_j, y_j) in enumerate(shares):
        numerator, denominator = 1, 1
        for m, (x_m, _y) in enumerate(shares):
            if m != j:
                numerator = _multiply(numerator, x_m)
                denominator = _multiply(denominator, x_j ^ x_m)
        result ^= _multiply(_multiply(int.from_bytes(y_j, "big"), numerator), _inverse(denominator))
    return result.to_bytes(BLOCK, "big")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac_key(secrets: RootSecrets) -> bytes:
    return hmac.new(secrets.master_key + secrets.master_salt + secrets.measurement_salt, MAC_INFO, "sha256").digest()


def _checksum(body: str) -> str:
    return hashlib.sha256(body.encode()).digest()[:CHECKSUM_BYTES].hex()


@dataclass(frozen=True, repr=False)
class Share:
    cluster_id: str
    threshold: int
    count: int
    index: int
    value: bytes
    mac: bytes
    source: str = "share"

    def header(self) -> str:
        return f"{PREFIX}.{self.cluster_id}.{self.threshold}.{self.count}.{self.index}"

    def _mac_input(self) -> bytes:
        return self.header().encode() + b"." + self.value

    def line(self) -> str:
        body = f"{self.header()}.{_b64(self.value)}.{_b64(self.mac)}"
        return f"{body}.{_checksum(body)}"

    def file_text(self) -> str:
        return (
            f"# confidential.kubernetes root secrets share {self.index} of {self.count}"
            f" (any {self.threshold} reconstruct them)\n"
            f"# cluster {self.cluster_id}\n"
            "# Keep it offline and apart from the other shares; recover.yml and restore.yml take it as a file or the\n"
            "# line below, typed at the prompt.\n"
            f"{self.line()}\n"
        )

    @classmethod
    def parse(cls, text: str, source: str) -> Share:
        """One share from a share file's text or its line; the error names ``source`` (never the share's value)."""
        lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
        if len(lines) != 1:
            raise ShareError(f"{source} is not a share: it must hold one line starting with {PREFIX}.")
        parts = lines[0].split(".")
        if len(parts) != 8 or parts[0] != PREFIX:
            raise ShareError(f"{source} is not a share: its line must be {PREFIX}.<cluster ID>.<k>.<n>.<index>...")
        body, checksum = ".".join(parts[:7]), parts[7]
        if not hmac.compare_digest(_checksum(body), checksum.lower()):
            raise ShareError(
                f"{source} is damaged: its checksum does not match (a typo, a truncation or a changed bit)"
            )
        try:
            threshold, count, index = int(parts[2]), int(parts[3]), int(parts[4])
            value, mac = _unb64(parts[5]), _unb64(parts[6])
            bytes.fromhex(parts[1])
        except (ValueError, binascii.Error):
            raise ShareError(f"{source} is malformed: its numbers or encodings do not parse") from None
        if not 2 <= threshold <= count <= MAX_SHARES or not 1 <= index <= count:
            raise ShareError(
                f"{source} is malformed: k={threshold}, n={count}, index {index} is not 2 <= k <= n <= 255"
            )
        if len(value) != SECRET_LENGTH or len(mac) != MAC_BYTES:
            raise ShareError(f"{source} is malformed: its value must be {SECRET_LENGTH} bytes and its MAC {MAC_BYTES}")
        return cls(parts[1].lower(), threshold, count, index, value, mac, source)


def split(secrets: RootSecrets, threshold: int, count: int, random=os.urandom) -> list[Share]:
    """n shares of the root secrets, any ``threshold`` of which reconstruct them."""
    if not 2 <= threshold <= count <= MAX_SHARES:
        raise ShareError(f"k={threshold} of n={count} shares: it must hold that 2 <= k <= n <= {MAX_SHARES}")
    document = b"".join(getattr(secrets, name) for name in FIELDS)
    per_block = [
        split_block(document[at : at + BLOCK], threshold, count, random) for at in range(0, SECRET_LENGTH, BLOCK)
    ]
    cluster_id = secrets.cluster_id().hex()
    key = _mac_key(secrets)
    shares = []
    for index in range(1, count + 1):
        value = b"".join(block[index - 1][1] for block in per_block)
        unsigned = Share(cluster_id, threshold, count, index, value, b"")
        mac = hmac.new(key, unsigned._mac_input(), "sha256").digest()[:MAC_BYTES]
        shares.append(Share(cluster_id, threshold, count, index, value, mac))
    return shares


def combine(shares: list[Share], cluster_id: str | None = None) -> RootSecrets:
    """The root secrets from k or more shares, in memory; every check that can name a share runs before combining.

    ``cluster_id`` (hex), when the caller knows which cluster it expects, names shares of another cluster even when all
    given shares agree with each other.
    """
    if not shares:
        raise ShareError("no shares given")
    reference = shares[0]
    expected = (cluster_id or reference.cluster_id).lower()
    for share in shares:
        if share.cluster_id != expected:
            raise ShareError(
                f"{share.source} is a share of another cluster ({share.cluster_id[:16]}...), not of {expected[:16]}..."
            )
        if (share.threshold, share.count) != (reference.threshold, reference.count):
            raise ShareError(
                f"{share.source} is of a {share.threshold}-of-{share.count} split, {reference.source} of a "
                f"{reference.threshold}-of-{reference.count} one: shares of different splits do not combine"
            )
    seen: dict[int, str] = {}
    for share in shares:
        if share.index in seen:
            raise ShareError(
                f"{share.source} and {seen[share.index]} are both share {share.index}: give distinct shares"
            )
        seen[share.index] = share.source
    if len(shares) < reference.threshold:
        raise ShareError(
            f"{len(shares)} share(s) given, {reference.threshold} of {reference.count} needed: nothing was reconstructed"
        )
    used = shares[: reference.threshold]
    document = b"".join(
        combine_block([(share.index, share.value[at : at + BLOCK]) for share in used])
        for at in range(0, SECRET_LENGTH, BLOCK)
    )
    secrets = RootSecrets(*(document[i * SECRET_BYTES : (i + 1) * SECRET_BYTES] for i in range(len(FIELDS))))
    key = _mac_key(secrets)
    if secrets.cluster_id().hex() != expected or not all(_mac_ok(key, share) for share in used):
        raise ShareError(
            f"the shares {', '.join(share.source for share in used)} do not reconstruct cluster {expected[:16]}...'s "
            "secrets: at least one was altered and given a matching checksum (forged), or belongs to another split; "
            "try another set of shares"
        )
    for share in shares[reference.threshold :]:
        if not _mac_ok(key, share):
            raise ShareError(f"{share.source} fails its MAC under the reconstructed secrets: it was forged or altered")
    return secrets


def _mac_ok(key: bytes, share: Share) -> bool:
    return hmac.compare_digest(hmac.new(key, share._mac_input(), "sha256").digest()[:MAC_BYTES], share.mac)
