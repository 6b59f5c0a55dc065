# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""kubeadm bootstrap tokens for joining nodes: generated here, registered by ``kubeadm token create``.

``kubeadm token create`` takes the token only as a positional argument, so it is
on kubeadm's argv for the lifetime of that process: readable in /proc/<pid>/cmdline
by every local user unless /proc is mounted with hidepid. It is never logged, and
no exception raised here carries the argv.
kubeadm runs as an asyncio subprocess: no thread is tied up while it works.
"""

from __future__ import annotations

import asyncio
import re
import secrets

from .._kubeadm import ADMIN_CONF, scrub

TOKEN_TTL = "15m0s"
TOKEN_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"
TOKEN_PATTERN = re.compile(r"[a-z0-9]{6}\.[a-z0-9]{16}")
MINT_TIMEOUT = 60


class TokenMintError(RuntimeError):
    """kubeadm could not register the bootstrap token; the message carries kubeadm's words with secrets masked."""


def generate_token() -> str:
    """A kubeadm bootstrap token ``[a-z0-9]{6}.[a-z0-9]{16}`` from the system CSPRNG (uniform: bytes >= 252 are dropped)."""
    limit = 256 - 256 % len(TOKEN_ALPHABET)
    chars: list[str] = []
    while len(chars) < 22:
        chars.extend(TOKEN_ALPHABET[b % len(TOKEN_ALPHABET)] for b in secrets.token_bytes(32) if b < limit)
    return "".join(chars[:6]) + "." + "".join(chars[6:22])


def token_description(node_name: str) -> str:
    return f"confidential.kubernetes join of {node_name}"


class TokenMinter:
    """Interface: register a bootstrap token the service generated (TTL 15 min) for one node's join.

    A coroutine: the service awaits it on its event loop, so a slow registration never holds up other joins.
    """

    async def mint(self, token: str, node_name: str) -> None:
        raise NotImplementedError


class KubeadmTokenMinter(TokenMinter):
    """Registers tokens with ``kubeadm token create``. Tests replace ``_run_command``."""

    def __init__(self, kubeconfig: str = ADMIN_CONF, binary: str = "kubeadm", ttl: str = TOKEN_TTL, timeout: float = MINT_TIMEOUT):
        self.kubeconfig = kubeconfig
        self.binary = binary
        self.ttl = ttl
        self.timeout = timeout

    def argv(self, token: str, node_name: str) -> list[str]:
        return [self.binary, "token", "create", token, "--ttl", self.ttl, "--description", token_description(node_name),
                "--kubeconfig", self.kubeconfig]

    async def mint(self, token: str, node_name: str) -> None:
        rc, stdout, stderr = await self._run_command(self.argv(token, node_name))
        if rc != 0:
            words = scrub((stderr or stdout).strip().replace(token, "<token>"))
            raise TokenMintError(f"kubeadm token create for node {node_name} failed (exit {rc}): {words or 'no output'}")

    async def _run_command(self, argv: list[str]) -> tuple[int, str, str]:
        try:
            process = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                                                           stderr=asyncio.subprocess.PIPE)
        except FileNotFoundError:
            raise TokenMintError(f"{self.binary} is not installed on this control-plane node") from None
        except OSError as exc:
            raise TokenMintError(f"cannot run {self.binary}: {exc.strerror}") from None
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(), self.timeout)
        except asyncio.TimeoutError:
            process.kill()
            await process.wait()
            raise TokenMintError(f"kubeadm token create did not finish within {self.timeout:g} s") from None
        except asyncio.CancelledError:
            # The RPC was cancelled (service stopped): do not leave kubeadm running.
            if process.returncode is None:
                process.kill()
            raise
        return process.returncode, stdout.decode(errors="replace"), stderr.decode(errors="replace")
