"""The IMA verifier core: binary list parsing, replay to PCR 10 (sha1 and sha256 banks), Keylime's runtime policy,
the boot aggregate, incremental checks; each verdict compared with Keylime's own on the same list and policy."""

from __future__ import annotations

import hashlib
import json
import random
import struct

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import ima
from imalogs import (
    KEYLIME_VERSION,
    Measurement,
    ascii_lines,
    binary,
    boot_aggregate,
    boot_pcrs,
    file_entry,
    keylime_policy,
    keylime_create_policy,
    keylime_python,
    keylime_verdicts,
    keyring_certificate,
    keyring_entry,
    pcr10,
)

CERTIFICATE = keyring_certificate()
KUBELET = b"kubelet v1.20.2"
GOOD = [
    boot_aggregate(),
    file_entry("/usr/bin/kubelet", KUBELET),
    file_entry("/usr/bin/containerd", b"containerd 1.4"),
    file_entry("/usr/lib/x86_64-linux-gnu/libc.so.6", b"libc", template="ima-sig"),
    keyring_entry(".ima", CERTIFICATE),
    file_entry("/var/lib/containerd/io.containerd.snapshotter/1/fs/pause", b"pause, changes by design"),
    file_entry("/usr/bin/kubelet", KUBELET),
]
ALLOWED = {
    "/usr/bin/kubelet": [hashlib.sha256(KUBELET).hexdigest()],
    "/usr/bin/containerd": [
        hashlib.sha256(b"containerd 1.4").hexdigest(),
        hashlib.sha256(b"containerd 1.3").hexdigest(),
    ],
    "/usr/lib/x86_64-linux-gnu/libc.so.6": [hashlib.sha256(b"libc").hexdigest()],
}
EXCLUDES = ["/var/lib/containerd/.*", "/run/.*"]
KEYRINGS = {".ima": [hashlib.sha256(CERTIFICATE).hexdigest()]}
POLICY = keylime_policy(ALLOWED, EXCLUDES, KEYRINGS)
EVIL = file_entry("/usr/local/bin/evil", b"evil")
REPLACED = file_entry("/usr/bin/kubelet", b"a kubelet with a backdoor")
OTHER_KEY = keyring_entry(".ima", keyring_certificate())


def _flipped(measurements):
    """The kubelet entry's file digest flipped, its template hash (and the PCR) left as the kernel made them."""
    hashes = [m.template_hash() for m in measurements]
    changed = list(measurements)
    kubelet = changed[1]
    changed[1] = kubelet._replace(digest=bytes([kubelet.digest[0] ^ 1]) + kubelet.digest[1:])
    return changed, hashes


# name -> (measurements in the list, measurements the TPM saw, policy, template hashes or None, our reasons)
FLIPPED, FLIPPED_HASHES = _flipped(GOOD)
CASES = {
    "all allowed": (GOOD, GOOD, POLICY, None, ()),
    "a binary not in the policy": (GOOD + [EVIL], GOOD + [EVIL], POLICY, None, (ima.RUNTIME_POLICY,)),
    "a replaced file under an allowed path": (
        GOOD + [REPLACED],
        GOOD + [REPLACED],
        POLICY,
        None,
        (ima.RUNTIME_POLICY,),
    ),
    "an excluded path": (
        GOOD + [file_entry("/run/evil", b"x")],
        GOOD + [file_entry("/run/evil", b"x")],
        POLICY,
        None,
        (),
    ),
    "one entry's digest flipped": (FLIPPED, GOOD, POLICY, FLIPPED_HASHES, (ima.IMA_LOG_MISMATCH,)),
    "an entry dropped": (GOOD[:2] + GOOD[3:], GOOD, POLICY, None, (ima.IMA_LOG_MISMATCH,)),
    "the list truncated": (GOOD[:4], GOOD, POLICY, None, (ima.IMA_LOG_MISMATCH,)),
    "a key not in the keyring policy": (
        GOOD + [OTHER_KEY],
        GOOD + [OTHER_KEY],
        POLICY,
        None,
        (ima.RUNTIME_POLICY,),
    ),
    "an ignored keyring": (
        GOOD + [keyring_entry(".builtin_trusted_keys", CERTIFICATE)],
        GOOD + [keyring_entry(".builtin_trusted_keys", CERTIFICATE)],
        keylime_policy(ALLOWED, EXCLUDES, KEYRINGS, ignored_keyrings=[".builtin_trusted_keys"]),
        None,
        (),
    ),
    "a violation entry": (
        GOOD + [Measurement("ima-ng", "/usr/bin/kubelet", bytes(32), violation=True)],
        GOOD + [Measurement("ima-ng", "/usr/bin/kubelet", bytes(32), violation=True)],
        POLICY,
        None,
        (ima.RUNTIME_POLICY,),
    ),
    "a boot aggregate of other PCRs": (
        [boot_aggregate()._replace(digest=hashlib.sha256(b"other").digest())] + GOOD[1:],
        [boot_aggregate()._replace(digest=hashlib.sha256(b"other").digest())] + GOOD[1:],
        POLICY,
        None,
        (ima.IMA_BOOT_AGGREGATE,),
    ),
}
PCRS = {bank: boot_pcrs(bank) for bank in ("sha1", "sha256")}


def _keylime_boot_aggregates() -> dict[str, list[str]]:
    """What Keylime's verifier derives from the measured boot log: each bank's hash of PCRs 0-7 and of 0-9."""
    return {
        bank: [hashlib.new(bank, b"".join(pcrs[i] for i in range(n))).hexdigest() for n in (8, 10)]
        for bank, pcrs in PCRS.items()
    }


def _ours(name: str, bank: str) -> ima.ImaResult:
    listed, seen, policy, hashes, _reasons = CASES[name]
    return ima.verify(
        binary(listed, hashes=hashes), ima.load_policy(json.dumps(policy)), pcr10(seen, bank), bank=bank, pcrs=PCRS
    )


@pytest.fixture(scope="module")
def keylime():
    python, reason = keylime_python()
    if python is None:
        pytest.skip(f"the venv of Keylime {KEYLIME_VERSION}, the oracle, could not be made: {reason}")
    jobs = [
        {
            "lines": ascii_lines(listed, hashes),
            "policy": policy,
            "pcr": pcr10(seen, bank).hex(),
            "bank": bank,
            "boot_aggregates": _keylime_boot_aggregates(),
        }
        for name, (listed, seen, policy, hashes, _reasons) in CASES.items()
        for bank in ("sha256", "sha1")
    ]
    results = keylime_verdicts(python, jobs)
    keys = [(name, bank) for name in CASES for bank in ("sha256", "sha1")]
    return {key: result[0] for key, result in zip(keys, results)}


@pytest.mark.parametrize("bank", ["sha256", "sha1"])
@pytest.mark.parametrize("name", CASES)
def test_verdict_equals_keylimes_on_the_same_list_and_policy(keylime, name, bank):
    ours = _ours(name, bank)
    theirs = keylime[(name, bank)]
    assert ours.ok == theirs["ok"], (ours.messages, theirs["events"])
    assert ours.reasons == CASES[name][4]
    if ima.IMA_LOG_MISMATCH in ours.reasons:
        assert "ima.pcr_mismatch" in theirs["events"]
    # each entry we refuse by the policy, Keylime refuses too: by its path when the policy has none, else by digest
    contexts = [json.loads(context) for context in theirs["contexts"]]
    for failure in ours.failures:
        if failure.what == "violation":
            assert any(event.endswith(".tomtou") for event in theirs["events"])
        elif failure.allowed:
            assert any(c.get("got") == failure.measured.split(":")[1] for c in contexts), (failure, contexts)
        else:
            assert any(failure.path in str(c.get("message")) for c in contexts), (failure, contexts)


def test_a_binary_not_in_the_policy_is_refused_naming_its_path_and_digest():
    result = _ours("a binary not in the policy", "sha256")
    evil = f"sha256:{hashlib.sha256(b'evil').hexdigest()}"
    assert [(f.path, f.measured, f.allowed) for f in result.failures] == [("/usr/local/bin/evil", evil, ())]
    assert result.failure_count == 1
    assert f"/usr/local/bin/evil {evil} not allowed (allowed: none for this path)" in result.messages[0]
    with pytest.raises(ima.ImaError, match="^runtime-policy: 1 entry not allowed: /usr/local/bin/evil sha256:"):
        result.raise_for_failure()


def test_a_replaced_file_is_refused_naming_both_digests():
    result = _ours("a replaced file under an allowed path", "sha256")
    (failure,) = result.failures
    assert failure.path == "/usr/bin/kubelet"
    assert failure.measured == f"sha256:{hashlib.sha256(b'a kubelet with a backdoor').hexdigest()}"
    assert failure.allowed == (hashlib.sha256(KUBELET).hexdigest(),)
    assert hashlib.sha256(KUBELET).hexdigest() in result.messages[0]


def test_every_failing_entry_is_counted_and_the_first_ones_named():
    evil = [file_entry(f"/tmp/evil{i}", bytes([i])) for i in range(25)]
    result = ima.verify(binary(GOOD + evil), ima.load_policy(POLICY), pcr10(GOOD + evil, "sha256"), pcrs=PCRS)
    assert result.failure_count == 25
    assert [f.path for f in result.failures] == [f"/tmp/evil{i}" for i in range(ima.MAX_NAMED_FAILURES)]
    assert "(and 15 more)" in result.messages[0]


def test_the_sha256_template_hash_list_replays_both_banks():
    raw = binary(GOOD, template_hash_alg="sha256")
    for bank in ("sha256", "sha1"):
        result = ima.verify(
            raw, ima.load_policy(POLICY), pcr10(GOOD, bank), bank=bank, pcrs=PCRS, template_hash_alg="sha256"
        )
        assert result.ok, result.messages
    # the policy's ima.log_hash_alg says which list it is, as in Keylime
    sha256_policy = ima.load_policy({**POLICY, "ima": {**POLICY["ima"], "log_hash_alg": "sha256"}})
    assert ima.verify(raw, sha256_policy, pcr10(GOOD, "sha256"), pcrs=PCRS).ok
    # read as the sha1 list, its entries do not line up
    with pytest.raises(ima.ImaError, match="ima-malformed"):
        ima.parse(raw, "sha1")


def test_a_quote_lagging_the_log_matches_at_its_entry_and_the_state_stops_there():
    result = ima.verify(binary(GOOD), ima.load_policy(POLICY), pcr10(GOOD[:5], "sha256"), pcrs=PCRS)
    assert result.ok
    assert result.state.entries == 5 and result.state.pcr10 == pcr10(GOOD[:5], "sha256")


INCREMENT = [file_entry("/usr/bin/containerd", b"containerd 1.3")] * 3


def _incremental_checks() -> list[ima.ImaResult]:
    """The whole list, then three new entries, then a refused one, each check from the state of the one before."""
    policy = ima.load_policy(POLICY)
    first = ima.verify(binary(GOOD), policy, pcr10(GOOD, "sha256"), pcrs=PCRS)
    second = ima.verify(binary(INCREMENT), policy, pcr10(GOOD + INCREMENT, "sha256"), state=first.state)
    third = ima.verify(binary([EVIL]), policy, pcr10(GOOD + INCREMENT + [EVIL], "sha256"), state=second.state)
    return [first, second, third]


def test_incremental_check_reads_only_the_new_entries_and_a_reset_starts_over(monkeypatch):
    parsed = []
    entry = ima._entry
    monkeypatch.setattr(ima, "_entry", lambda *args: parsed.append(args[0]) or entry(*args))
    policy = ima.load_policy(POLICY)
    first = ima.verify(binary(GOOD), policy, pcr10(GOOD, "sha256"), pcrs=PCRS)
    assert first.ok and first.state.entries == len(GOOD) and first.entries_parsed == len(GOOD)
    new = INCREMENT
    second = ima.verify(binary(new), policy, pcr10(GOOD + new, "sha256"), state=first.state)
    assert second.ok, second.messages
    assert second.entries_parsed == 3 and second.state.entries == len(GOOD) + 3
    assert parsed == list(range(len(GOOD))) + [len(GOOD), len(GOOD) + 1, len(GOOD) + 2]
    assert second.state.pcr10 == pcr10(GOOD + new, "sha256")
    # a new entry that is refused: named with its number in the whole list, and the state starts over
    third = ima.verify(binary([EVIL]), policy, pcr10(GOOD + new + [EVIL], "sha256"), state=second.state)
    assert not third.ok and third.failures[0].number == len(GOOD) + 3 and third.entries_parsed == 1
    assert third.state == ima.ImaState.fresh("sha256")
    # the new entries alone against a fresh state (after a reset) do not replay to the quote: the whole list is needed
    stale = ima.verify(binary(new), policy, pcr10(GOOD + new, "sha256"), state=ima.ImaState.fresh("sha256"), pcrs=PCRS)
    assert stale.reasons[0] == ima.IMA_LOG_MISMATCH


def test_incremental_verdicts_and_entry_counts_equal_keylimes(keylime):
    python, dummy = keylime_python()
    checks = _incremental_checks()
    (steps,) = keylime_verdicts(
        python,
        [
            {
                "lines": ascii_lines(GOOD),
                "policy": POLICY,
                "pcr": pcr10(GOOD, "sha256").hex(),
                "bank": "sha256",
                "boot_aggregates": _keylime_boot_aggregates(),
                "then": [
                    {"lines": ascii_lines(INCREMENT), "pcr": pcr10(GOOD + INCREMENT, "sha256").hex()},
                    {"lines": ascii_lines([EVIL]), "pcr": pcr10(GOOD + INCREMENT + [EVIL], "sha256").hex()},
                ],
            }
        ],
    )
    assert [s["ok"] for s in steps] == [c.ok for c in checks] == [True, True, False]
    assert [s["next"] for s in steps] == [c.state.entries for c in checks] == [len(GOOD), len(GOOD) + 3, 0]


@pytest.mark.parametrize(
    ("raw", "reason", "words"),
    [
        (binary(GOOD)[:-3], ima.IMA_MALFORMED, "truncated"),
        (binary(GOOD)[:10], ima.IMA_MALFORMED, "truncated"),
        (binary([GOOD[1]]).replace(b"ima-ng", b"ima-xx"), ima.IMA_MALFORMED, "template 'ima-xx' is not supported"),
        (struct.pack("<I", 11) + binary([GOOD[1]])[4:], ima.IMA_MALFORMED, "PCR 11"),
        (binary([GOOD[1]])[:24] + struct.pack("<I", 99) + binary([GOOD[1]])[28:], ima.IMA_MALFORMED, "name length 99"),
        (
            binary([GOOD[1]])[:34] + struct.pack("<I", 10**6) + binary([GOOD[1]])[38:],
            ima.IMA_LIMITS,
            "template data of 1000000 bytes",
        ),
    ],
    ids=["cut in an entry", "cut in a header", "unknown template", "other PCR", "bad name length", "huge data"],
)
def test_malformed_lists_are_refused_with_the_reason(raw, reason, words):
    with pytest.raises(ima.ImaError, match=reason) as caught:
        ima.parse(raw)
    assert words in str(caught.value)


def test_fuzzed_lists_raise_nothing_but_ima_error():
    raw = binary(GOOD)
    policy = ima.load_policy(POLICY)
    quoted = pcr10(GOOD, "sha256")
    rng = random.Random(38)
    refused = 0
    for dummy in range(2000):
        mutated = bytearray(raw)
        for _flip in range(rng.randint(1, 4)):
            mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        if rng.random() < 0.3:
            mutated = mutated[: rng.randrange(len(mutated))]
        try:
            result = ima.verify(bytes(mutated), policy, quoted, pcrs=PCRS)
        except ima.ImaError as exc:
            assert exc.reason in ima.REASONS
            refused += 1
            continue
        assert not result.ok or bytes(mutated) == raw
        refused += not result.ok
    assert refused >= 1990


def test_fuzzed_ascii_lists_raise_nothing_but_ima_error():
    text = "\n".join(ascii_lines(GOOD)) + "\n"
    policy = ima.load_policy(POLICY)
    quoted = pcr10(GOOD, "sha256")
    rng = random.Random(10)
    alphabet = "0123456789abcdef :\n/-_gimnsx"
    for dummy in range(2000):
        mutated = list(text)
        for _flip in range(rng.randint(1, 4)):
            mutated[rng.randrange(len(mutated))] = rng.choice(alphabet)
        mutated = "".join(mutated)
        try:
            result = ima.verify(mutated.encode(), policy, quoted, pcrs=PCRS, log_format="ascii")
        except ima.ImaError as exc:
            assert exc.reason in ima.REASONS
            continue
        assert not result.ok or mutated == text or mutated.split() == text.split()


def test_limits_on_size_and_entries(monkeypatch):
    monkeypatch.setattr(ima, "MAX_ENTRIES", 3)
    with pytest.raises(ima.ImaError, match="ima-limits: measurement list holds more than 3 entries"):
        ima.parse(binary(GOOD))
    monkeypatch.setattr(ima, "MAX_LOG_BYTES", 100)
    with pytest.raises(ima.ImaError, match="ima-limits: measurement list is larger than 100 bytes"):
        ima.parse(binary(GOOD))


def test_the_older_allowlist_formats_and_exclude_list_are_read():
    text = "".join(f"{digests[0]}  {path}\n" for path, digests in ALLOWED.items())
    text_policy = ima.load_policy(text, excludes="/var/lib/containerd/.*\n/run/.*\n")
    json_policy = ima.load_policy(
        {"meta": {"version": 1}, "hashes": ALLOWED, "ima": {"ignored_keyrings": [".ima"]}}, excludes=EXCLUDES
    )
    assert json_policy.ignored_keyrings == {".ima"}
    for policy in (text_policy, json_policy):
        assert policy.digests["/usr/bin/kubelet"] == frozenset(ALLOWED["/usr/bin/kubelet"])
        assert policy.exclude_regex.match("/run/x")
    listed = GOOD[:4] + GOOD[5:]  # the allowlist formats have no keyrings
    assert ima.verify(binary(listed), text_policy, pcr10(listed, "sha256"), pcrs=PCRS).ok


def test_a_dsse_envelope_is_unwrapped():
    import base64

    envelope = {"payload": base64.b64encode(json.dumps(POLICY).encode()).decode(), "payloadType": "x", "signatures": []}
    assert ima.load_policy(envelope).digests == ima.load_policy(POLICY).digests


@pytest.mark.parametrize(
    ("policy", "words"),
    [
        ({**POLICY, "meta": {"version": 2}}, "meta.version is 2"),
        ({**POLICY, "digests": {"/a": ["XYZ"]}}, "is not a lower-case hex digest"),
        ({**POLICY, "digests": {"/a": []}}, "non-empty list"),
        ({**POLICY, "excludes": ["(unclosed"]}, "is not a regular expression"),
        ({**POLICY, "excludes": ["(a+)+$"]}, "nests a quantifier"),
        ({**POLICY, "excludes": ["x" * 2000]}, "longer than 1024"),
        ({**POLICY, "excludes": ["/a"] * 2000}, "more than 1024"),
        ({**POLICY, "ima": {**POLICY["ima"], "dm_policy": {}}}, "dm_policy"),
        ({**POLICY, "ima": {**POLICY["ima"], "log_hash_alg": "md4"}}, "log_hash_alg"),
        ("{not json", "not valid JSON"),
        ("deadbeef\n", "allowlist line 1"),
    ],
)
def test_bad_policies_are_refused_naming_what_is_wrong(policy, words):
    with pytest.raises(ima.ImaError, match="runtime-policy|ima-limits") as caught:
        ima.load_policy(json.dumps(policy) if isinstance(policy, dict) else policy)
    assert words in str(caught.value)


def test_the_boot_aggregate_needs_the_quoted_pcrs():
    result = ima.verify(binary(GOOD), ima.load_policy(POLICY), pcr10(GOOD, "sha256"))
    assert result.reasons == (ima.IMA_BOOT_AGGREGATE,)
    assert "PCRs 0-7 of the sha256 bank were not quoted" in result.messages[0]
    sha1_list = [boot_aggregate("sha1")] + GOOD[1:]
    assert ima.verify(binary(sha1_list), ima.load_policy(POLICY), pcr10(sha1_list, "sha1"), bank="sha1", pcrs=PCRS).ok


def test_the_ascii_list_reads_as_the_binary_one():
    listed = GOOD + [EVIL, Measurement("ima-ng", "/usr/bin/kubelet", bytes(32), violation=True)]
    text = "\n".join(ascii_lines(listed)) + "\n"
    binary_entries = ima.parse(binary(listed))
    assert ima.parse_ascii(text) == binary_entries
    policy = ima.load_policy(POLICY)
    quoted = pcr10(listed, "sha256")
    ours = ima.verify(text.encode(), policy, quoted, pcrs=PCRS, log_format="ascii")
    assert ours._replace(messages=()) == ima.verify(binary(listed), policy, quoted, pcrs=PCRS)._replace(messages=())
    assert ours.failure_count == 2
    for bad, words in [
        ("11 " + "00" * 20 + " ima-ng sha256:00 /a", "PCR 11"),
        ("10 " + "00" * 20 + " ima-xx sha256:00 /a", "template 'ima-xx'"),
        ("10 zz ima-ng sha256:00 /a", "fields are not"),
        ("10 " + "00" * 19 + " ima-ng sha256:" + "00" * 32 + " /a", "template hash of 19 bytes"),
        ("10 " + "00" * 20 + " ima-ng", "not '<pcr>"),
    ]:
        with pytest.raises(ima.ImaError, match="ima-malformed") as caught:
            ima.parse_ascii(bad)
        assert words in str(caught.value)


def test_a_flipped_digest_is_a_mismatch_naming_the_entry():
    result = _ours("one entry's digest flipped", "sha256")
    assert result.reasons == (ima.IMA_LOG_MISMATCH,) and result.failure_count == 0
    assert (
        result.messages[0]
        == "1 entry whose template hash is not the sha1 of its data, first entry 1 (/usr/bin/kubelet)"
    )
    assert result.messages[1].startswith("replay of 7 entries (7 new) does not reach the quoted sha256 PCR 10 ")
    assert result.state == ima.ImaState.fresh("sha256")


def test_the_policies_keylime_policy_writes_are_read_as_they_are(keylime, tmp_path):
    python, dummy = keylime_python()
    excludes = tmp_path / "excludes"
    excludes.write_text("\n".join(EXCLUDES) + "\n")
    written = keylime_create_policy(python, tmp_path, GOOD, "--keyrings", "--excludelist", str(excludes))
    legacy = keylime_create_policy(python, tmp_path, GOOD, "--show-legacy-allowlist")
    runtime_policy = ima.load_policy(written)
    assert set(runtime_policy.excludes) == set(EXCLUDES) and ".ima" in runtime_policy.keyrings
    quoted = pcr10(GOOD + [EVIL], "sha256")
    verdicts = {
        "runtime": ima.verify(binary(GOOD + [EVIL]), runtime_policy, quoted, pcrs=PCRS),
        "legacy": ima.verify(binary(GOOD + [EVIL]), ima.load_policy(legacy, excludes=EXCLUDES), quoted, pcrs=PCRS),
    }
    assert [f.path for f in verdicts["runtime"].failures] == ["/usr/local/bin/evil"]
    # the legacy allowlist has no keyrings: the .ima key is refused there too
    assert [f.path for f in verdicts["legacy"].failures] == [".ima", "/usr/local/bin/evil"]
    good = ima.verify(binary(GOOD), runtime_policy, pcr10(GOOD, "sha256"), pcrs=PCRS)
    assert good.ok, good.messages
    (theirs,) = keylime_verdicts(
        python,
        [
            {
                "lines": ascii_lines(GOOD + [EVIL]),
                "policy": json.loads(written),
                "pcr": quoted.hex(),
                "bank": "sha256",
                "boot_aggregates": _keylime_boot_aggregates(),
            }
        ],
    )
    assert theirs[0]["ok"] is False and "ima.validation.ima-ng.not_in_allowlist" in theirs[0]["events"]


def test_a_path_that_is_not_text_is_shown_escaped():
    odd = Measurement("ima-ng", "/t\udcff\n", hashlib.sha256(b"odd").digest())  # the bytes /t 0xff LF
    assert b"/t\xff\n\x00" in binary([odd])
    result = ima.verify(binary(GOOD + [odd]), ima.load_policy(POLICY), pcr10(GOOD + [odd], "sha256"), pcrs=PCRS)
    assert [f.path for f in result.failures] == ["/t\\xff\\n"]
    json.dumps(result.messages)  # encodable: no lone surrogates
    assert "/t\\xff\\n sha256:" in result.messages[0]
