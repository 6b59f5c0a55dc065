"""An unauthenticated GetNonce flood from one client: one TLS channel (one connection), as many calls in flight as the
service allows per connection, until COUNT calls have been answered.

  python tests/security/flood.py --endpoint [::1]:PORT --ca CA.pem --count 50000 [--in-flight 32] [--server-name localhost]

Prints one JSON object: calls, answered OK, refused per status (and the first message of each), seconds, calls per second. Run as a process of its own
(a real client is another machine): its CPU is not the service's.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import support  # noqa: E402  (puts the collection on sys.path)

support.unit_conftest()

import grpc  # noqa: E402
from grpc import aio  # noqa: E402

from ansible_collections.confidential.kubernetes.plugins.module_utils._join import joinservice_pb2 as pb2  # noqa: E402
from ansible_collections.confidential.kubernetes.plugins.module_utils._join import joinservice_pb2_grpc as pb2_grpc  # noqa: E402


async def flood(endpoint: str, ca_pem: bytes, count: int, in_flight: int, server_name: str | None) -> dict:
    options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
    outcomes: collections.Counter = collections.Counter()
    details: dict[str, str] = {}
    remaining = count
    async with aio.secure_channel(endpoint, grpc.ssl_channel_credentials(ca_pem), options=options) as channel:
        stub = pb2_grpc.JoinServiceStub(channel)
        await channel.channel_ready()
        started = time.monotonic()

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                try:
                    await stub.GetNonce(pb2.GetNonceRequest(), timeout=30)
                    outcomes["OK"] += 1
                except grpc.RpcError as exc:
                    outcomes[exc.code().name] += 1
                    details.setdefault(exc.code().name, exc.details())

        await asyncio.gather(*(worker() for _i in range(in_flight)))
        seconds = time.monotonic() - started
    return {
        "calls": sum(outcomes.values()),
        "outcomes": dict(outcomes),
        "details": details,
        "seconds": round(seconds, 2),
        "per_second": round(sum(outcomes.values()) / seconds),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--ca", required=True)
    parser.add_argument("--count", type=int, default=50_000)
    parser.add_argument("--in-flight", type=int, default=32)
    parser.add_argument("--server-name")
    args = parser.parse_args()
    result = asyncio.run(flood(args.endpoint, Path(args.ca).read_bytes(), args.count, args.in_flight, args.server_name))
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
