"""A real HTTP server on 127.0.0.1 for the artefact download tests; real etcd members for the backup tests."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import threading
import time

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._backup import etcd


class _Files(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def server(tmp_path):
    """A real HTTP server on 127.0.0.1 serving tmp_path/www; yields (base URL, root, request log)."""
    root = tmp_path / "www"
    root.mkdir()
    requests: list[str] = []

    class Handler(_Files):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def do_GET(self):
            requests.append(self.path)
            super().do_GET()

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", root, requests
    httpd.shutdown()
    httpd.server_close()


def free_port_number() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class EtcdMember:
    """A real single-member etcd on loopback (plain HTTP), stopped by the fixture that started it."""

    def __init__(self, data_dir: str, name: str = "cp-0", peer_port: int | None = None):
        self.client = f"http://127.0.0.1:{free_port_number()}"
        self.peer = f"http://127.0.0.1:{peer_port or free_port_number()}"
        self.name = name
        self.data_dir = data_dir
        self.process = None

    def start(self) -> "EtcdMember":
        self.process = subprocess.Popen(
            [
                "etcd",
                "--name",
                self.name,
                "--data-dir",
                self.data_dir,
                "--listen-client-urls",
                self.client,
                "--advertise-client-urls",
                self.client,
                "--listen-peer-urls",
                self.peer,
                "--initial-advertise-peer-urls",
                self.peer,
                "--initial-cluster",
                f"{self.name}={self.peer}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                self.etcdctl().health()
                return self
            except etcd.EtcdError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def etcdctl(self) -> etcd.Etcdctl:
        return etcd.Etcdctl(endpoint=self.client, timeout=2)

    def ctl(self, *args: str) -> str:
        return subprocess.run(
            ["etcdctl", f"--endpoints={self.client}", *args],
            check=True,
            capture_output=True,
            text=True,
            env=dict(os.environ, ETCDCTL_API="3"),
        ).stdout

    def stop(self) -> None:
        if self.process:
            self.process.terminate()
            self.process.wait(10)


@pytest.fixture(scope="module")
def etcd_members():
    """Start real etcd members: ``etcd_members(data_dir, name="cp-0", peer_port=None)``; all stop with the module."""
    started = []

    def start(data_dir: str, name: str = "cp-0", peer_port: int | None = None) -> EtcdMember:
        member = EtcdMember(data_dir, name, peer_port)
        started.append(member)
        return member.start()

    yield start
    for member in started:
        member.stop()


@pytest.fixture
def free_port():
    return free_port_number
