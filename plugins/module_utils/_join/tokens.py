# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""kubeadm bootstrap tokens for joining nodes: generated here, registered as a bootstrap-token Secret, single use.

A token is registered exactly as ``kubeadm token create`` registers it - the Secret
``kube-system/bootstrap-token-<id>`` of type ``bootstrap.kubernetes.io/token`` - but
through the service's one API client (``kubeapi.ClusterApi``), because ``kubeadm token
create`` takes the token only as a positional argument, which puts it in
/proc/<pid>/cmdline for every local user to read. The token travels only in the request
body to the API server; it is never logged, and no exception raised here carries it.

A token serves one join: once its node's kubelet has registered - a Node of the granted name created after the token, a
Node of that name that existed already whose Ready condition was reported after the token (the kubelet's status at
start), or a certificate signing request made with the token (user ``system:bootstrap:<id>``) approved - the service deletes
the Secret (``retire``). Nodes and CSRs are watched (``follow``), not polled. Its 15-minute expiry is the backstop.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import hmac
import re
import secrets
from dataclasses import dataclass
from typing import Callable

from .kubeapi import ApiStatusError, ApiUnavailable, ClusterApi

TOKEN_TTL = datetime.timedelta(minutes=15)
TOKEN_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"
TOKEN_PATTERN = re.compile(r"[a-z0-9]{6}\.[a-z0-9]{16}")
TOKEN_ID = re.compile(r"[a-z0-9]{6}")
# kubeadm's default group for join tokens: the RBAC kubeadm init made lets it post CSRs and read the join ConfigMaps.
TOKEN_GROUPS = "system:bootstrappers:kubeadm:default-node-token"
DESCRIPTION_PREFIX = "confidential.kubernetes join of "
# A Node older than its token (by more than the clocks of two control planes may differ) is from an earlier membership.
CLOCK_SKEW = datetime.timedelta(minutes=2)
TOKEN_TYPE = "bootstrap.kubernetes.io/token"


class TokenMintError(RuntimeError):
    """A bootstrap token could not be registered or retired; the message has the API's words, secrets masked."""


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
        "type": TOKEN_TYPE,
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
    """Interface: register a bootstrap token the service generated (TTL 15 min) for one node's join, and retire it once
    its node's kubelet registered.

    Coroutines: the service awaits them on its event loop, so a slow API never holds up other joins.
    """

    async def mint(self, token: str, node_name: str) -> None:
        raise NotImplementedError

    async def live(self) -> list[LiveToken]:
        """The tokens this service family registered that are still in the cluster (adopted at start)."""
        raise NotImplementedError

    def follow(self, on_change: Callable[[], None], on_failure: Callable[[str], None]) -> None:
        """Start watching for kubelets that register; ``on_change`` is called (from any thread) when one may have."""

    def registered(self, tokens: list[LiveToken]) -> list[str]:
        """IDs of the tokens whose node's kubelet has registered, as far as the watch has seen."""
        return []

    async def retire(self, token_id: str) -> None:
        raise NotImplementedError


def registered_tokens(
    tokens: list[LiveToken],
    nodes: dict[str, tuple[datetime.datetime | None, datetime.datetime | None]],
    approved: set[str],
) -> list[str]:
    """IDs of ``tokens`` whose node registered: ``nodes`` maps a Node's name to (created, Ready heartbeat), ``approved``
    holds the users of approved CSRs."""
    done = []
    for token in tokens:
        node_created, node_beat = nodes.get(token.node_name, (None, None))
        if (
            f"system:bootstrap:{token.token_id}" in approved
            or (node_created is not None and node_created >= token.issued - CLOCK_SKEW)
            # A Node that existed already (an earlier membership of the name): its kubelet reported after the token.
            or (node_beat is not None and node_beat >= token.issued.replace(microsecond=0))
        ):
            done.append(token.token_id)
    return done


def node_summary(node: dict) -> tuple[datetime.datetime | None, datetime.datetime | None]:
    """What retirement needs of a Node: when it was created, when its kubelet last reported Ready's condition."""
    conditions = node.get("status", {}).get("conditions") or []
    beat = next((c.get("lastHeartbeatTime") or "" for c in conditions if c.get("type") == "Ready"), "")
    return _timestamp(node["metadata"].get("creationTimestamp") or ""), _timestamp(beat)


def approved_csr_user(csr: dict) -> str | None:
    """The user who made an approved CSR (None: not approved, not kept)."""
    if any(c.get("type") == "Approved" for c in csr.get("status", {}).get("conditions") or []):
        return csr.get("spec", {}).get("username") or None
    return None


class ApiTokenMinter(TokenMinter):
    """Registers and retires tokens through the service's one API client (the token in the request body only)."""

    def __init__(
        self,
        api: ClusterApi,
        ttl: datetime.timedelta = TOKEN_TTL,
        now: Callable[[], datetime.datetime] = _utcnow,
    ):
        self.api = api
        self.ttl = ttl
        self._now = now
        self._nodes = None
        self._csrs = None

    def secret(self, token: str, node_name: str) -> dict:
        return bootstrap_token_secret(token, node_name, self._now() + self.ttl)

    async def mint(self, token: str, node_name: str) -> None:
        token_id, token_secret = token.split(".")
        masks = ((token, "<token>"), (token_secret, "<token-secret>"))
        try:
            try:
                await self.api.create("secrets", self.secret(token, node_name))
            except ApiStatusError as exc:
                # A create retried after a lost answer meets its own first attempt: ours if it holds this secret.
                if exc.status != 409 or not await self._holds(token_id, token_secret):
                    raise
        except (ApiStatusError, ApiUnavailable) as exc:
            words = str(exc)
            for secret, placeholder in masks:
                words = words.replace(secret, placeholder)
            raise TokenMintError(f"registering the bootstrap token for node {node_name} failed ({words})") from None

    async def _holds(self, token_id: str, token_secret: str) -> bool:
        stored = (await self.api.read("secrets", f"bootstrap-token-{token_id}")).get("data") or {}
        try:
            held = base64.b64decode(stored.get("token-secret", ""), validate=True)
        except (binascii.Error, ValueError):
            return False
        return hmac.compare_digest(held, token_secret.encode())

    async def retire(self, token_id: str) -> None:
        try:
            await self.api.delete("secrets", f"bootstrap-token-{token_id}")
        except (ApiStatusError, ApiUnavailable) as exc:
            raise TokenMintError(f"deleting the bootstrap token {token_id} failed ({exc})") from None

    async def live(self) -> list[LiveToken]:
        try:
            secrets_listed = await self.api.list("secrets", field_selector=f"type={TOKEN_TYPE}")
        except (ApiStatusError, ApiUnavailable) as exc:
            raise TokenMintError(f"listing the bootstrap tokens failed ({exc})") from None
        tokens = []
        for item in secrets_listed:
            metadata = item.get("metadata") or {}
            try:
                description = base64.b64decode((item.get("data") or {}).get("description", ""), validate=True).decode()
            except (binascii.Error, ValueError):
                continue
            token_id = str(metadata.get("name", "")).removeprefix("bootstrap-token-")
            issued = _timestamp(metadata.get("creationTimestamp") or "")
            if description.startswith(DESCRIPTION_PREFIX) and TOKEN_ID.fullmatch(token_id) and issued is not None:
                tokens.append(LiveToken(token_id, description[len(DESCRIPTION_PREFIX) :], issued))
        return tokens

    def follow(self, on_change: Callable[[], None], on_failure: Callable[[str], None]) -> None:
        self._nodes = self.api.watch("nodes", node_summary, on_change, on_failure)
        self._csrs = self.api.watch("certificatesigningrequests", approved_csr_user, on_change, on_failure)

    def registered(self, tokens: list[LiveToken]) -> list[str]:
        if self._nodes is None or self._csrs is None:
            return []
        return registered_tokens(tokens, self._nodes.snapshot(), set(self._csrs.snapshot().values()))
