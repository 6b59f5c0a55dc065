"""Helpers for the doubles' tests: run the real executables against a temp root per simulated node."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

DOUBLES = Path(__file__).resolve().parents[2] / "doubles"
BIN = DOUBLES / "bin"
sys.path.insert(0, str(DOUBLES))

from k8sdoubles.common import APISERVER_PID_FILE  # noqa: E402

TOKEN = "abcdef.0123456789abcdef"

CRD = """\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, shortNames: [wd]}
  versions:
  - name: v1
    served: true
    storage: true
    additionalPrinterColumns:
    - {name: Size, type: integer, jsonPath: .spec.size}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [size]
            properties:
              size: {type: integer}
  - name: v1beta1
    served: true
    storage: false
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
"""

WIDGET = """\
apiVersion: example.com/v1
kind: Widget
metadata:
  name: small
  labels: {tier: test}
spec:
  size: {size}
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Node:
    """One simulated host: a K8S_DOUBLES_ROOT directory."""

    root: Path

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        env.update(
            {
                "K8S_DOUBLES_ROOT": str(self.root),
                "K8S_DOUBLES_APISERVER_BIND_ADDRESS": "127.0.0.1",
                "K8S_DOUBLES_NO_SYSTEMD": "1",
                "K8S_DOUBLES_PYTHON": sys.executable,
            }
        )
        env.update(extra or {})
        return env

    def run(
        self, tool: str, *args: str, stdin: str | None = None, env: dict[str, str] | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / tool), *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=self.env(env),
            timeout=timeout,
            check=False,
        )

    def path(self, logical: str) -> Path:
        return self.root / logical.lstrip("/")

    def write(self, name: str, text: str) -> str:
        target = self.root / name
        target.write_text(textwrap.dedent(text))
        return str(target)

    @property
    def admin_conf(self) -> str:
        return str(self.path("/etc/kubernetes/admin.conf"))

    def kubectl(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return self.run("kubectl", "--kubeconfig", self.admin_conf, *args, stdin=stdin)

    def apiserver_pid(self) -> int | None:
        try:
            return int(self.path(APISERVER_PID_FILE).read_text())
        except (OSError, ValueError):
            return None


@dataclass
class Cluster:
    control_plane: Node
    port: int
    ca_hash: str
    token: str = TOKEN

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def join_config(
        self,
        node: Node,
        name: str,
        token: str | None = None,
        hashes: list[str] | None = None,
        extra: str = "",
        version: str = "v1beta4",
    ) -> str:
        pins = "\n".join(f"      - {h}" for h in (hashes if hashes is not None else [self.ca_hash]))
        timeouts = "timeouts:\n  discovery: 2s\n" if version == "v1beta4" else ""
        return node.write(
            "join.yaml",
            f"""\
apiVersion: kubeadm.k8s.io/{version}
kind: JoinConfiguration
discovery:
  bootstrapToken:
    token: {token or self.token}
    apiServerEndpoint: {self.endpoint}
    caCertHashes:
{pins}
nodeRegistration:
  name: {name}
{timeouts}{extra}""",
        )


def init_config(node: Node, port: int, extra_init: str = "", extra_cluster: str = "") -> str:
    return node.write(
        "init.yaml",
        f"""\
apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
bootstrapTokens:
- token: {TOKEN}
  ttl: 1h
localAPIEndpoint:
  advertiseAddress: 127.0.0.1
  bindPort: {port}
nodeRegistration:
  name: cp1
{extra_init}---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
controlPlaneEndpoint: 127.0.0.1:{port}
encryptionAlgorithm: ECDSA-P256
networking:
  podSubnet: 10.244.0.0/16
{extra_cluster}""",
    )


def stop_pid(pid: int | None) -> None:
    if pid is None:
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)


def pid_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie waiting to be reaped."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
