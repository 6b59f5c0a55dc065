# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Wait until a join service answers its Health RPC with SERVING (over TLS, verified against the cluster CA) and, when
asked, has loaded the files just pushed to it.

``python -m ...health --endpoint 127.0.0.1:9290 --ca /etc/kubernetes/pki/ca.crt --timeout 60
[--policy-file FILE] [--enrolment-file FILE]``
exits 0 once it is serving with exactly those files loaded (their SHA-256 digests), 1 when the service refused to load
one of them (the message is the service's load error) or when the time is up (printing the last state).
"""

from __future__ import annotations

import argparse
import sys
import time

from .._files import file_sha256
from . import joinservice_pb2 as pb2
from . import joinservice_pb2_grpc as pb2_grpc

try:
    import grpc
except ImportError:  # pb2.IMPORT_ERROR reports it
    pass


class LoadRefused(RuntimeError):
    """The service refused to load a file that was pushed to it; the message is its load error, ``what`` the file
    (``policy`` or ``enrolment``)."""

    def __init__(self, what: str, message: str):
        super().__init__(message)
        self.what = what


class NotServing(RuntimeError):
    """The service did not serve with the expected files loaded in time; the message is the last state seen."""


def health(endpoint: str, ca_pem: bytes, server_name: str | None, timeout: float):
    # A private subchannel pool: a probe must not inherit the reconnect backoff of the previous one.
    options = [("grpc.use_local_subchannel_pool", 1)] + (
        [("grpc.ssl_target_name_override", server_name)] if server_name else []
    )
    with grpc.secure_channel(
        endpoint, grpc.ssl_channel_credentials(root_certificates=ca_pem), options=options
    ) as channel:
        return pb2_grpc.JoinServiceStub(channel).Health(pb2.HealthRequest(), timeout=timeout)


def loaded(answer, expected: dict[str, str]) -> str | None:
    """None when the service serves with every expected file loaded; else what it is still waiting for.

    Raises LoadRefused when the service reports that it refused the very content expected (``expected`` maps
    ``policy``/``enrolment`` to the SHA-256 hex of the file pushed).
    """
    if answer.status != "SERVING":
        return f"status {answer.status}"
    for what, digest in expected.items():
        if getattr(answer, f"{what}_digest") == digest:
            continue
        if getattr(answer, f"{what}_rejected_digest") == digest:
            raise LoadRefused(
                what,
                f"the join service refused the {what} file that was pushed and keeps the previous one: "
                f"{getattr(answer, f'{what}_error')}",
            )
        return f"the {what} it enforces has digest {getattr(answer, f'{what}_digest') or 'none'}, not {digest}"
    return None


def wait_until_loaded(
    endpoint: str, ca_pem: bytes, expected: dict[str, str], timeout: float, server_name: str | None = None
) -> None:
    """Return once the service at ``endpoint`` serves with the ``expected`` digests loaded (see ``loaded``).

    Raises LoadRefused at once when it refused one of them, NotServing when ``timeout`` seconds pass first.
    """
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            waiting = loaded(
                health(endpoint, ca_pem, server_name, timeout=min(5.0, max(0.5, deadline - time.monotonic()))), expected
            )
        except grpc.RpcError as exc:
            waiting = f"{exc.code().name if exc.code() else 'UNKNOWN'}: {exc.details()}"
        if waiting is None:
            return
        last = waiting
        time.sleep(0.5)
    raise NotServing(f"join service {endpoint} is not serving as expected after {timeout:g} s: {last}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Wait until a join service is serving (with the files pushed to it loaded)."
    )
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--ca", required=True, help="PEM file of the cluster CA")
    parser.add_argument("--server-name", help="TLS name to expect, when the endpoint address is not in the certificate")
    parser.add_argument("--timeout", type=float, default=60)
    parser.add_argument(
        "--policy-file", help="the measurement policy file just pushed: wait until the service enforces it"
    )
    parser.add_argument(
        "--enrolment-file", help="the node enrolment file just pushed: wait until the service has loaded it"
    )
    args = parser.parse_args(argv)
    missing = pb2.IMPORT_ERROR or pb2_grpc.IMPORT_ERROR
    if missing is not None:
        sys.stderr.write(f"grpcio and protobuf are required: {missing}\n")
        return 1
    with open(args.ca, "rb") as handle:
        ca_pem = handle.read()
    expected = {
        what: file_sha256(path)
        for what, path in (("policy", args.policy_file), ("enrolment", args.enrolment_file))
        if path
    }
    try:
        wait_until_loaded(args.endpoint, ca_pem, expected, args.timeout, args.server_name)
    except LoadRefused as exc:
        sys.stderr.write(f"join service {args.endpoint}: {exc}\n")
        return 1
    except NotServing as exc:
        sys.stderr.write(f"{exc}\n")
        return 1
    sys.stdout.write(
        f"join service {args.endpoint} is serving" + (" with the pushed files loaded\n" if expected else "\n")
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
