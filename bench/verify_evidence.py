"""Benchmark of evidence verification: Verifier.verify on one real swtpm quote, against two floors and Keylime's
checkquote on the same quote.

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
Targets (issue 15, P1): verify of the JSON document <= 1.5x the ECDSA floor and <= 0.8x Keylime's checkquote.
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


sys.path.insert(0, str(REPO / "tests"))
from testenv import unit_conftest  # noqa: E402

conftest = unit_conftest()

import _figures  # noqa: E402

from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature  # noqa: E402

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import issuer, tpm2  # noqa: E402
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.evidence import qualifying_data  # noqa: E402
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.policy import (
    MeasurementPolicy,
    PcrRule,
)  # noqa: E402
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.verifier import Verifier  # noqa: E402
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.seal import EphemeralKey  # noqa: E402

# Runs in the Keylime venv: times keylime.tpm.tpm_util.checkquote on the quote of the first stdin line, then for each
# further line (a number of calls) prints the times of that many calls.
KEYLIME_TIMER = r"""
import gc, json, sys, time
from keylime.tpm import tpm_util
job = json.loads(sys.stdin.readline())
args = (job["aik_pem"].encode(), bytes.fromhex(job["nonce"]), bytes.fromhex(job["sigblob"]),
        bytes.fromhex(job["quoteblob"]), bytes.fromhex(job["pcrblob"]), "sha256")
pcrs = tpm_util.checkquote(*args)
assert len(pcrs) == 24, pcrs
for _ in range(job["warmup"]):
    tpm_util.checkquote(*args)
print("ready", flush=True)
for line in sys.stdin:
    times = []
    gc.disable()
    for _ in range(int(line)):
        start = time.perf_counter_ns()
        tpm_util.checkquote(*args)
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


class KeylimeTimer:
    """checkquote in the Keylime venv, in a process that stays up between rounds."""

    def __init__(self, python: Path, evidence, nonce: bytes, workdir: Path):
        ak = tpm2.parse_public(evidence.ak_public).public_key()
        job = {
            "aik_pem": ak.public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ).decode(),
            "nonce": qualifying_data(nonce, evidence.user_data).hex(),
            "sigblob": evidence.signature.hex(),
            "quoteblob": evidence.quote.hex(),
            "pcrblob": tpm2_tools_pcrblob(tpm2.ALG_SHA256, evidence.pcrs["sha256"]).hex(),
            "warmup": WARMUP,
        }
        self.errors = workdir / "keylime.err"
        with open(self.errors, "wb") as errors:
            self.process = subprocess.Popen(
                [str(python), "-c", KEYLIME_TIMER],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errors,
                text=True,
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

    def __call__(self, runs: int) -> list[int]:
        self.process.stdin.write(f"{runs}\n")
        self.process.stdin.flush()
        return json.loads(self._read())

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=30)
        self.process.stdout.close()


def baseline_verify(ref: str, workdir: Path, values: dict[int, bytes]):
    """Verifier.verify of git ref ``ref``: its _attestation package extracted under ``workdir`` and imported by path."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", ref, "plugins/module_utils/_attestation"], capture_output=True, check=False
    )
    if archive.returncode != 0:
        raise RuntimeError((archive.stderr.decode().strip().splitlines() or ["git archive failed"])[-1])
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(workdir / "baseline", filter="data")
    package = workdir / "baseline" / "ck_baseline_attestation"
    (workdir / "baseline" / "plugins" / "module_utils" / "_attestation").rename(package)
    sys.path.insert(0, str(package.parent))
    policy = importlib.import_module("ck_baseline_attestation.policy")
    verifier = importlib.import_module("ck_baseline_attestation.verifier")
    rules = {i: policy.PcrRule(i, (values[i],)) for i in POLICY_PCRS}
    return verifier.Verifier(policy.MeasurementPolicy("sha256", rules, "pcrs-only")).verify


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


def main() -> int:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--runs", type=int, default=3000, help="calls of each candidate (default 3000)")
    options.add_argument("--rounds", type=int, default=6, help="rounds the calls are spread over (default 6)")
    options.add_argument("--keylime-venv", type=Path, default=Path("/tmp/keylime-venv"))
    options.add_argument("--baseline", metavar="REF", help="also time Verifier.verify of this git ref (e.g. main)")
    _figures.add_option(options)
    args = options.parse_args()
    # SIGTERM must run the finally blocks that stop swtpm and the Keylime process.
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
        candidates = {
            "verify": lambda: verifier.verify(document, nonce),
            # Like checkquote, which gets decoded blobs: the same checks without JSON and base64 decoding.
            "verify decoded": lambda: verifier.verify(evidence, nonce),
            "ECDSA floor": lambda: ak.verify(signature, evidence.quote, ecdsa),
            "work floor": work_floor(ak, nonce, document),
        }
        assert candidates["work floor"]() == (True, True)
        notes = []
        if args.baseline:
            try:
                baseline = baseline_verify(args.baseline, Path(workdir), values)
                assert baseline(document, nonce).to_result()["verified"] is True
                candidates["baseline verify"] = lambda: baseline(document, nonce)
            except (RuntimeError, ImportError, AssertionError, OSError) as exc:
                notes.append(f"baseline {args.baseline}: not measured ({exc})")
        python, reason = keylime_python(args.keylime_venv)
        keylime = None
        if python is None:
            notes.append(f"Keylime: not installable here ({reason})")
        else:
            try:
                keylime = KeylimeTimer(python, evidence, nonce, Path(workdir))
            except (RuntimeError, OSError, ValueError) as exc:
                reason = f"checkquote failed on this quote ({exc})"
                notes.append(f"Keylime: {reason}")
        times: dict[str, list[int]] = {name: [] for name in candidates}
        for call in candidates.values():
            for dummy in range(WARMUP):
                call()
        per_round = max(1, args.runs // args.rounds)
        try:
            for dummy in range(args.rounds):
                for name, call in candidates.items():
                    times[name] += timed(call, per_round)
                if keylime is not None:
                    times.setdefault("Keylime", []).extend(keylime(per_round))
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
    }
    print(
        f"\n{len(document)}-byte evidence document, quote of 24 sha256 PCRs, policy on PCRs {', '.join(map(str, POLICY_PCRS))},"
        f" ak_trust pcrs-only; {per_round * args.rounds} calls each in {args.rounds} rounds, gc off while timing\n"
    )
    print(f"{'':42} {'median us':>10} {'min us':>9} {'/ ECDSA':>8} {'/ Keylime':>10}")
    for name in labels:
        if name in times:
            keylime_ratio = f"{median[name] / median['Keylime']:10.2f}" if "Keylime" in median else f"{'-':>10}"
            print(
                f"{labels[name]:42} {median[name]:10.1f} {min(times[name]) / 1000:9.1f} {median[name] / median['ECDSA floor']:8.2f} "
                f"{keylime_ratio}"
            )
    for note in notes:
        print(note)

    def verdict(met: bool) -> str:
        return "met" if met else "MISSED"

    floor_ratio = median["verify"] / median["ECDSA floor"]
    print(
        f"\nverify / ECDSA floor = {floor_ratio:5.2f}x   (target <= {TARGET_FLOOR}x: {verdict(floor_ratio <= TARGET_FLOOR)};"
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
    ]
    if "baseline verify" in median:
        figures += [
            _figures.figure(
                "verify_evidence",
                f"Verifier.verify of {args.baseline}, JSON document (median)",
                round(median["baseline verify"], 1),
                "us",
            ),
            _figures.figure(
                "verify_evidence",
                f"Verifier.verify of {args.baseline} / ECDSA floor",
                round(median["baseline verify"] / median["ECDSA floor"], 2),
                "x",
            ),
        ]
    if "Keylime" in median:
        keylime_ratio = median["verify"] / median["Keylime"]
        print(
            f"verify / Keylime     = {keylime_ratio:5.2f}x   (target <= {TARGET_KEYLIME}x: {verdict(keylime_ratio <= TARGET_KEYLIME)};"
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
    _figures.write(args.figures, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
