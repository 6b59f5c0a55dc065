# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""kubeadm bootstrap tokens for joining nodes: generated here, registered as a bootstrap-token Secret, single use.

A token is registered exactly as ``kubeadm token create`` registers it - the Secret
``kube-system/bootstrap-token-<id>`` of type ``bootstrap.kubernetes.io/token`` - but
through ``kubectl create --filename=-`` with the manifest on stdin, because
``kubeadm token create`` takes the token only as a positional argument, which puts
it in /proc/<pid>/cmdline for every local user to read. The token travels only in
the pipe to kubectl; it is never logged, and no exception raised here carries it.

A token serves one join: once its node's kubelet has registered - a Node of the granted name created after the token, a
Node of that name that existed already whose Ready condition was reported after the token (the kubelet's status at
start), or a certificate signing request made with the token (user ``system:bootstrap:<id>``) approved - the service deletes
the Secret (``retire``), through the same kubectl seam. Its 15-minute expiry is the backstop.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import json
import re
import secrets
from dataclasses import dataclass
from typing import Callable

from .kubectl import KUBECTL_TIMEOUT, Kubectl, KubectlError
from .._kubeadm import ADMIN_CONF

TOKEN_TTL = datetime.timedelta(minutes=15)
TOKEN_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"
TOKEN_PATTERN = re.compile(r"[a-z0-9]{6}\.[a-z0-9]{16}")
TOKEN_ID = re.compile(r"[a-z0-9]{6}")
# kubeadm's default group for join tokens: the RBAC kubeadm init made lets it post CSRs and read the join ConfigMaps.
TOKEN_GROUPS = "system:bootstrappers:kubeadm:default-node-token"
DESCRIPTION_PREFIX = "confidential.kubernetes join of "
MINT_TIMEOUT = KUBECTL_TIMEOUT
# A Node older than its token (by more than the clocks of two control planes may differ) is from an earlier membership.
CLOCK_SKEW = datetime.timedelta(minutes=2)
_NODES = (
    '{range .items[*]}{.metadata.name}{"\\t"}{.metadata.creationTimestamp}{"\\t"}'
    '{.status.conditions[?(@.type=="Ready")].lastHeartbeatTime}{"\\n"}{end}'
)
_CSRS = '{range .items[*]}{.spec.username}{"\\t"}{.status.conditions[*].type}{"\\n"}{end}'
_SECRETS = '{range .items[*]}{.metadata.name}{"\\t"}{.data.description}{"\\t"}{.metadata.creationTimestamp}{"\\n"}{end}'


class TokenMintError(RuntimeError):
    """A bootstrap token could not be registered or retired; the message carries kubectl's words with secrets masked."""


@dataclass(frozen=True)
class LiveToken:
    """A registered token that is still valid: its public ID, its node, when it was issued. Nothing secret."""

    token_id: str
    node_name: str
    issued: datetime.datetime


# Random bytes -> token characters: byte b is TOKEN_ALPHABET[b % 36]; bytes >= 252 are dropped, so each character is uniform.
_TOKEN_LIMIT = 256 - 256 % len(TOKEN_ALPHABET)
_TOKEN_CHARACTERS = bytes(ord(TOKEN_ALPHABET[b % len(TOKEN_ALPHABET)]) for b in range(256))
_TOKEN_DROPPED = bytes(range(_TOKEN_LIMIT, 256))


def generate_token() -> str:
    """A kubeadm bootstrap token ``[a-z0-9]{6}.[a-z0-9]{16}`` from the system CSPRNG (uniform: bytes >= 252 are dropped)."""
    chars = b""
    while len(chars) < 22:
        chars += secrets.token_bytes(32).translate(_TOKEN_CHARACTERS, _TOKEN_DROPPED)
    return f"{chars[:6].decode()}.{chars[6:22].decode()}"


def token_description(node_name: str) -> str:
    return DESCRIPTION_PREFIX + node_name


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _timestamp(value: str) -> datetime.datetime | None:
    try:
        return datetime.datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc)
    except ValueError:
        return None


def bootstrap_token_secret(token: str, node_name: str, expires: datetime.datetime) -> dict:
    """The Secret ``kubeadm token create`` would make for ``token`` (authentication and signing, kubeadm's node group)."""
    token_id, token_secret = token.split(".")
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": f"bootstrap-token-{token_id}", "namespace": "kube-system"},
        "type": "bootstrap.kubernetes.io/token",
        "stringData": {
            "description": token_description(node_name),
            "token-id": token_id,
            "token-secret": token_secret,
            "expiration": expires.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "usage-bootstrap-authentication": "true",
            "usage-bootstrap-signing": "true",
            "auth-extra-groups": TOKEN_GROUPS,
        },
    }


class TokenMinter:
    """Interface: register a bootstrap token the service generated (TTL 15 min) for one node's join, and retire it.

    Coroutines: the service awaits them on its event loop, so a slow kubectl never holds up other joins.
    """

    async def mint(self, token: str, node_name: str) -> None:
        raise NotImplementedError

    async def live(self) -> list[LiveToken]:
        """The tokens this service family registered that are still in the cluster (adopted at start)."""
        raise NotImplementedError

    async def registered(self, tokens: list[LiveToken]) -> list[str]:
        """IDs of the tokens whose node's kubelet has registered."""
        raise NotImplementedError

    async def retire(self, token_id: str) -> None:
        raise NotImplementedError


class KubectlTokenMinter(Kubectl, TokenMinter):
    """Registers and retires tokens with kubectl (manifest on stdin; the token never on argv). Tests replace ``_run_command``."""

    def __init__(
        self,
        kubeconfig: str = ADMIN_CONF,
        binary: str = "kubectl",
        ttl: datetime.timedelta = TOKEN_TTL,
        timeout: float = MINT_TIMEOUT,
        now: Callable[[], datetime.datetime] = _utcnow,
    ):
        super().__init__(kubeconfig, binary, timeout)
        self.ttl = ttl
        self._now = now

    def manifest(self, token: str, node_name: str) -> bytes:
        return json.dumps(bootstrap_token_secret(token, node_name, self._now() + self.ttl)).encode()

    async def mint(self, token: str, node_name: str) -> None:
        masks = ((token, "<token>"), (token.split(".")[1], "<token-secret>"))
        try:
            await self.kubectl(["create", "--filename=-"], self.manifest(token, node_name), masks)
        except KubectlError as exc:
            raise TokenMintError(f"registering the bootstrap token for node {node_name} failed ({exc})") from None

    async def retire(self, token_id: str) -> None:
        try:
            await self.kubectl(
                ["delete", "secret", f"bootstrap-token-{token_id}", "--namespace=kube-system", "--ignore-not-found"]
            )
        except KubectlError as exc:
            raise TokenMintError(f"deleting the bootstrap token {token_id} failed ({exc})") from None

    async def live(self) -> list[LiveToken]:
        try:
            listing = await self.kubectl(
                [
                    "get",
                    "secrets",
                    "--namespace=kube-system",
                    "--field-selector=type=bootstrap.kubernetes.io/token",
                    f"--output=jsonpath={_SECRETS}",
                ]
            )
        except KubectlError as exc:
            raise TokenMintError(f"listing the bootstrap tokens failed ({exc})") from None
        tokens = []
        for line in listing.splitlines():
            name, encoded, created = (line.split("\t") + ["", ""])[:3]
            try:
                description = base64.b64decode(encoded, validate=True).decode()
            except (binascii.Error, ValueError):
                continue
            token_id = name.removeprefix("bootstrap-token-")
            issued = _timestamp(created)
            if description.startswith(DESCRIPTION_PREFIX) and TOKEN_ID.fullmatch(token_id) and issued is not None:
                tokens.append(LiveToken(token_id, description[len(DESCRIPTION_PREFIX) :], issued))
        return tokens

    async def registered(self, tokens: list[LiveToken]) -> list[str]:
        try:
            nodes = await self.kubectl(["get", "nodes", f"--output=jsonpath={_NODES}"])
            csrs = await self.kubectl(["get", "certificatesigningrequests", f"--output=jsonpath={_CSRS}"])
        except KubectlError as exc:
            raise TokenMintError(f"looking for registered nodes failed ({exc})") from None
        created, heartbeat = {}, {}
        for line in nodes.splitlines():
            name, timestamp, beat = (line.split("\t") + ["", ""])[:3]
            created[name], heartbeat[name] = _timestamp(timestamp), _timestamp(beat)
        approved = {
            line.partition("\t")[0] for line in csrs.splitlines() if "Approved" in line.partition("\t")[2].split()
        }
        done = []
        for token in tokens:
            node_created, node_beat = created.get(token.node_name), heartbeat.get(token.node_name)
            if (
                f"system:bootstrap:{token.token_id}" in approved
                or (node_created is not None and node_created >= token.issued - CLOCK_SKEW)
                # A Node that existed already (an earlier membership of the name): its kubelet reported after the token.
                or (node_beat is not None and node_beat >= token.issued.replace(microsecond=0))
            ):
                done.append(token.token_id)
        return done
