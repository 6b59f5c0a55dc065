# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Wait until a join service answers its Health RPC with SERVING (over TLS, verified against the cluster CA).

``python -m ...health --endpoint 127.0.0.1:30090 --ca /etc/kubernetes/pki/ca.crt --timeout 60``
exits 0 once it is serving, 1 when the time is up (printing the last error).
"""

from __future__ import annotations

import argparse
import sys
import time

from . import joinservice_pb2 as pb2
from . import joinservice_pb2_grpc as pb2_grpc

try:
    import grpc
except ImportError:  # pb2.IMPORT_ERROR reports it
    pass


def status(endpoint: str, ca_pem: bytes, server_name: str | None, timeout: float) -> str:
    # A private subchannel pool: a probe must not inherit the reconnect backoff of the previous one.
    options = [("grpc.use_local_subchannel_pool", 1)] + ([("grpc.ssl_target_name_override", server_name)] if server_name else [])
    with grpc.secure_channel(endpoint, grpc.ssl_channel_credentials(root_certificates=ca_pem), options=options) as channel:
        return pb2_grpc.JoinServiceStub(channel).Health(pb2.HealthRequest(), timeout=timeout).status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Wait until a join service is serving.")
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--ca", required=True, help="PEM file of the cluster CA")
    parser.add_argument("--server-name", help="TLS name to expect, when the endpoint address is not in the certificate")
    parser.add_argument("--timeout", type=float, default=60)
    args = parser.parse_args(argv)
    missing = pb2.IMPORT_ERROR or pb2_grpc.IMPORT_ERROR
    if missing is not None:
        sys.stderr.write(f"grpcio and protobuf are required: {missing}\n")
        return 1
    with open(args.ca, "rb") as handle:
        ca_pem = handle.read()
    deadline = time.monotonic() + args.timeout
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            last = status(args.endpoint, ca_pem, args.server_name, timeout=min(5.0, max(0.5, deadline - time.monotonic())))
            if last == "SERVING":
                sys.stdout.write(f"join service {args.endpoint} is serving\n")
                return 0
        except grpc.RpcError as exc:
            last = f"{exc.code().name if exc.code() else 'UNKNOWN'}: {exc.details()}"
        time.sleep(0.5)
    sys.stderr.write(f"join service {args.endpoint} is not serving after {args.timeout:g} s: {last}\n")
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
