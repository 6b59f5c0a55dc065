"""The join service daemon as the load suite runs it: the real ``service.main`` (signals, draining shutdown) with a
token minter that records every token instead of registering it, and the unit tests' API stand-in (in this process)
instead of the cluster's API for the disk bindings.

Run: python tests/load/recording_service.py --config FILE --tokens FILE
Each registered token is appended to the tokens file as one line ``<token> <node name>`` (O_APPEND, one write per
line, so the lines of two service processes never interleave).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


sys.path.insert(0, str(REPO / "tests"))
from testenv import unit_conftest  # noqa: E402

unit_conftest()
sys.path.insert(0, str(REPO / "tests" / "unit" / "plugins" / "module_utils" / "_join"))

from join_harness import FakeApi  # noqa: E402
from ansible_collections.confidential.kubernetes.plugins.module_utils._join import issuance, service  # noqa: E402
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.tokens import (
    TOKEN_PATTERN,
    TokenMinter,
    TokenMintError,
)  # noqa: E402


class RecordingMinter(TokenMinter):
    """Registers nothing: appends each token and its node to a 0600 file, refusing tokens kubeadm would refuse. No node
    ever registers here, so no token is retired."""

    def __init__(self, path: str):
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    async def mint(self, token: str, node_name: str) -> None:
        if not TOKEN_PATTERN.fullmatch(token):
            raise TokenMintError(f"token for node {node_name} does not match [a-z0-9]{{6}}.[a-z0-9]{{16}}")
        os.write(self._fd, f"{token} {node_name}\n".encode())

    async def live(self):
        return []

    async def retire(self, token_id: str) -> None:
        raise TokenMintError("the load suite registers no node, so no token is retired")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--tokens", required=True, help="file the minted tokens are appended to")
    args = parser.parse_args()
    # All the load suite's clients share 127.0.0.1: one client address may have as many challenges waiting as all.
    issuance.MAX_PENDING_PER_CLIENT = issuance.MAX_PENDING
    return service.main(["--config", args.config], token_minter=RecordingMinter(args.tokens), api=FakeApi())


if __name__ == "__main__":
    sys.exit(main())
