# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""kubectl as the join service runs it: one asyncio subprocess per call, manifests on stdin, never a secret on argv.

kubectl rather than an HTTPS call from here: it reads every form of kubeconfig (embedded or file certificates, exec
plugins) and keeps the admin client key in its own process, where the standard library's ``ssl`` would need that key
copied to a file first. Every call goes through ``_run_command``, the one seam tests replace.
"""

from __future__ import annotations

import asyncio

from .._kubeadm import ADMIN_CONF, scrub

KUBECTL_TIMEOUT = 60


class KubectlError(RuntimeError):
    """A kubectl call failed; the message carries kubectl's words with secrets masked."""

    def __init__(self, message: str, output: str = ""):
        super().__init__(message)
        self.output = output


class Kubectl:
    def __init__(self, kubeconfig: str = ADMIN_CONF, binary: str = "kubectl", timeout: float = KUBECTL_TIMEOUT):
        self.kubeconfig = kubeconfig
        self.binary = binary
        self.timeout = timeout

    def kubectl_argv(self, *args: str) -> list[str]:
        return [self.binary, *args, f"--kubeconfig={self.kubeconfig}"]

    async def kubectl(self, args: list[str], stdin: bytes = b"", masks: tuple[tuple[str, str], ...] = ()) -> str:
        """kubectl's stdout; KubectlError when it fails, its words with each (secret, placeholder) of ``masks`` replaced."""
        rc, stdout, stderr = await self._run_command(self.kubectl_argv(*args), stdin)
        if rc != 0:
            words = (stderr or stdout).strip()
            for secret, placeholder in masks:
                words = words.replace(secret, placeholder)
            words = scrub(words)
            raise KubectlError(f"{self.binary} {args[0]} exit {rc}: {words or 'no output'}", words)
        return stdout

    async def _run_command(self, argv: list[str], stdin: bytes) -> tuple[int, str, str]:
        try:
            process = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
            )
        except FileNotFoundError:
            raise KubectlError(f"{self.binary} is not installed on this control-plane node") from None
        except OSError as exc:
            raise KubectlError(f"cannot run {self.binary}: {exc.strerror}") from None
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(stdin), self.timeout)
        except asyncio.TimeoutError:
            process.kill()
            await process.wait()
            raise KubectlError(f"{self.binary} {argv[1]} did not finish within {self.timeout:g} s") from None
        except asyncio.CancelledError:
            # The RPC was cancelled (service stopped): do not leave kubectl running.
            if process.returncode is None:
                process.kill()
            raise
        return process.returncode, stdout.decode(errors="replace"), stderr.decode(errors="replace")
