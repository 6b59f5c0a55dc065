"""Benchmark of the IMA verifier core (issue 38): a full and an incremental check of a 5,000-entry measurement list
against a runtime policy, beside Keylime's own ``keylime.ima.ima.process_measurement_list`` on the same list and
policy.

The list is built here in the kernel's binary format (tests/unit/.../imalogs.py): the boot aggregate, executables and
libraries (ima-ng and ima-sig), keyring certificates (ima-buf), paths measured again and paths under the policy's
excludes; the policy allows every file of the list among 15,000 paths. Ours parses the binary list, Keylime the same
entries as the ASCII lines its agent sends; both replay to the quoted SHA-256 PCR 10 and check every entry. The
incremental check takes the last --new entries after a state holding the rest (ours: ImaState; Keylime: its
AgentAttestState). Keylime's logging is switched off, in its favour.

Run: .venv/bin/python bench/ima_verify.py [--entries N] [--new K] [--runs R] [--keylime-venv PATH] [--figures FILE]
Keylime 7.14.3 goes into its own venv (default /tmp/keylime-venv), never the project's; if it cannot be installed
the Keylime rows say why. Target (issue 38): each check <= 0.5x Keylime's time; the incremental check's cost in
proportion to the new entries.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_KEYLIME = 0.5
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "unit" / "plugins" / "module_utils" / "_attestation"))
from testenv import unit_conftest  # noqa: E402

unit_conftest()

import _figures  # noqa: E402
import imalogs  # noqa: E402

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import ima  # noqa: E402

# Runs in the Keylime venv: one JSON job on the first stdin line; then per further line ("full" or "incremental") the
# time (ns) of one such check on stdout, so that the rounds interleave with ours on this shared machine.
KEYLIME_TIMER = r"""
import copy, gc, json, logging, sys, time, types
sys.modules.setdefault("gpg", types.ModuleType("gpg"))
logging.disable(logging.CRITICAL)
from keylime.agentstates import AgentAttestState
from keylime.common.algorithms import Hash
from keylime.ima import ima
job = json.loads(sys.stdin.readline())
lines, new, bank = job["lines"], job["new"], Hash(job["bank"])
def check(state, lines, pcr):
    return ima.process_measurement_list(state, lines, job["policy"], pcrval=pcr,
                                        boot_aggregates=job["boot_aggregates"], hash_alg=bank)[1]
assert not check(None, lines, job["pcr"])
primed = AgentAttestState("node")
assert not check(primed, lines[:-new], job["pcr_before"])
assert not check(copy.deepcopy(primed), lines[-new:], job["pcr"])
print("ready", flush=True)
for command in sys.stdin:
    state = copy.deepcopy(primed)
    gc.disable()
    start = time.perf_counter_ns()
    if command.strip() == "full":
        check(None, lines, job["pcr"])
    else:
        check(state, lines[-new:], job["pcr"])
    elapsed = time.perf_counter_ns() - start
    gc.enable()
    print(elapsed, flush=True)
"""


def build(entries: int, policy_paths: int) -> tuple[list, dict]:
    certificate = imalogs.keyring_certificate()
    measurements = [imalogs.boot_aggregate()]
    files = []
    for number in range(1, entries):
        if number % 500 == 0:
            measurements.append(imalogs.keyring_entry(".ima", certificate))
        elif number % 7 == 0:
            measurements.append(imalogs.file_entry(f"/var/lib/containerd/snapshots/{number}/fs/bin/sh", b"%d" % number))
        elif number % 5 == 0 and files:
            measurements.append(files[number % len(files)])
        else:
            template = "ima-sig" if number % 3 == 0 else "ima-ng"
            entry = imalogs.file_entry(f"/usr/lib/x86_64-linux-gnu/lib{number}.so.1", b"lib %d" % number, template)
            files.append(entry)
            measurements.append(entry)
    digests = {m.path: [m.digest.hex()] for m in files}
    for number in range(policy_paths - len(digests)):
        digests[f"/usr/share/unmeasured/{number}"] = [hashlib.sha256(b"%d" % number).hexdigest()]
    policy = imalogs.keylime_policy(
        digests,
        ["/var/lib/containerd/.*", "/run/.*", "/var/log/.*"],
        {".ima": [hashlib.sha256(certificate).hexdigest()]},
    )
    return measurements, policy


def timed(call, runs: int) -> list[int]:
    times = []
    for dummy in range(runs):
        gc.disable()
        start = time.perf_counter_ns()
        call()
        times.append(time.perf_counter_ns() - start)
        gc.enable()
    return times


def main() -> int:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--entries", type=int, default=5000, help="entries in the list (default 5000)")
    options.add_argument("--new", type=int, default=50, help="new entries of the incremental check (default 50)")
    options.add_argument("--runs", type=int, default=7, help="runs of each check (default 7)")
    options.add_argument("--keylime-venv", type=Path, default=imalogs.KEYLIME_VENV)
    _figures.add_option(options)
    args = options.parse_args()

    measurements, policy_document = build(args.entries, 15000)
    bank = "sha256"
    pcrs = {bank: imalogs.boot_pcrs(bank)}
    raw = imalogs.binary(measurements)
    tail = imalogs.binary(measurements[-args.new :])
    quoted = imalogs.pcr10(measurements, bank)
    policy = ima.load_policy(json.dumps(policy_document))
    full = ima.verify(raw, policy, quoted, pcrs=pcrs)
    assert full.ok, full.messages
    before = ima.verify(raw[: len(raw) - len(tail)], policy, imalogs.pcr10(measurements[: -args.new], bank), pcrs=pcrs)
    assert before.ok and before.state.entries == args.entries - args.new
    incremental = ima.verify(tail, policy, quoted, state=before.state)
    assert incremental.ok and incremental.entries_parsed == args.new

    candidates = {
        "full": lambda: ima.verify(raw, policy, quoted, pcrs=pcrs),
        "incremental": lambda: ima.verify(tail, policy, quoted, state=before.state),
    }
    python, reason = imalogs.keylime_python(args.keylime_venv)
    keylime = None
    if python is not None:
        job = {
            "lines": imalogs.ascii_lines(measurements),
            "new": args.new,
            "bank": bank,
            "policy": policy_document,
            "pcr": quoted.hex(),
            "pcr_before": imalogs.pcr10(measurements[: -args.new], bank).hex(),
            "boot_aggregates": {bank: [hashlib.sha256(b"".join(pcrs[bank][i] for i in range(10))).hexdigest()]},
        }
        keylime = subprocess.Popen(
            [str(python), "-c", KEYLIME_TIMER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd="/",
        )
        keylime.stdin.write(json.dumps(job) + "\n")
        keylime.stdin.flush()
        if keylime.stdout.readline().strip() != "ready":
            keylime.kill()
            reason = (keylime.communicate()[1].strip().splitlines() or ["failed"])[-1]
            keylime = None
    ours: dict[str, list[int]] = {"full": [], "incremental": []}
    theirs: dict[str, list[int]] = {"full": [], "incremental": []}
    try:
        for _round in range(args.runs):
            for name, call in candidates.items():
                # the incremental check is short: several calls per round, each timed alone
                for _call in range(1 if name == "full" else 10):
                    ours[name].extend(timed(call, 1))
                    if keylime is not None:
                        keylime.stdin.write(name + "\n")
                        keylime.stdin.flush()
                        theirs[name].append(int(keylime.stdout.readline()))
    finally:
        if keylime is not None:
            keylime.stdin.close()
            keylime.wait(timeout=60)
    median = {name: statistics.median(times) / 1e6 for name, times in ours.items()}
    keylime_median = {name: statistics.median(times) / 1e6 for name, times in theirs.items() if times}

    print(f"IMA check of {args.entries} entries ({args.new} new in the incremental one), policy of 15000 paths:")
    figures = []
    for name in ("full", "incremental"):
        line = f"  {name:<12} ours {median[name]:9.3f} ms"
        figures.append(_figures.figure("ima_verify", f"{name} check", round(median[name], 3), "ms"))
        if keylime_median:
            ratio = median[name] / keylime_median[name]
            met = ratio <= TARGET_KEYLIME
            line += f"   Keylime {keylime_median[name]:9.3f} ms   ours / Keylime {ratio:5.2f}x (target <= {TARGET_KEYLIME}x: "
            line += f"{'MET' if met else 'MISSED'})"
            figures += [
                _figures.figure(
                    "ima_verify",
                    f"Keylime {imalogs.KEYLIME_VERSION} {name} check",
                    round(keylime_median[name], 3),
                    "ms",
                ),
                _figures.figure("ima_verify", f"{name} / Keylime", round(ratio, 2), "x", f"<= {TARGET_KEYLIME}x", met),
            ]
        print(line)
    share = median["incremental"] / median["full"]
    proportion = args.new / args.entries
    print(
        f"  incremental / full = {share:.4f} for {proportion:.4f} of the entries "
        f"({'MET' if share <= 2 * proportion else 'MISSED'}: within 2x of the proportion)"
    )
    figures.append(
        _figures.figure(
            "ima_verify",
            f"incremental / full ({args.new} of {args.entries} entries)",
            round(share, 4),
            "x",
            f"<= {2 * proportion:.4f}x (2x the share of entries)",
            share <= 2 * proportion,
        )
    )
    if not keylime_median:
        print(f"  Keylime: not measured ({reason})")
        figures.append(
            _figures.figure(
                "ima_verify",
                f"Keylime {imalogs.KEYLIME_VERSION}: not measured ({reason})",
                None,
                "ms",
                f"<= {TARGET_KEYLIME}x Keylime",
                False,
            )
        )
    _figures.write(args.figures, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
