"""Shared fixtures: the collection import path, real swtpm instances and a private real containerd."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Under pytest-xdist (scripts/test.sh runs pytest -n 2), worker gwN boots its labs under CK_LAB_INDEX + N: labs of
# different indexes have their own bridge, addresses and machine names and run side by side. Set here, before any test
# module imports cklab (its plan reads the index once): tests outside tests/unit/lab import it too (the upgrade drill's
# test), and a worker that imported it first held the index unadjusted while its `lab up` used the adjusted one (a CI
# run's real-control-plane lab advertised another lab's address).
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER.startswith("gw"):
    os.environ["CK_LAB_INDEX"] = str(int(os.environ.get("CK_LAB_INDEX", "0")) + int(_WORKER[2:]))


def _collection_root() -> Path:
    """Make ``ansible_collections.confidential.kubernetes`` importable from the source tree."""
    for parent in REPO.parents:
        if parent.name == "ansible_collections":
            return parent.parent
    root = REPO / ".venv" / "collections"
    link = root / "ansible_collections" / "confidential" / "kubernetes"
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(REPO)
    return root


sys.path.insert(0, str(_collection_root()))


def _write_ca_config(workdir: Path, ca_dir: Path) -> Path:
    ca_dir.mkdir(parents=True, exist_ok=True)
    (workdir / "localca.conf").write_text(
        f"statedir = {ca_dir}\nsigningkey = {ca_dir}/signkey.pem\n"
        f"issuercert = {ca_dir}/issuercert.pem\ncertserial = {ca_dir}/certserial\n"
    )
    (workdir / "localca.options").write_text(
        "--platform-manufacturer confidential.kubernetes-tests\n--platform-version 2.1\n--platform-model swtpm\n"
    )
    setup = workdir / "swtpm_setup.conf"
    setup.write_text(
        f"create_certs_tool = /usr/bin/swtpm_localca\ncreate_certs_tool_config = {workdir}/localca.conf\n"
        f"create_certs_tool_options = {workdir}/localca.options\n"
    )
    return setup


class ManufacturedTpm:
    """A TPM state with an EK certificate from a private CA, made once per test session."""

    def __init__(self, workdir: Path, ca_dir: Path, pcr_banks: str | None = None):
        self.state = workdir / "state"
        self.state.mkdir(parents=True)
        self.ca_dir = ca_dir
        setup = _write_ca_config(workdir, self.ca_dir)
        subprocess.run(
            [
                "swtpm_setup",
                "--tpm2",
                "--tpmstate",
                str(self.state),
                "--create-ek-cert",
                "--lock-nvram",
                "--config",
                str(setup),
                *(["--pcr-banks", pcr_banks] if pcr_banks else []),
            ],
            check=True,
            capture_output=True,
        )
        # The CA file a verifier trusts: the issuing CA and its root.
        self.ca_pem = (self.ca_dir / "issuercert.pem").read_bytes() + (
            self.ca_dir / "swtpm-localca-rootca-cert.pem"
        ).read_bytes()


class SwtpmInstance:
    def __init__(self, manufactured: ManufacturedTpm):
        self.dir = Path(tempfile.mkdtemp(prefix="ck-swtpm-"))
        shutil.copytree(manufactured.state, self.dir / "state")
        self.socket = self.dir / "swtpm.sock"
        self.tcti = f"swtpm:path={self.socket}"
        self.ca_pem = manufactured.ca_pem
        # swtpm writes a line per client disconnect: a pipe nobody reads fills up and blocks it, a file does not.
        self.log = self.dir / "swtpm.log"
        with open(self.log, "wb") as log:
            # A direct child (no --daemon), so stopping it reaps it instead of leaving a zombie.
            self.process = subprocess.Popen(
                [
                    "swtpm",
                    "socket",
                    "--tpm2",
                    "--tpmstate",
                    f"dir={self.dir / 'state'}",
                    "--server",
                    f"type=unixio,path={self.socket}",
                    "--ctrl",
                    f"type=unixio,path={self.socket}.ctrl",
                    "--flags",
                    "not-need-init,startup-clear",
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        self.pid = self.process.pid
        for _attempt in range(250):
            if self._listening() or self.process.poll() is not None:
                break
            time.sleep(0.02)
        if not self._listening():
            raise RuntimeError(
                f"swtpm did not start: {self.log.read_text(errors='replace') if self.process.poll() is not None else 'no socket'}"
            )

    def _listening(self) -> bool:
        """Both sockets accept connections (a bound socket file alone is not enough)."""
        for path in (self.socket, Path(f"{self.socket}.ctrl")):
            probe = socket.socket(socket.AF_UNIX)
            try:
                probe.connect(str(path))
            except OSError:
                return False
            finally:
                probe.close()
        return True

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.process.wait(timeout=5)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def manufactured_tpms(tmp_path_factory):
    """Three TPMs: 'lab' and 'lab2' from the trusted manufacturer CA, 'other' from an untrusted one."""
    if not shutil.which("swtpm") or not shutil.which("swtpm_setup"):
        pytest.fail("swtpm and swtpm_setup are required (apt-get install swtpm swtpm-tools); run scripts/setup.sh")
    trusted_ca = tmp_path_factory.mktemp("ca-trusted")
    other_ca = tmp_path_factory.mktemp("ca-other")
    return {
        name: ManufacturedTpm(tmp_path_factory.mktemp(f"tpm-{name}"), ca)
        for name, ca in (("lab", trusted_ca), ("lab2", trusted_ca), ("other", other_ca))
    }


def _swtpm(manufactured):
    instance = SwtpmInstance(manufactured)
    try:
        yield instance
    finally:
        instance.stop()


@pytest.fixture
def swtpm(manufactured_tpms):
    """A fresh, running swtpm (PCRs reset) whose EK chains to the trusted test CA."""
    yield from _swtpm(manufactured_tpms["lab"])


@pytest.fixture(scope="session")
def manufactured_sha1_tpm(tmp_path_factory):
    """A TPM that has allocated the sha1 bank beside sha256 (as older firmware's TPMs do; swtpm's default is sha256
    only), made only for the sessions that use it."""
    return ManufacturedTpm(tmp_path_factory.mktemp("tpm-sha1"), tmp_path_factory.mktemp("ca-sha1"), "sha1,sha256")


@pytest.fixture
def sha1_swtpm(manufactured_sha1_tpm):
    """A fresh, running swtpm with a sha1 and a sha256 bank."""
    yield from _swtpm(manufactured_sha1_tpm)


@pytest.fixture
def other_swtpm(manufactured_tpms):
    """A second running swtpm: a different TPM from the same trusted manufacturer."""
    yield from _swtpm(manufactured_tpms["lab2"])


@pytest.fixture
def foreign_swtpm(manufactured_tpms):
    """A running swtpm whose EK certificate comes from an untrusted CA."""
    yield from _swtpm(manufactured_tpms["other"])


@pytest.fixture
def start_swtpm(manufactured_tpms):
    """Start another instance of a manufactured TPM (e.g. the same TPM after a reboot); stopped at teardown."""
    started = []

    def start(name: str = "lab") -> SwtpmInstance:
        started.append(SwtpmInstance(manufactured_tpms[name]))
        return started[-1]

    yield start
    for instance in started:
        instance.stop()


sys.path.insert(0, str(REPO / "tests"))

import control_plane  # noqa: E402  (tests/control_plane.py: the real control plane on loopback)


def _require_control_plane() -> None:
    missing = control_plane.missing_binaries()
    if missing:
        message = (
            f"the real Kubernetes binaries are not built ({', '.join(missing)} missing in "
            f"{control_plane.binaries_dir()}): run tests/lab/lab kubernetes"
        )
        if os.environ.get("CK_REQUIRE_KUBERNETES") == "1":
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="session")
def kube_control_plane():
    """One real etcd + kube-apiserver + kube-controller-manager on loopback for the whole session."""
    _require_control_plane()
    started = control_plane.start_control_plane()
    try:
        yield started
    finally:
        control_plane.stop_control_plane(started)


@pytest.fixture
def nodes_deleted_after(kube_control_plane):
    """For a test that creates Node objects on the shared API server: every Node is deleted after it. A Node without
    a kubelet never runs a pod, so one left behind would hold a later DaemonSet not ready (helm --wait then waits for
    it until its deadline)."""
    yield
    kube_control_plane.kubectl("delete", "nodes", "--all", "--wait=false")


@pytest.fixture(scope="module", params=["helm-3.17.2", "helm-4.1.4"])
def helm_binary(request) -> str:
    """Each real helm the collection supports."""
    _require_control_plane()
    return str(control_plane.binaries_dir() / request.param)


class FileHashes:
    """Counts the files module_utils._files hashes from its creation on (every file digest goes through its sha256)."""

    def __init__(self, monkeypatch):
        from ansible_collections.confidential.kubernetes.plugins.module_utils import _files  # pylint: disable=import-outside-toplevel

        self.count = 0
        real = _files.hashlib.sha256

        def counting(*args):
            self.count += 1
            return real(*args)

        monkeypatch.setattr(_files.hashlib, "sha256", counting)


@pytest.fixture
def count_file_hashes(monkeypatch):
    """Call it to start counting the files module_utils._files hashes; returns the counter (its .count)."""
    return lambda: FileHashes(monkeypatch)


@pytest.fixture
def containerd():
    """A private real containerd (own root, state and socket under a short temporary directory); yields its socket.
    Skips where it cannot run: not root (snapshots are mounts), or no containerd/ctr (scripts/setup.sh installs
    Debian's containerd for CI)."""
    if os.geteuid() != 0:
        pytest.skip("a private containerd needs root (its snapshots are mounts)")
    if shutil.which("containerd") is None or shutil.which("ctr") is None:
        pytest.skip("no containerd/ctr binary: apt-get install containerd (scripts/setup.sh installs it for CI)")
    # A unix socket path has at most 108 bytes: pytest's tmp_path can be longer.
    base = Path(tempfile.mkdtemp(prefix="ck-ctd-", dir="/tmp"))
    address = base / "containerd.sock"
    (base / "config.toml").write_text(
        "version = 2\n"
        f'root = "{base}/root"\nstate = "{base}/state"\n'
        'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
        f'[grpc]\n  address = "{address}"\n'
        f'[ttrpc]\n  address = "{address}.ttrpc"\n'
    )
    with open(base / "containerd.log", "wb") as log:
        process = subprocess.Popen(
            ["containerd", "--config", str(base / "config.toml")], stdout=log, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 20
        while not address.is_socket():
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"containerd did not start: {(base / 'containerd.log').read_text()[-2000:]}")
            time.sleep(0.1)
        yield str(address)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        subprocess.run(["umount", "-R", str(base / "root")], capture_output=True, check=False)
        shutil.rmtree(base, ignore_errors=True)
