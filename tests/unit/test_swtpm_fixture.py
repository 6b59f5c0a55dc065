"""The swtpm fixture itself: it must keep serving however many clients come and go (a bench run opens thousands)."""

from __future__ import annotations

import socket
import struct

# TPM2_GetRandom of 8 bytes: tag TPM_ST_NO_SESSIONS, size 12, command code 0x17b, bytesRequested 8.
GET_RANDOM = struct.pack(">HIIH", 0x8001, 12, 0x17B, 8)
# swtpm logs a line per client disconnect; a stderr pipe nobody read filled up after about 2,048 of them.
CLIENTS = 3000


def test_swtpm_answers_after_thousands_of_client_disconnects(swtpm):
    for client in range(CLIENTS):
        with socket.socket(socket.AF_UNIX) as connection:
            connection.connect(str(swtpm.socket))
            connection.settimeout(10)
            connection.sendall(GET_RANDOM)
            try:
                response = connection.recv(64)
            except TimeoutError:
                raise AssertionError(f"swtpm stopped answering after {client} client disconnects") from None
        tag, size, code = struct.unpack_from(">HII", response)
        assert (tag, size, code) == (0x8001, 10 + 2 + 8, 0), response.hex()
