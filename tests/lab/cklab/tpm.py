"""Each node's swtpm: manufacture with an EK certificate from the lab CA, start, measure, read.

The lab CA lives in CK_LAB_DIR/ca: swtpm_localca makes a root CA and an intermediate
("issuercert") there on first use; ek-ca.pem holds both, which is what a verifier needs to
check an EK certificate. Node TPM state lives in nodes/NAME/tpm-state (not visible in the
node); nodes/NAME/tpm (bound to /run/tpm in the node) holds only the sockets and the event log.
"""

from __future__ import annotations

import re
import socket
import subprocess
import time
from pathlib import Path

from . import LabError
from .host import run
from .measure import BootEvent
from .paths import LabPaths

EK_CERT_NV_INDEX_RSA = "0x01c00002"
SOCKET_WAIT_SECONDS = 10.0
UNIX_PATH_MAX = 107


def tpm_dir(paths: LabPaths, name: str) -> Path:
    return paths.node_dir(name) / "tpm"


def tpm_state_dir(paths: LabPaths, name: str) -> Path:
    return paths.node_dir(name) / "tpm-state"


def socket_path(paths: LabPaths, name: str) -> Path:
    return tpm_dir(paths, name) / "swtpm.sock"


def host_tcti(paths: LabPaths, name: str) -> str:
    return f"swtpm:path={socket_path(paths, name)}"


def write_ca_config(paths: LabPaths) -> Path:
    """Write the lab's swtpm_setup.conf and the swtpm_localca files it names; return the setup conf."""
    ca = paths.ca_dir
    ca.mkdir(parents=True, exist_ok=True)
    (ca / "swtpm-localca.conf").write_text(
        f"statedir = {ca}\n"
        f"signingkey = {ca}/signkey.pem\n"
        f"issuercert = {ca}/issuercert.pem\n"
        f"certserial = {ca}/certserial\n"
    )
    (ca / "swtpm-localca.options").write_text(
        "--platform-manufacturer confidential-kubernetes-lab\n--platform-version 2.1\n--platform-model cklab\n"
    )
    setup_conf = ca / "swtpm_setup.conf"
    setup_conf.write_text(
        "create_certs_tool = /usr/bin/swtpm_localca\n"
        f"create_certs_tool_config = {ca}/swtpm-localca.conf\n"
        f"create_certs_tool_options = {ca}/swtpm-localca.options\n"
        "active_pcr_banks = sha256\n"
    )
    return setup_conf


def ca_exists(paths: LabPaths) -> bool:
    return (paths.ca_dir / "issuercert.pem").is_file() and (paths.ca_dir / "swtpm-localca-rootca-cert.pem").is_file()


def export_ek_ca(paths: LabPaths) -> Path:
    """ek-ca.pem: the lab root CA and the intermediate that signs EK certificates."""
    root = (paths.ca_dir / "swtpm-localca-rootca-cert.pem").read_text()
    intermediate = (paths.ca_dir / "issuercert.pem").read_text()
    paths.ek_ca.write_text(root.rstrip("\n") + "\n" + intermediate.rstrip("\n") + "\n")
    return paths.ek_ca


def manufacture(paths: LabPaths, name: str, setup_conf: Path) -> None:
    """Give the node a TPM with RSA and ECC EKs, their certificates and a platform certificate, once."""
    state = tpm_state_dir(paths, name)
    if (state / "tpm2-00.permall").is_file():
        return
    state.mkdir(parents=True, exist_ok=True)
    run(
        [
            "swtpm_setup",
            "--tpm2",
            "--tpmstate",
            state,
            "--create-ek-cert",
            "--create-platform-cert",
            "--lock-nvram",
            "--config",
            setup_conf,
            "--vmid",
            name,
            "--overwrite",
        ],
        env={"XDG_CONFIG_HOME": str(paths.ca_dir)},
        timeout=120,
        what=f"swtpm_setup for {name}",
    )


def start(paths: LabPaths, name: str) -> int:
    """Start the node's swtpm (TPM2_Startup done by swtpm itself); return its pid."""
    directory = tpm_dir(paths, name)
    directory.mkdir(parents=True, exist_ok=True)
    sock = socket_path(paths, name)
    if len(f"{sock}.ctrl".encode()) > UNIX_PATH_MAX:
        raise LabError(f"CK_LAB_DIR is too long: the TPM socket path {sock}.ctrl exceeds {UNIX_PATH_MAX} bytes")
    for stale in (sock, Path(f"{sock}.ctrl")):
        stale.unlink(missing_ok=True)
    pid_file = paths.node_dir(name) / "swtpm.pid"
    pid_file.unlink(missing_ok=True)
    log = open(paths.node_dir(name) / "swtpm.log", "ab")
    try:
        process = subprocess.Popen(
            [
                "swtpm",
                "socket",
                "--tpm2",
                "--tpmstate",
                f"dir={tpm_state_dir(paths, name)}",
                "--server",
                f"type=unixio,path={sock}",
                "--ctrl",
                f"type=unixio,path={sock}.ctrl",
                "--flags",
                "not-need-init,startup-clear",
                "--pid",
                f"file={pid_file}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    finally:
        log.close()
    deadline = time.monotonic() + SOCKET_WAIT_SECONDS
    while not (accepts_connections(Path(f"{sock}.ctrl")) and accepts_connections(sock)):
        if process.poll() is not None:
            raise LabError(f"swtpm of {name} exited with {process.returncode}; see {paths.node_dir(name)}/swtpm.log")
        if time.monotonic() > deadline:
            raise LabError(f"swtpm of {name} made no socket within {SOCKET_WAIT_SECONDS:.0f} s")
        time.sleep(0.02)
    return process.pid


def accepts_connections(path: Path) -> bool:
    """Whether swtpm listens on this socket yet (it exists before listen() is called)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def extend_events(paths: LabPaths, name: str, events: list[BootEvent]) -> None:
    env = {"TPM2TOOLS_TCTI": host_tcti(paths, name)}
    for event in events:
        run(
            ["tpm2_pcrextend", f"{event.pcr}:sha256={event.digest}"],
            env=env,
            timeout=30,
            what=f"tpm2_pcrextend of PCR {event.pcr} on {name}",
        )


def read_pcrs(paths: LabPaths, name: str, pcrs: tuple[int, ...]) -> dict[int, str]:
    """Current SHA-256 PCR values (hex) of a node's TPM."""
    out = run(
        ["tpm2_pcrread", "sha256:" + ",".join(str(p) for p in pcrs)],
        env={"TPM2TOOLS_TCTI": host_tcti(paths, name)},
        timeout=30,
        what=f"tpm2_pcrread on {name}",
    )
    return parse_pcrread(out)


def parse_pcrread(text: str) -> dict[int, str]:
    """Parse tpm2_pcrread output lines like '    8 : 0xABCD...'."""
    values: dict[int, str] = {}
    for match in re.finditer(r"^\s*(\d+)\s*:\s*0x([0-9A-Fa-f]+)\s*$", text, re.MULTILINE):
        values[int(match.group(1))] = match.group(2).lower()
    return values


def verify_ek_certificate(paths: LabPaths, name: str) -> None:
    """Read the RSA EK certificate from NV and check that it chains to ek-ca.pem."""
    der = paths.node_dir(name) / "ek-rsa.der"
    run(
        ["tpm2_nvread", EK_CERT_NV_INDEX_RSA, "-C", "o", "-o", der],
        env={"TPM2TOOLS_TCTI": host_tcti(paths, name)},
        timeout=30,
        what=f"tpm2_nvread of the EK certificate on {name}",
    )
    pem = paths.node_dir(name) / "ek-rsa.pem"
    run(["openssl", "x509", "-inform", "DER", "-in", der, "-out", pem], what="openssl x509")
    root = paths.ca_dir / "swtpm-localca-rootca-cert.pem"
    intermediate = paths.ca_dir / "issuercert.pem"
    out = run(
        ["openssl", "verify", "-CAfile", root, "-untrusted", intermediate, pem],
        what=f"openssl verify of the EK certificate of {name}",
    )
    if not out.strip().endswith("OK"):
        raise LabError(f"the EK certificate of {name} does not chain to {paths.ek_ca}")
