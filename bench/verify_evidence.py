"""Benchmark of evidence verification: Verifier.verify on one real swtpm quote, against the floor
(a bare ECDSA-P256 verify of the same quote) and Keylime's checkquote on the same quote.

Run: .venv/bin/python bench/verify_evidence.py [--runs N] [--keylime-venv PATH] [--figures FILE]
Starts its own swtpm (stopped by pid on exit). Keylime 7.14.3 goes into its own venv
(default /tmp/keylime-venv), never into the project's; if it cannot be installed the
Keylime row says why. Targets: verify within 2x the floor, faster than Keylime.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KEYLIME_VERSION = "7.14.3"
POLICY_PCRS = (0, 4, 8, 9, 15)
WARMUP = 50


sys.path.insert(0, str(REPO / "tests"))
from testenv import unit_conftest  # noqa: E402

conftest = unit_conftest()

import _figures  # noqa: E402

from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import issuer, tpm2  # noqa: E402
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.evidence import qualifying_data  # noqa: E402
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.policy import MeasurementPolicy, PcrRule  # noqa: E402
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.verifier import Verifier  # noqa: E402
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.seal import EphemeralKey  # noqa: E402

# Runs in the Keylime venv: times keylime.tpm.tpm_util.checkquote on the quote given on stdin.
KEYLIME_TIMER = r"""
import gc, json, statistics, sys, time
from keylime.tpm import tpm_util
job = json.load(sys.stdin)
args = (job["aik_pem"].encode(), bytes.fromhex(job["nonce"]), bytes.fromhex(job["sigblob"]),
        bytes.fromhex(job["quoteblob"]), bytes.fromhex(job["pcrblob"]), "sha256")
pcrs = tpm_util.checkquote(*args)
assert len(pcrs) == 24, pcrs
for _ in range(job["warmup"]):
    tpm_util.checkquote(*args)
times = []
gc.disable()
for _ in range(job["runs"]):
    start = time.perf_counter_ns()
    tpm_util.checkquote(*args)
    times.append(time.perf_counter_ns() - start)
gc.enable()
print(json.dumps({"times": times}))
"""


def timed(call, runs: int) -> list[int]:
    for dummy in range(WARMUP):
        call()
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


def tpm2_tools_pcrblob(bank_alg: int, values: dict[int, bytes]) -> bytes:
    """PCR values in the in-memory layout of tpm2-tools' `tpm2_quote -o`, which checkquote parses.

    TPML_PCR_SELECTION (little-endian, 16 entries of 8 bytes), then the count of TPML_DIGESTs,
    each a u32 count and 8 TPM2B_DIGESTs padded to the 64-byte TPMU_HA.
    """
    bitmap = sum(1 << i for i in values).to_bytes(3, "little")
    selection = struct.pack("<I", 1) + struct.pack("<HB", bank_alg, 3) + bitmap + b"\x00\x00"
    selection += (struct.pack("<HB", 0, 0) + bytes(5)) * 15
    ordered = [values[i] for i in sorted(values)]
    chunks = [ordered[i:i + 8] for i in range(0, len(ordered), 8)]
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
    probe = [str(python), "-c", f"import keylime.tpm.tpm_util, importlib.metadata as m; assert m.version('keylime') == '{KEYLIME_VERSION}'"]
    if python.exists() and subprocess.run(probe, capture_output=True, check=False).returncode == 0:
        return python, ""
    try:
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=120)
        # The wheel declares no dependencies; checkquote needs cryptography, and keylime.config PyYAML.
        install = subprocess.run([str(python), "-m", "pip", "install", "--quiet", f"keylime=={KEYLIME_VERSION}", "cryptography", "pyyaml"],
                                 capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"cannot make the venv {venv}: {exc}"
    if install.returncode != 0:
        return None, (install.stderr.strip().splitlines() or ["pip failed"])[-1]
    check = subprocess.run(probe, capture_output=True, text=True, check=False)
    if check.returncode != 0:
        return None, (check.stderr.strip().splitlines() or ["import failed"])[-1]
    return python, ""


def keylime_times(python: Path, evidence, nonce: bytes, runs: int) -> list[int]:
    ak = tpm2.parse_public(evidence.ak_public).public_key()
    job = {
        "aik_pem": ak.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode(),
        "nonce": qualifying_data(nonce, evidence.user_data).hex(),
        "sigblob": evidence.signature.hex(),
        "quoteblob": evidence.quote.hex(),
        "pcrblob": tpm2_tools_pcrblob(tpm2.ALG_SHA256, evidence.pcrs["sha256"]).hex(),
        "runs": runs,
        "warmup": WARMUP,
    }
    done = subprocess.run([str(python), "-c", KEYLIME_TIMER], input=json.dumps(job), capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        raise RuntimeError((done.stderr.strip().splitlines() or ["no output"])[-1])
    return json.loads(done.stdout.strip().splitlines()[-1])["times"]


def produce_evidence(workdir: Path):
    """One quote of all sha256 PCRs from a fresh swtpm; the swtpm is stopped before returning."""
    manufactured = conftest.ManufacturedTpm(workdir / "tpm", workdir / "ca")
    swtpm = conftest.SwtpmInstance(manufactured)
    try:
        nonce = os.urandom(32)
        with issuer.Tpm(swtpm.tcti) as tpm:
            evidence = issuer.issue_evidence(tpm, nonce, EphemeralKey.generate().public_bytes(), include_ek=False)
    finally:
        swtpm.stop()
    return nonce, evidence


def summary(times: list[int]) -> tuple[float, float, float]:
    return statistics.median(times) / 1000, min(times) / 1000, max(times) / 1000


def main() -> int:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--runs", type=int, default=2000)
    options.add_argument("--keylime-venv", type=Path, default=Path("/tmp/keylime-venv"))
    _figures.add_option(options)
    args = options.parse_args()
    # SIGTERM must run the finally blocks that stop swtpm.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    with tempfile.TemporaryDirectory(prefix="ck-bench-verify-") as workdir:
        nonce, evidence = produce_evidence(Path(workdir))
    document = evidence.to_json()
    values = evidence.pcrs["sha256"]
    policy = MeasurementPolicy("sha256", {i: PcrRule(i, (values[i],)) for i in POLICY_PCRS}, "pcrs-only")
    verifier = Verifier(policy)
    assert verifier.verify(document, nonce).to_result()["verified"] is True

    ak = tpm2.parse_public(evidence.ak_public).public_key()
    signature = tpm2.parse_signature(evidence.signature).der_or_raw
    ecdsa = ec.ECDSA(hashes.SHA256())
    ak.verify(signature, evidence.quote, ecdsa)

    verify_json = summary(timed(lambda: verifier.verify(document, nonce), args.runs))
    # Like checkquote, which gets decoded blobs: the same checks without JSON and base64 decoding.
    verify_decoded = summary(timed(lambda: verifier.verify(evidence, nonce), args.runs))
    floor = summary(timed(lambda: ak.verify(signature, evidence.quote, ecdsa), args.runs))
    rows = [
        ("Verifier.verify (JSON document)", verify_json),
        ("Verifier.verify (decoded Evidence)", verify_decoded),
        ("floor: ECDSA-P256 verify of the quote", floor),
    ]
    python, reason = keylime_python(args.keylime_venv)
    keylime = None
    if python is None:
        print(f"keylime: not installable here ({reason})")
    else:
        try:
            keylime = summary(keylime_times(python, evidence, nonce, args.runs))
            rows.append((f"Keylime {KEYLIME_VERSION} tpm_util.checkquote", keylime))
        except (RuntimeError, subprocess.SubprocessError, ValueError) as exc:
            print(f"keylime: checkquote failed on this quote ({exc})")

    print(f"\n{len(document)}-byte evidence document, quote of 24 sha256 PCRs, policy on PCRs {', '.join(map(str, POLICY_PCRS))},"
          f" ak_trust pcrs-only; {args.runs} runs each, gc off while timing\n")
    print(f"{'':40} {'median us':>10} {'min us':>9} {'max us':>9}")
    for name, (median, low, high) in rows:
        print(f"{name:40} {median:10.1f} {low:9.1f} {high:9.1f}")
    ratio = verify_json[0] / floor[0]
    print(f"\nverify / floor   = {ratio:5.2f}x   (target <= 2x: {'met' if ratio <= 2 else 'MISSED'};"
          f" decoded Evidence: {verify_decoded[0] / floor[0]:.2f}x)")
    figures = [
        _figures.figure("verify_evidence", "Verifier.verify, JSON document (median)", round(verify_json[0], 1), "us"),
        _figures.figure("verify_evidence", "floor: ECDSA-P256 verify of the quote (median)", round(floor[0], 1), "us"),
        _figures.figure("verify_evidence", "verify / floor", round(ratio, 2), "x", "<= 2x", ratio <= 2),
    ]
    if keylime is not None:
        speedup = keylime[0] / verify_json[0]
        print(f"keylime / verify = {speedup:5.2f}x   (target > 1x: {'met' if speedup > 1 else 'MISSED'};"
              f" decoded Evidence, checkquote's own inputs: {keylime[0] / verify_decoded[0]:.2f}x)")
        figures += [
            _figures.figure("verify_evidence", f"Keylime {KEYLIME_VERSION} checkquote (median)", round(keylime[0], 1), "us"),
            _figures.figure("verify_evidence", "Keylime checkquote / verify", round(speedup, 2), "x", "> 1x", speedup > 1),
        ]
    else:
        figures.append(_figures.figure("verify_evidence", f"Keylime {KEYLIME_VERSION} checkquote: not measured ({reason or 'failed'})",
                                       None, "us"))
    _figures.write(args.figures, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
