# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""kubeadm bootstrap tokens for joining nodes: generated here, registered by ``kubeadm token create``.

``kubeadm token create`` takes the token only as a positional argument, so it is
on kubeadm's argv for the lifetime of that process (visible in /proc to local
root); it is never logged, and no exception raised here carries the argv.
"""

from __future__ import annotations

import re
import secrets
import subprocess

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
    """Interface: register a bootstrap token the service generated (TTL 15 min) for one node's join."""

    def mint(self, token: str, node_name: str) -> None:
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

    def mint(self, token: str, node_name: str) -> None:
        rc, stdout, stderr = self._run_command(self.argv(token, node_name))
        if rc != 0:
            words = scrub((stderr or stdout).strip().replace(token, "<token>"))
            raise TokenMintError(f"kubeadm token create for node {node_name} failed (exit {rc}): {words or 'no output'}")

    def _run_command(self, argv: list[str]) -> tuple[int, str, str]:
        try:
            completed = subprocess.run(argv, capture_output=True, check=False, timeout=self.timeout)
        except FileNotFoundError:
            raise TokenMintError(f"{self.binary} is not installed on this control-plane node") from None
        except subprocess.TimeoutExpired:
            # TimeoutExpired carries the argv, and with it the token: do not chain it.
            raise TokenMintError(f"kubeadm token create did not finish within {self.timeout:g} s") from None
        except OSError as exc:
            raise TokenMintError(f"cannot run {self.binary}: {exc.strerror}") from None
        return completed.returncode, completed.stdout.decode(errors="replace"), completed.stderr.decode(errors="replace")
