"""Benchmark of evidence verification: Verifier.verify on real swtpm quotes, without and with a firmware event log,
against two floors and Keylime on the same quote (checkquote) and the same quote and log (its measured-boot check).

Two evidence documents come from one swtpm: a quote without an event log, and, after the TPM has been extended with
the events of a GCE-shaped firmware log (tests/.../eventlogs.gce_like_log: 105 events, about 39 KB, SHA-1 and
SHA-256; the event mix of a real GCE Shielded VM's log: Secure Boot variables with a 14 KB dbx, boot variables, the
GPT, shim/GRUB/kernel images, GRUB's commands, MOK lists), a quote with that log attached. The log evidence is timed
cold (the verifier's parsed-log cache emptied before every call: a log not seen before) and cached (the same node
sending the same log again).

Keylime's measured-boot check of the same quote and log, in the Keylime venv, with Keylime's own code: checkquote,
then keylime.mba.elparsing.tpm2_tools_elparser.bootlog_parse (the only parser Keylime has: it runs tpm2-tools'
`tpm2_eventlog` binary, Debian's tpm2-tools here, and loads libefivar.so.1 for tpm_bootlog_enrich; when the
library is not installed it is fetched with `apt-get download libefivar1` and unpacked next to the venv, never
installed), the measured-boot PCR comparison of keylime.tpm.tpm_main.Tpm.check_pcrs, and the "example"
measured-boot policy evaluated against a reference state made from this log by Keylime's own
keylime.policy.create_mb_policy (what `keylime-policy create measured-boot` writes). Keylime caches nothing, so its
figure is the same for a log it has seen.

The floors, both with the AK's key object built beforehand (it repeats from call to call):
- ECDSA: a bare ECDSA-P256 verify of the quote, the one step no verifier can skip;
- work: what any verifier of the JSON document has to do at the least: parse the JSON, decode every base64 field,
  DER-encode the signature, the ECDSA verify, SHA-256 of the user data and of the qualifying data, SHA-256 of the
  quoted PCRs, and compare the two with extraData and the PCR digest of the quote; no other check, no result.

Run: .venv/bin/python bench/verify_evidence.py [--runs N] [--rounds R] [--keylime-venv PATH] [--baseline REF] [--figures FILE]
Starts its own swtpm (stopped by pid on exit). Keylime 7.14.3 goes into its own venv (default /tmp/keylime-venv),
never into the project's; if it cannot be installed the Keylime row says why. The candidates are timed in R rounds,
each of N/R calls of every candidate in turn (Keylime in a process of its own that stays up between rounds), so that
a drift of this shared machine's speed hits all of them alike; the figures are medians over all calls.
--baseline REF times Verifier.verify of git ref REF too (its _attestation package extracted aside), in the same
rounds: before and after from one run.
Targets (issue 15 and 43, P1): without a log, verify of the JSON document <= 1.5x the ECDSA floor and <= 0.8x
Keylime's checkquote; with the log, cold, <= 0.5x Keylime's measured-boot check of the same quote and log.
"""

from __future__ import annotations

import argparse
import binascii
import gc
import hashlib
import hmac
import importlib
import io
import json
import os
import signal
import statistics
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KEYLIME_VERSION = "7.14.3"
POLICY_PCRS = (0, 4, 8, 9, 15)
WARMUP = 50
TARGET_FLOOR = 1.5
TARGET_KEYLIME = 0.8
TARGET_KEYLIME_LOG = 0.5
KEYLIME_LOG_RUNS = 60  # Keylime's log check runs a process and parses YAML: tens of ms a call


sys.path.insert(0, str(REPO / "tests"))
from testenv import unit_conftest  # noqa: E402

conftest = unit_conftest()
sys.path.insert(0, str(REPO / "tests" / "unit" / "plugins" / "module_utils" / "_attestation"))
import eventlogs  # noqa: E402

import _figures  # noqa: E402

from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature  # noqa: E402

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import (  # noqa: E402
    issuer,
    tpm2,
    tpm_variant,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.evidence import qualifying_data  # noqa: E402
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.policy import (
    MeasurementPolicy,
    PcrRule,
)  # noqa: E402
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.verifier import Verifier  # noqa: E402
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.seal import EphemeralKey  # noqa: E402

# Runs in the Keylime venv: sets up from the first stdin line (the quote, and the event log when given), then for each
# further line ("quote N" or "log N") prints the times of N calls of checkquote, or of checkquote and the measured-boot
# check of the log (see the module docstring).
KEYLIME_TIMER = r"""
import argparse, base64, gc, json, logging, sys, tempfile, time
logging.disable(logging.CRITICAL)  # tpm2_eventlog's warnings and the config notices would be logged on every call
from keylime.tpm import tpm_util
job = json.loads(sys.stdin.readline())
args = (job["aik_pem"].encode(), bytes.fromhex(job["nonce"]), bytes.fromhex(job["sigblob"]),
        bytes.fromhex(job["quoteblob"]), bytes.fromhex(job["pcrblob"]), "sha256")
pcrs = tpm_util.checkquote(*args)
assert len(pcrs) == 24, pcrs
log_check = None
if job.get("eventlog"):
    from keylime.mba.elchecking import policies
    from keylime.mba.elchecking import example  # registers the "example" policy
    from keylime.mba.elparsing import tpm2_tools_elparser
    from keylime.policy.create_mb_policy import create_mb_refstate
    log_args = (job["log_aik_pem"].encode(), bytes.fromhex(job["log_nonce"]), bytes.fromhex(job["log_sigblob"]),
                bytes.fromhex(job["log_quoteblob"]), bytes.fromhex(job["log_pcrblob"]), "sha256")
    eventlog_b64 = job["eventlog"]
    with tempfile.NamedTemporaryFile(suffix=".bin") as raw:
        raw.write(base64.b64decode(eventlog_b64))
        raw.flush()
        refstate = create_mb_refstate(argparse.Namespace(eventlog_file=raw.name, without_secureboot=False, output=raw.name + ".json"))
    if refstate is None:
        sys.exit("keylime-policy create measured-boot could not make a reference state from the log")
    policy = policies.get_policy("example")

    def log_check():
        quoted = tpm_util.checkquote(*log_args)
        mb_pcrs, _aggregates, mb_data, mb_failure = tpm2_tools_elparser.bootlog_parse(eventlog_b64, "sha256")
        if mb_failure:
            raise SystemExit(f"Keylime could not parse the log: {mb_failure.get_event_ids()}")
        # Tpm.check_pcrs: every measured-boot PCR of the policy that the quote has must equal the log's value.
        for pcr in policy.get_relevant_pcrs() & set(quoted):
            if hex(mb_pcrs.get(str(pcr), 0))[2:].lstrip("0") != quoted[pcr].lstrip("0"):
                raise SystemExit(f"Keylime: the log does not replay to PCR {pcr}")
        reason = policy.evaluate(refstate, mb_data)
        if reason:
            raise SystemExit(f"Keylime's measured-boot policy refuses the log: {reason}")

    log_check()
for _ in range(job["warmup"]):
    tpm_util.checkquote(*args)
print("ready", flush=True)
for line in sys.stdin:
    mode, runs = line.split()
    call = (lambda: tpm_util.checkquote(*args)) if mode == "quote" else log_check
    times = []
    gc.disable()
    for _ in range(int(runs)):
        start = time.perf_counter_ns()
        call()
        times.append(time.perf_counter_ns() - start)
    gc.enable()
    print(json.dumps(times), flush=True)
"""


def timed(call, runs: int) -> list[int]:
    times = []
    gc.disable()
    try:
        for dummy in range(runs):
            start = time.perf_counter_ns()
            call()
            times.append(time.perf_counter_ns() - start)
    finally:
        gc.enable()
    return times


def work_floor(key, nonce: bytes, document: str):
    """The least a verifier of the JSON document does (see the module docstring), as one call."""
    ecdsa = ec.ECDSA(hashes.SHA256())
    quoted = [str(index) for index in range(24)]

    def call() -> tuple[bool, bool]:
        fields = json.loads(document)
        for name in ("ak_public", "quote", "signature", "user_data"):
            fields[name] = binascii.a2b_base64(fields[name], strict_mode=True)
        pcrs = fields["pcrs"]["sha256"]
        values = [
            binascii.a2b_base64(pcrs[index], strict_mode=True) for index in quoted
        ]  # in the order of the selection
        raw = fields["signature"]  # TPMT_SIGNATURE: ECDSA, SHA-256, then r and s as TPM2B
        r_end = 6 + int.from_bytes(raw[4:6], "big")
        signature = encode_dss_signature(int.from_bytes(raw[6:r_end], "big"), int.from_bytes(raw[r_end + 2 :], "big"))
        quote = fields["quote"]
        key.verify(signature, quote, ecdsa)
        # TPMS_ATTEST: magic, type, qualifiedSigner, then extraData; the PCR digest (SHA-256) ends it.
        extra_start = 10 + int.from_bytes(quote[6:8], "big")
        extra_end = extra_start + int.from_bytes(quote[extra_start - 2 : extra_start], "big")
        return (
            hmac.compare_digest(
                quote[extra_start:extra_end],
                hashlib.sha256(nonce + hashlib.sha256(fields["user_data"]).digest()).digest(),
            ),
            hmac.compare_digest(quote[-32:], hashlib.sha256(b"".join(values)).digest()),
        )

    return call


def tpm2_tools_pcrblob(bank_alg: int, values: dict[int, bytes]) -> bytes:
    """PCR values in the in-memory layout of tpm2-tools' `tpm2_quote -o`, which checkquote parses.

    TPML_PCR_SELECTION (little-endian, 16 entries of 8 bytes), then the count of TPML_DIGESTs,
    each a u32 count and 8 TPM2B_DIGESTs padded to the 64-byte TPMU_HA.
    """
    bitmap = sum(1 << i for i in values).to_bytes(3, "little")
    selection = struct.pack("<I", 1) + struct.pack("<HB", bank_alg, 3) + bitmap + b"\x00\x00"
    selection += (struct.pack("<HB", 0, 0) + bytes(5)) * 15
    ordered = [values[i] for i in sorted(values)]
    chunks = [ordered[i : i + 8] for i in range(0, len(ordered), 8)]
    digests = struct.pack("<I", len(chunks))
    for chunk in chunks:
        digests += struct.pack("<I", len(chunk))
        for slot in range(8):
            value = chunk[slot] if slot < len(chunk) else b""
            digests += struct.pack("<H", len(value)) + value.ljust(64, b"\x00")
    return selection + digests


def keylime_python(venv: Path) -> tuple[Path | None, str]:
    """The Keylime venv's interpreter, installing keylime there if needed; or None and the reason."""
    python = venv / "bin" / "python"
    probe = [
        str(python),
        "-c",
        f"import keylime.tpm.tpm_util, importlib.metadata as m; assert m.version('keylime') == '{KEYLIME_VERSION}'",
    ]
    if python.exists() and subprocess.run(probe, capture_output=True, check=False).returncode == 0:
        return python, ""
    try:
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=120)
        # The wheel declares no dependencies; checkquote needs cryptography, and keylime.config PyYAML.
        install = subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", f"keylime=={KEYLIME_VERSION}", "cryptography", "pyyaml"],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"cannot make the venv {venv}: {exc}"
    if install.returncode != 0:
        return None, (install.stderr.strip().splitlines() or ["pip failed"])[-1]
    check = subprocess.run(probe, capture_output=True, text=True, check=False)
    if check.returncode != 0:
        return None, (check.stderr.strip().splitlines() or ["import failed"])[-1]
    return python, ""


def keylime_quote_job(prefix: str, evidence, nonce: bytes) -> dict:
    """checkquote's arguments for one evidence, as the Keylime timer reads them."""
    ak = tpm2.parse_public(evidence.ak_public).public_key()
    return {
        f"{prefix}aik_pem": ak.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ).decode(),
        f"{prefix}nonce": qualifying_data(nonce, evidence.user_data).hex(),
        f"{prefix}sigblob": evidence.signature.hex(),
        f"{prefix}quoteblob": evidence.quote.hex(),
        f"{prefix}pcrblob": tpm2_tools_pcrblob(tpm2.ALG_SHA256, evidence.pcrs["sha256"]).hex(),
    }


def libefivar_path(venv: Path) -> tuple[str | None, str]:
    """A directory for LD_LIBRARY_PATH holding libefivar.so.1 (Keylime's tpm_bootlog_enrich loads it), "" when the
    system has it; or None and the reason. Never installs it: `apt-get download` and `dpkg-deb -x` next to the venv."""
    ldconfig = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=False)
    if "libefivar.so.1 " in ldconfig.stdout:
        return "", ""
    root = venv / "libefivar1"
    found = sorted(root.glob("usr/lib/*/libefivar.so.1"))
    if not found:
        root.mkdir(parents=True, exist_ok=True)
        try:
            subprocess.run(
                ["apt-get", "download", "libefivar1"], cwd=root, capture_output=True, check=True, timeout=300
            )
            for deb in root.glob("libefivar1_*.deb"):
                subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], capture_output=True, check=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as exc:
            return None, f"libefivar.so.1 is not installed and apt-get download libefivar1 failed ({exc})"
        found = sorted(root.glob("usr/lib/*/libefivar.so.1"))
    if not found:
        return None, "libefivar.so.1 is not installed and the libefivar1 package holds none"
    return str(found[0].parent), ""


class KeylimeTimer:
    """checkquote, and the measured-boot check of a log, in the Keylime venv, in a process that stays up between rounds."""

    def __init__(self, python: Path, evidence, nonce: bytes, workdir: Path, evidence_log=None, library_path=None):
        job = dict(keylime_quote_job("", evidence, nonce), warmup=WARMUP)
        env = dict(os.environ)
        if evidence_log is not None:
            job.update(keylime_quote_job("log_", evidence_log, nonce))
            job["eventlog"] = binascii.b2a_base64(evidence_log.event_log, newline=False).decode()
            if library_path:
                env["LD_LIBRARY_PATH"] = ":".join(filter(None, (library_path, env.get("LD_LIBRARY_PATH"))))
        self.errors = workdir / "keylime.err"
        with open(self.errors, "wb") as errors:
            self.process = subprocess.Popen(
                [str(python), "-c", KEYLIME_TIMER],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errors,
                text=True,
                env=env,
            )
        self.process.stdin.write(json.dumps(job) + "\n")
        self.process.stdin.flush()
        self._read()

    def _read(self) -> str:
        line = self.process.stdout.readline()
        if not line:
            self.process.wait()
            raise RuntimeError((self.errors.read_text().strip().splitlines() or ["no output"])[-1])
        return line

    def __call__(self, runs: int, mode: str = "quote") -> list[int]:
        self.process.stdin.write(f"{mode} {runs}\n")
        self.process.stdin.flush()
        return json.loads(self._read())

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=30)
        self.process.stdout.close()


def baseline_package(ref: str, workdir: Path):
    """The _attestation package of git ref ``ref`` (with its module_utils siblings), extracted under ``workdir`` and
    imported by path: (policy module,
    verifier module, a function emptying its parsed-log cache)."""
    # The whole module_utils tree: _attestation imports its siblings (_crypto, ...) relatively.
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", ref, "plugins/module_utils"], capture_output=True, check=False
    )
    if archive.returncode != 0:
        raise RuntimeError((archive.stderr.decode().strip().splitlines() or ["git archive failed"])[-1])
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(workdir / "baseline", filter="data")
    package = workdir / "baseline" / "ck_baseline_module_utils"
    (workdir / "baseline" / "plugins" / "module_utils").rename(package)
    (package / "__init__.py").touch()
    sys.path.insert(0, str(package.parent))
    policy = importlib.import_module("ck_baseline_module_utils._attestation.policy")
    verifier = importlib.import_module("ck_baseline_module_utils._attestation.verifier")
    variant = importlib.import_module("ck_baseline_module_utils._attestation.tpm_variant")
    if hasattr(variant, "PARSED_EVENT_LOGS"):
        clear = variant.PARSED_EVENT_LOGS.clear
    elif hasattr(variant, "_parsed_event_log"):
        clear = variant._parsed_event_log.cache_clear
    else:
        raise RuntimeError(f"{ref} has no parsed-log cache this benchmark knows how to empty")
    return policy, verifier, clear


def baseline_verify(package, values: dict[int, bytes]):
    policy, verifier, _clear = package
    rules = {i: policy.PcrRule(i, (values[i],)) for i in POLICY_PCRS}
    return verifier.Verifier(policy.MeasurementPolicy("sha256", rules, "pcrs-only")).verify


def produce_evidence(workdir: Path):
    """From one fresh swtpm: a quote of all sha256 PCRs without an event log, then, after extending the events of a
    GCE-shaped firmware log into the TPM, a quote with that log; the swtpm is stopped before returning."""
    manufactured = conftest.ManufacturedTpm(workdir / "tpm", workdir / "ca")
    swtpm = conftest.SwtpmInstance(manufactured)
    log = eventlogs.gce_like_log()
    try:
        nonce = os.urandom(32)
        user_data = EphemeralKey.generate().public_bytes()
        with issuer.Tpm(swtpm.tcti) as tpm:
            evidence = issuer.issue_evidence(tpm, nonce, user_data, include_ek=False)
            eventlogs.extend_into(tpm, log)
            evidence_log = issuer.issue_evidence(tpm, nonce, user_data, include_ek=False, event_log=log)
    finally:
        swtpm.stop()
    return nonce, evidence, evidence_log


def verdict(met: bool) -> str:
    return "MET" if met else "MISSED"


def main() -> int:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--runs", type=int, default=3000, help="calls of each candidate (default 3000)")
    options.add_argument("--rounds", type=int, default=6, help="rounds the calls are spread over (default 6)")
    options.add_argument(
        "--keylime-log-runs",
        type=int,
        default=KEYLIME_LOG_RUNS,
        help=f"calls of Keylime's measured-boot check, spread over the rounds (default {KEYLIME_LOG_RUNS})",
    )
    options.add_argument("--keylime-venv", type=Path, default=Path("/tmp/keylime-venv"))
    options.add_argument("--baseline", metavar="REF", help="also time Verifier.verify of this git ref (e.g. main)")
    _figures.add_option(options)
    args = options.parse_args()
    # SIGTERM must run the finally blocks that stop swtpm and the Keylime process.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    with tempfile.TemporaryDirectory(prefix="ck-bench-verify-") as workdir:
        nonce, evidence, evidence_log = produce_evidence(Path(workdir))
        document = evidence.to_json()
        document_log = evidence_log.to_json()
        values = evidence.pcrs["sha256"]
        log_values = evidence_log.pcrs["sha256"]
        policy = MeasurementPolicy("sha256", {i: PcrRule(i, (values[i],)) for i in POLICY_PCRS}, "pcrs-only")
        policy_log = MeasurementPolicy("sha256", {i: PcrRule(i, (log_values[i],)) for i in POLICY_PCRS}, "pcrs-only")
        verifier = Verifier(policy)
        verifier_log = Verifier(policy_log)
        assert verifier.verify(document, nonce).to_result()["verified"] is True
        assert verifier_log.verify(document_log, nonce).to_result()["verified"] is True
        clear = tpm_variant.PARSED_EVENT_LOGS.clear
        ak = tpm2.parse_public(evidence.ak_public).public_key()
        signature = tpm2.parse_signature(evidence.signature).der_or_raw
        ecdsa = ec.ECDSA(hashes.SHA256())

        def cold(verify, empty, document):
            def call():
                empty()
                return verify(document, nonce)

            return call

        candidates = {
            "verify": lambda: verifier.verify(document, nonce),
            # Like checkquote, which gets decoded blobs: the same checks without JSON and base64 decoding.
            "verify decoded": lambda: verifier.verify(evidence, nonce),
            "ECDSA floor": lambda: ak.verify(signature, evidence.quote, ecdsa),
            "work floor": work_floor(ak, nonce, document),
            "log cold": cold(verifier_log.verify, clear, document_log),
            "log cached": lambda: verifier_log.verify(document_log, nonce),
        }
        assert candidates["work floor"]() == (True, True)
        notes = []
        if args.baseline:
            try:
                package = baseline_package(args.baseline, Path(workdir))
                baseline = baseline_verify(package, values)
                baseline_log = baseline_verify(package, log_values)
                assert baseline(document, nonce).to_result()["verified"] is True
                assert baseline_log(document_log, nonce).to_result()["verified"] is True
                candidates["baseline verify"] = lambda: baseline(document, nonce)
                candidates["baseline log cold"] = cold(baseline_log, package[2], document_log)
                candidates["baseline log cached"] = lambda: baseline_log(document_log, nonce)
            except (RuntimeError, ImportError, AssertionError, OSError) as exc:
                notes.append(f"baseline {args.baseline}: not measured ({exc})")
        python, reason = keylime_python(args.keylime_venv)
        keylime = None
        log_reason = ""
        library_path = None
        if python is None:
            notes.append(f"Keylime: not installable here ({reason})")
        else:
            library_path, log_reason = libefivar_path(args.keylime_venv)
            if library_path is None:
                notes.append(f"Keylime's measured-boot check: not measured ({log_reason})")
            try:
                keylime = KeylimeTimer(
                    python,
                    evidence,
                    nonce,
                    Path(workdir),
                    evidence_log if library_path is not None else None,
                    library_path,
                )
            except (RuntimeError, OSError, ValueError) as exc:
                reason = f"Keylime failed on this quote or log ({exc})"
                notes.append(f"Keylime: {reason}")
        times: dict[str, list[int]] = {name: [] for name in candidates}
        for call in candidates.values():
            for dummy in range(WARMUP):
                call()
        per_round = max(1, args.runs // args.rounds)
        keylime_log_per_round = max(1, args.keylime_log_runs // args.rounds)
        try:
            for dummy in range(args.rounds):
                for name, call in candidates.items():
                    times[name] += timed(call, per_round)
                if keylime is not None:
                    times.setdefault("Keylime", []).extend(keylime(per_round))
                    if library_path is not None:
                        times.setdefault("Keylime log", []).extend(keylime(keylime_log_per_round, "log"))
        finally:
            if keylime is not None:
                keylime.close()

    median = {name: statistics.median(values) / 1000 for name, values in times.items()}
    labels = {
        "verify": "Verifier.verify (JSON document)",
        "verify decoded": "Verifier.verify (decoded Evidence)",
        "baseline verify": f"Verifier.verify of {args.baseline} (JSON)",
        "ECDSA floor": "floor: ECDSA-P256 verify of the quote",
        "work floor": "floor: JSON+base64+ECDSA+SHA-256s",
        "Keylime": f"Keylime {KEYLIME_VERSION} tpm_util.checkquote",
        "log cold": "with log, cold: Verifier.verify (JSON)",
        "log cached": "with log, cached: Verifier.verify (JSON)",
        "baseline log cold": f"with log, cold: {args.baseline}",
        "baseline log cached": f"with log, cached: {args.baseline}",
        "Keylime log": f"with log: Keylime {KEYLIME_VERSION} quote + mb",
    }
    log = evidence_log.event_log
    print(
        f"\n{len(document)}-byte evidence document, quote of 24 sha256 PCRs, policy on PCRs {', '.join(map(str, POLICY_PCRS))},"
        f" ak_trust pcrs-only; with log: {len(document_log)}-byte document, a {len(log)}-byte firmware log of "
        f"{len(eventlogs.gce_like_events())} events (sha1, sha256); {per_round * args.rounds} calls each "
        f"(Keylime's log check {keylime_log_per_round * args.rounds}) in {args.rounds} rounds, gc off while timing\n"
    )
    print(f"{'':44} {'median us':>10} {'min us':>9} {'/ ECDSA':>8} {'/ Keylime':>10} {'/ KL+mb':>8}")
    for name in labels:
        if name in times:
            keylime_ratio = f"{median[name] / median['Keylime']:10.2f}" if "Keylime" in median else f"{'-':>10}"
            mb_ratio = f"{median[name] / median['Keylime log']:8.3f}" if "Keylime log" in median else f"{'-':>8}"
            print(
                f"{labels[name]:44} {median[name]:10.1f} {min(times[name]) / 1000:9.1f} {median[name] / median['ECDSA floor']:8.2f} "
                f"{keylime_ratio} {mb_ratio}"
            )
    for note in notes:
        print(note)

    floor_ratio = median["verify"] / median["ECDSA floor"]
    print(
        f"\nwithout a log: verify / ECDSA floor = {floor_ratio:5.2f}x   (target <= {TARGET_FLOOR}x: {verdict(floor_ratio <= TARGET_FLOOR)};"
        f" the work floor is {median['work floor'] / median['ECDSA floor']:.2f}x)"
    )
    figures = [
        _figures.figure("verify_evidence", "Verifier.verify, JSON document (median)", round(median["verify"], 1), "us"),
        _figures.figure(
            "verify_evidence", "floor: ECDSA-P256 verify of the quote (median)", round(median["ECDSA floor"], 1), "us"
        ),
        _figures.figure(
            "verify_evidence",
            "floor: JSON+base64+ECDSA+SHA-256s, no checks (median)",
            round(median["work floor"], 1),
            "us",
        ),
        _figures.figure(
            "verify_evidence",
            "verify / ECDSA floor",
            round(floor_ratio, 2),
            "x",
            f"<= {TARGET_FLOOR}x",
            floor_ratio <= TARGET_FLOOR,
        ),
        _figures.figure(
            "verify_evidence", "work floor / ECDSA floor", round(median["work floor"] / median["ECDSA floor"], 2), "x"
        ),
        _figures.figure(
            "verify_evidence",
            f"Verifier.verify with a {len(log)}-byte firmware log, cold (median)",
            round(median["log cold"], 1),
            "us",
        ),
        _figures.figure(
            "verify_evidence",
            f"Verifier.verify with a {len(log)}-byte firmware log, cached (median)",
            round(median["log cached"], 1),
            "us",
        ),
    ]
    for name, what in (
        ("baseline verify", "JSON document"),
        ("baseline log cold", "with log, cold"),
        ("baseline log cached", "with log, cached"),
    ):
        if name in median:
            figures.append(
                _figures.figure(
                    "verify_evidence",
                    f"Verifier.verify of {args.baseline}, {what} (median)",
                    round(median[name], 1),
                    "us",
                )
            )
    if "baseline verify" in median:
        figures.append(
            _figures.figure(
                "verify_evidence",
                f"Verifier.verify of {args.baseline} / ECDSA floor",
                round(median["baseline verify"] / median["ECDSA floor"], 2),
                "x",
            )
        )
    if "Keylime" in median:
        keylime_ratio = median["verify"] / median["Keylime"]
        print(
            f"without a log: verify / Keylime     = {keylime_ratio:5.2f}x   (target <= {TARGET_KEYLIME}x: {verdict(keylime_ratio <= TARGET_KEYLIME)};"
            f" the work floor is {median['work floor'] / median['Keylime']:.2f}x, decoded Evidence {median['verify decoded'] / median['Keylime']:.2f}x)"
        )
        figures += [
            _figures.figure(
                "verify_evidence", f"Keylime {KEYLIME_VERSION} checkquote (median)", round(median["Keylime"], 1), "us"
            ),
            _figures.figure(
                "verify_evidence",
                "verify / Keylime checkquote",
                round(keylime_ratio, 2),
                "x",
                f"<= {TARGET_KEYLIME}x",
                keylime_ratio <= TARGET_KEYLIME,
            ),
            _figures.figure(
                "verify_evidence",
                "work floor / Keylime checkquote",
                round(median["work floor"] / median["Keylime"], 2),
                "x",
            ),
        ]
        if "baseline verify" in median:
            figures.append(
                _figures.figure(
                    "verify_evidence",
                    f"Verifier.verify of {args.baseline} / Keylime checkquote",
                    round(median["baseline verify"] / median["Keylime"], 2),
                    "x",
                )
            )
    else:
        figures.append(
            _figures.figure(
                "verify_evidence",
                f"Keylime {KEYLIME_VERSION} checkquote: not measured ({reason or 'failed'})",
                None,
                "us",
                f"verify <= {TARGET_KEYLIME}x Keylime",
                False,
            )
        )
    if "Keylime log" in median:
        cold_ratio = median["log cold"] / median["Keylime log"]
        print(
            f"with the log, cold: verify / Keylime's quote + measured-boot check = {cold_ratio:6.3f}x   (target <= "
            f"{TARGET_KEYLIME_LOG}x: {verdict(cold_ratio <= TARGET_KEYLIME_LOG)}; cached "
            f"{median['log cached'] / median['Keylime log']:.3f}x; Keylime {median['Keylime log'] / 1000:.1f} ms a call)"
        )
        figures += [
            _figures.figure(
                "verify_evidence",
                f"Keylime {KEYLIME_VERSION} checkquote + measured-boot check of the log (median)",
                round(median["Keylime log"], 1),
                "us",
            ),
            _figures.figure(
                "verify_evidence",
                "verify with log, cold / Keylime quote + measured boot",
                round(cold_ratio, 3),
                "x",
                f"<= {TARGET_KEYLIME_LOG}x",
                cold_ratio <= TARGET_KEYLIME_LOG,
            ),
            _figures.figure(
                "verify_evidence",
                "verify with log, cached / Keylime quote + measured boot",
                round(median["log cached"] / median["Keylime log"], 3),
                "x",
            ),
        ]
    else:
        figures.append(
            _figures.figure(
                "verify_evidence",
                f"Keylime {KEYLIME_VERSION} measured-boot check: not measured ({log_reason or reason or 'failed'})",
                None,
                "us",
                f"verify with log, cold <= {TARGET_KEYLIME_LOG}x Keylime",
                False,
            )
        )
    _figures.write(args.figures, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
