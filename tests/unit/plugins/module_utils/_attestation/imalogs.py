"""IMA measurement lists built by the tests (the kernel's binary format and its ASCII rendering), the PCRs they
extend, and Keylime 7.14.3 as the oracle: its own ``keylime.ima.ima.process_measurement_list`` run in its own venv
(never the project's), on the same list (as the ASCII lines Keylime's agent sends) and the same policy.

The replay here is written apart from ima.py's, from the kernel's rules, so that the two can disagree.
"""

from __future__ import annotations

import datetime
import fcntl
import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

KEYLIME_VERSION = "7.14.3"
# CK_KEYLIME_VENV puts it elsewhere (a path where it cannot be made shows the tests' skip)
KEYLIME_VENV = Path(os.environ.get("CK_KEYLIME_VENV", "/tmp/keylime-venv"))
# The wheel declares no dependencies; keylime.ima.ima and keylime-policy import these (gpg only for DSSE signing:
# stubbed below).
KEYLIME_PACKAGES = (
    f"keylime=={KEYLIME_VERSION}",
    "cryptography",
    "pyyaml",
    "jsonschema",
    "lark",
    "packaging",
    "psutil",
    "sqlalchemy",
    "pyasn1",
    "pyasn1-modules",
    "tornado",
)


class Measurement(NamedTuple):
    template: str
    path: str
    digest: bytes
    algorithm: str = "sha256"
    extra: bytes = b""
    violation: bool = False

    def fields(self) -> list[bytes]:
        fields = [
            self.algorithm.encode() + b":\x00" + self.digest,
            self.path.encode("utf-8", "surrogateescape") + b"\x00",
        ]
        if self.template != "ima-ng":
            fields.append(self.extra)
        return fields

    def data(self) -> bytes:
        return b"".join(struct.pack("<I", len(f)) + f for f in self.fields())

    def template_hash(self, algorithm: str = "sha1") -> bytes:
        size = hashlib.new(algorithm).digest_size
        return bytes(size) if self.violation else hashlib.new(algorithm, self.data()).digest()


def file_entry(path: str, content: bytes, template: str = "ima-ng") -> Measurement:
    return Measurement(template, path, hashlib.sha256(content).digest())


def binary(
    measurements: list[Measurement], template_hash_alg: str = "sha1", hashes: list[bytes] | None = None
) -> bytes:
    """The binary list; ``hashes`` overrides the template hashes (a test that flips data keeps the old hash)."""
    out = []
    for number, m in enumerate(measurements):
        name = m.template.encode()
        data = m.data()
        th = hashes[number] if hashes else m.template_hash(template_hash_alg)
        out.append(
            struct.pack("<I", 10) + th + struct.pack("<I", len(name)) + name + struct.pack("<I", len(data)) + data
        )
    return b"".join(out)


def ascii_lines(measurements: list[Measurement], hashes: list[bytes] | None = None) -> list[str]:
    """``ascii_runtime_measurements``: PCR, template hash, template, then the fields (an empty sig leaves a space)."""
    lines = []
    for number, m in enumerate(measurements):
        th = hashes[number] if hashes else m.template_hash()
        line = f"10 {th.hex()} {m.template} {m.algorithm}:{m.digest.hex()} {m.path}"
        if m.template != "ima-ng":
            line += f" {m.extra.hex()}"
        lines.append(line)
    return lines


def pcr10(measurements: list[Measurement], bank: str, start: bytes | None = None) -> bytes:
    """PCR 10 after the kernel extended these: the template data's hash in the bank, 0xFF..FF for a violation."""
    size = hashlib.new(bank).digest_size
    value = bytes(size) if start is None else start
    for m in measurements:
        extend = b"\xff" * size if m.violation else hashlib.new(bank, m.data()).digest()
        value = hashlib.new(bank, value + extend).digest()
    return value


def boot_pcrs(bank: str) -> dict[int, bytes]:
    return {i: hashlib.new(bank, f"pcr {i} {bank}".encode()).digest() for i in range(10)}


def boot_aggregate(bank: str = "sha256") -> Measurement:
    pcrs = boot_pcrs(bank)
    count = 8 if bank == "sha1" else 10
    digest = hashlib.new(bank, b"".join(pcrs[i] for i in range(count))).digest()
    return Measurement("ima-ng", "boot_aggregate", digest, bank)


def keyring_certificate() -> bytes:
    """A real DER X.509 certificate, as the kernel logs a key added to the .ima keyring."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ima test key")])
    now = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=365))
        .sign(key, hashes.SHA256())
    )
    return certificate.public_bytes(serialization.Encoding.DER)


def keyring_entry(keyring: str, certificate: bytes) -> Measurement:
    return Measurement("ima-buf", keyring, hashlib.sha256(certificate).digest(), extra=certificate)


def keylime_policy(digests: dict[str, list[str]], excludes=(), keyrings=None, ignored_keyrings=()) -> dict:
    """A runtime policy as ``keylime-policy create runtime`` writes it."""
    return {
        "meta": {"version": 1, "generator": 3, "timestamp": "2026-01-01 00:00:00"},
        "release": 0,
        "digests": digests,
        "excludes": list(excludes),
        "keyrings": dict(keyrings or {}),
        "ima": {"ignored_keyrings": list(ignored_keyrings), "log_hash_alg": "sha1", "dm_policy": None},
        "ima-buf": {},
        "verification-keys": "",
    }


def keylime_python(venv: Path = KEYLIME_VENV) -> tuple[Path | None, str]:
    """The Keylime venv's interpreter, installing keylime there if needed (as bench/verify_evidence.py does, with
    the modules keylime.ima.ima imports); or None and the reason."""
    python = venv / "bin" / "python"
    # pytest-xdist workers (and a benchmark beside them) may make the venv at the same time: one at a time
    try:
        venv.parent.mkdir(parents=True, exist_ok=True)
        lock = open(venv.parent / f".{venv.name}.lock", "w")
    except OSError as exc:
        return None, f"cannot make the venv {venv}: {exc}"
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _keylime_python(venv, python)


def _keylime_python(venv: Path, python: Path) -> tuple[Path | None, str]:
    probe = [
        str(python),
        "-c",
        "import sys, types; sys.modules['gpg'] = types.ModuleType('gpg'); import keylime.ima.ima, keylime.cmd.keylime_policy, "
        f"importlib.metadata as m; assert m.version('keylime') == '{KEYLIME_VERSION}'",
    ]
    if python.exists() and subprocess.run(probe, capture_output=True, check=False, cwd="/").returncode == 0:
        return python, ""
    try:
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=120)
        install = subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", *KEYLIME_PACKAGES],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"cannot make the venv {venv}: {exc}"
    if install.returncode != 0:
        return None, (install.stderr.strip().splitlines() or ["pip failed"])[-1]
    check = subprocess.run(probe, capture_output=True, text=True, check=False, cwd="/")
    if check.returncode != 0:
        return None, (check.stderr.strip().splitlines() or ["import failed"])[-1]
    return python, ""


# Runs in the Keylime venv. stdin: a JSON list of checks, each {"lines", "policy", "pcr", "bank", "boot_aggregates",
# optionally "then": [{"lines", "pcr"}, ...] continued incrementally with one AgentAttestState}; stdout: per check the
# list of results {"ok", "events": [event ids], "contexts": [...], "next": next_ima_ml_entry}.
KEYLIME_ORACLE = r"""
import json, logging, sys, types
sys.modules.setdefault("gpg", types.ModuleType("gpg"))
logging.disable(logging.CRITICAL)
from keylime.agentstates import AgentAttestState
from keylime.common.algorithms import Hash
from keylime.ima import ima

def run(state, job, step):
    _, failure = ima.process_measurement_list(
        state, step["lines"], json.loads(json.dumps(job["policy"])), pcrval=step["pcr"],
        boot_aggregates=job.get("boot_aggregates"), hash_alg=Hash(job["bank"]))
    return {"ok": not failure, "events": failure.get_event_ids(), "contexts": [e.context for e in failure.events],
            "next": state.get_next_ima_ml_entry() if state is not None else None}

out = []
for job in json.load(sys.stdin):
    state = AgentAttestState("node") if job.get("then") is not None else None
    results = [run(state, job, job)]
    for step in job.get("then") or []:
        results.append(run(state, job, step))
    out.append(results)
print(json.dumps(out))
"""


def keylime_verdicts(python: Path, jobs: list[dict]) -> list[list[dict]]:
    done = subprocess.run(
        [str(python), "-c", KEYLIME_ORACLE],
        input=json.dumps(jobs),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        cwd="/",
    )
    return json.loads(done.stdout)


def keylime_create_policy(python: Path, workdir: Path, measurements: list[Measurement], *arguments: str) -> str:
    """What Keylime's own ``keylime-policy create runtime --ima-measurement-list`` writes for a golden list."""
    measurement_list = workdir / "ascii_runtime_measurements"
    measurement_list.write_text("\n".join(ascii_lines(measurements)) + "\n")
    output = workdir / "policy.out"
    script = (
        "import sys, types; sys.modules['gpg'] = types.ModuleType('gpg'); "
        "from keylime.cmd.keylime_policy import main; sys.argv = ['keylime-policy'] + sys.argv[1:]; sys.exit(main())"
    )
    subprocess.run(
        [str(python), "-c", script, "create", "runtime", "--ima-measurement-list", str(measurement_list)]
        + list(arguments)
        + ["--output", str(output)],
        check=True,
        capture_output=True,
        timeout=120,
        cwd="/",
    )
    return output.read_text()
