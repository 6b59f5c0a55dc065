"""Attack tools without a TPM: evidence signed by a software key that claims TPM attributes, and a relay that makes
loopback connections come from another source address.

``SoftwareQuoter`` takes one genuine evidence document as a template (its PCRs, its EK and EK certificate, its AK's
attributes) and quotes any nonce and user data with a software P-256 key in place of the AK: the AK public area says
restricted, sign, fixedTPM, and the quote is correctly signed. Step 1 of a join cannot tell it from a TPM's; only the
credential activation of step 2 can.
"""

from __future__ import annotations

import asyncio
import base64
import struct
import threading

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import tpm2
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.evidence import qualifying_data

TPM_ALG_ECDSA = 0x0018
TPM_ALG_SHA256 = 0x000B


def _tpm2b(value: bytes) -> bytes:
    return struct.pack(">H", len(value)) + value


class SoftwareQuoter:
    def __init__(self, genuine: dict):
        self.template = dict(genuine)
        self.key = ec.generate_private_key(ec.SECP256R1())
        numbers = self.key.public_key().public_numbers()
        ak_public = base64.b64decode(genuine["ak_public"])
        # TPMT_PUBLIC of an ECC P-256 key ends with its point: TPM2B x, TPM2B y (32 bytes each).
        assert ak_public[-68:-66] == b"\x00\x20" and ak_public[-34:-32] == b"\x00\x20", (
            "the template's AK is not ECC P-256"
        )
        self.ak_public = ak_public[:-68] + _tpm2b(numbers.x.to_bytes(32, "big")) + _tpm2b(numbers.y.to_bytes(32, "big"))
        self.ak_name = tpm2.parse_public(self.ak_public).name
        self.quote_template = base64.b64decode(genuine["quote"])

    def quote(self, nonce: bytes, user_data: bytes) -> dict:
        head = self.quote_template[:6]
        signer_size = struct.unpack_from(">H", self.quote_template, 6)[0]
        position = 8 + signer_size
        extra_size = struct.unpack_from(">H", self.quote_template, position)[0]
        rest = self.quote_template[position + 2 + extra_size :]
        attest = head + _tpm2b(self.ak_name) + _tpm2b(qualifying_data(nonce, user_data)) + rest
        r, s = decode_dss_signature(self.key.sign(attest, ec.ECDSA(hashes.SHA256())))
        signature = (
            struct.pack(">HH", TPM_ALG_ECDSA, TPM_ALG_SHA256)
            + _tpm2b(r.to_bytes(32, "big"))
            + _tpm2b(s.to_bytes(32, "big"))
        )
        document = dict(self.template)
        document.update(
            ak_public=base64.b64encode(self.ak_public).decode(),
            quote=base64.b64encode(attest).decode(),
            signature=base64.b64encode(signature).decode(),
            user_data=base64.b64encode(user_data).decode(),
        )
        return document


class SourceRelay:
    """Listens on 127.0.0.1 and forwards each connection to ``target`` from ``source`` (another loopback address, or ::1)."""

    def __init__(self, source: str, target: tuple[str, int]):
        self.source, self.target = source, target
        self._loop = asyncio.new_event_loop()
        self._server = self._loop.run_until_complete(asyncio.start_server(self._relay, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()

    async def _relay(self, reader, writer) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.target, local_addr=(self.source, 0))
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pump(reader, upstream_writer), _pump(upstream_reader, writer))

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)


async def _pump(source, sink) -> None:
    try:
        while True:
            chunk = await source.read(65536)
            if not chunk:
                break
            sink.write(chunk)
            await sink.drain()
    except OSError:
        pass
    finally:
        sink.close()
