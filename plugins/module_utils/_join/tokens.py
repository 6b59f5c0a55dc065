# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""kubeadm bootstrap tokens for joining nodes: generated here, registered as a bootstrap-token Secret.

A token is registered exactly as ``kubeadm token create`` registers it - the Secret
``kube-system/bootstrap-token-<id>`` of type ``bootstrap.kubernetes.io/token`` - but
through ``kubectl create --filename=-`` with the manifest on stdin, because
``kubeadm token create`` takes the token only as a positional argument, which puts
it in /proc/<pid>/cmdline for every local user to read. kubectl rather than an
HTTPS call from here: it reads every form of kubeconfig (embedded or file
certificates, exec plugins) and keeps the admin client key in its own process,
where the standard library's ``ssl`` would need that key copied to a file first.
The token travels only in the pipe to kubectl; it is never logged, and no
exception raised here carries it. kubectl runs as an asyncio subprocess: no thread
is tied up while it works.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import re
import secrets
from typing import Callable

from .._kubeadm import ADMIN_CONF, scrub

TOKEN_TTL = datetime.timedelta(minutes=15)
TOKEN_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"
TOKEN_PATTERN = re.compile(r"[a-z0-9]{6}\.[a-z0-9]{16}")
# kubeadm's default group for join tokens: the RBAC kubeadm init made lets it post CSRs and read the join ConfigMaps.
TOKEN_GROUPS = "system:bootstrappers:kubeadm:default-node-token"
MINT_TIMEOUT = 60


class TokenMintError(RuntimeError):
    """The bootstrap token could not be registered; the message carries kubectl's words with secrets masked."""


def generate_token() -> str:
    """A kubeadm bootstrap token ``[a-z0-9]{6}.[a-z0-9]{16}`` from the system CSPRNG (uniform: bytes >= 252 are dropped)."""
    limit = 256 - 256 % len(TOKEN_ALPHABET)
    chars: list[str] = []
    while len(chars) < 22:
        chars.extend(TOKEN_ALPHABET[b % len(TOKEN_ALPHABET)] for b in secrets.token_bytes(32) if b < limit)
    return "".join(chars[:6]) + "." + "".join(chars[6:22])


def token_description(node_name: str) -> str:
    return f"confidential.kubernetes join of {node_name}"


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


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
    """Interface: register a bootstrap token the service generated (TTL 15 min) for one node's join.

    A coroutine: the service awaits it on its event loop, so a slow registration never holds up other joins.
    """

    async def mint(self, token: str, node_name: str) -> None:
        raise NotImplementedError


class KubectlTokenMinter(TokenMinter):
    """Registers tokens with ``kubectl create --filename=-`` (manifest on stdin). Tests replace ``_run_command``."""

    def __init__(self, kubeconfig: str = ADMIN_CONF, binary: str = "kubectl", ttl: datetime.timedelta = TOKEN_TTL,
                 timeout: float = MINT_TIMEOUT, now: Callable[[], datetime.datetime] = _utcnow):
        self.kubeconfig = kubeconfig
        self.binary = binary
        self.ttl = ttl
        self.timeout = timeout
        self._now = now

    def argv(self) -> list[str]:
        """Nothing secret: the token is in the manifest on stdin."""
        return [self.binary, "create", "--filename=-", f"--kubeconfig={self.kubeconfig}"]

    def manifest(self, token: str, node_name: str) -> bytes:
        return json.dumps(bootstrap_token_secret(token, node_name, self._now() + self.ttl)).encode()

    async def mint(self, token: str, node_name: str) -> None:
        rc, stdout, stderr = await self._run_command(self.argv(), self.manifest(token, node_name))
        if rc != 0:
            words = scrub((stderr or stdout).strip().replace(token, "<token>").replace(token.split(".")[1], "<token-secret>"))
            raise TokenMintError(f"registering the bootstrap token for node {node_name} failed "
                                 f"({self.binary} create exit {rc}): {words or 'no output'}")

    async def _run_command(self, argv: list[str], stdin: bytes) -> tuple[int, str, str]:
        try:
            process = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                                                           stderr=asyncio.subprocess.PIPE)
        except FileNotFoundError:
            raise TokenMintError(f"{self.binary} is not installed on this control-plane node") from None
        except OSError as exc:
            raise TokenMintError(f"cannot run {self.binary}: {exc.strerror}") from None
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(stdin), self.timeout)
        except asyncio.TimeoutError:
            process.kill()
            await process.wait()
            raise TokenMintError(f"{self.binary} create did not finish within {self.timeout:g} s") from None
        except asyncio.CancelledError:
            # The RPC was cancelled (service stopped): do not leave kubectl running.
            if process.returncode is None:
                process.kill()
            raise
        return process.returncode, stdout.decode(errors="replace"), stderr.decode(errors="replace")
