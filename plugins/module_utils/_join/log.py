# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Structured log lines for journald: one JSON object per line on stderr.

Callers pass only what an operator needs (event, node_name, result, reason,
duration_ms, ...): never a token, key, ticket or CSR.
"""

from __future__ import annotations

import datetime
import json
import sys
import threading


class StructuredLog:
    def __init__(self, stream=None):
        self._stream = stream
        self._lock = threading.Lock()

    def emit(self, level: str, event: str, **fields: object) -> None:
        record = {
            "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds"),
            "level": level,
            "event": event,
        }
        record.update(fields)
        line = json.dumps(record, default=str) + "\n"
        stream = self._stream or sys.stderr
        with self._lock:
            stream.write(line)
            stream.flush()

    def info(self, event: str, **fields: object) -> None:
        self.emit("info", event, **fields)

    def warning(self, event: str, **fields: object) -> None:
        self.emit("warning", event, **fields)

    def error(self, event: str, **fields: object) -> None:
        self.emit("error", event, **fields)
