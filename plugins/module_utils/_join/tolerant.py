# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The join service's request decoding: a body that is not the RPC's protobuf message reaches the servicer as an
``Undecodable``, which refuses it as malformed (counted against its caller's rate), instead of grpc's unlogged UNKNOWN."""

from __future__ import annotations

try:
    from google.protobuf.message import DecodeError
except ImportError:  # reported by the service (service.GRPC_IMPORT_ERROR)
    pass


class Undecodable:
    """A request body that is not the RPC's protobuf message; the servicer refuses it as malformed."""

    def __init__(self, message_type: str, error: str):
        self.message_type = message_type
        self.error = error

    def __str__(self) -> str:
        return f"the request is not a valid {self.message_type} message ({self.error})"


def _tolerant(deserializer):
    def deserialize(raw: bytes):
        try:
            return deserializer(raw)
        except DecodeError as exc:
            return Undecodable(getattr(deserializer, "__self__", object).__name__, str(exc))

    return deserialize
