"""Measurement policies: own format (YAML, JSON), Constellation's, the node-lock mark and controller.resolve_policy."""

from __future__ import annotations

import hashlib
import json
import os
import re

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import controller, issuer
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.policy import (
    MAX_POLICY_BYTES,
    NODE_LOCK_PCR,
    MeasurementPolicy,
    PcrRule,
    PolicyError,
    dump_policy,
    load_policy,
    node_lock_mark,
    parse_policy,
    policy_from_document,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.verifier import (
    VerificationError,
    Verifier,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.seal import EphemeralKey

FIRMWARE_A = hashlib.sha256(b"firmware A").hexdigest()
FIRMWARE_B = hashlib.sha256(b"firmware B").hexdigest()
KERNEL = hashlib.sha256(b"kernel").hexdigest()
ZERO = "00" * 32

OWN_YAML = f"""
version: 1
hash_algorithm: sha256
ak_trust: pcrs-only
pcrs:
  4:
    allowed:
      - "{FIRMWARE_A}"
      - "{FIRMWARE_B.upper()}"
  "9":
    allowed: "{KERNEL}"
    warn_only: true
  15: {{allowed: ["{ZERO}"], warn_only: false}}
"""

OWN_JSON = json.dumps(
    {
        "version": 1,
        "hash_algorithm": "sha256",
        "ak_trust": "pcrs-only",
        "pcrs": {
            "4": {"allowed": [FIRMWARE_A, FIRMWARE_B.upper()]},
            "9": {"allowed": KERNEL, "warn_only": True},
            "15": {"allowed": [ZERO], "warn_only": False},
        },
    }
)

EXPECTED_RULES = {
    4: PcrRule(4, (bytes.fromhex(FIRMWARE_A), bytes.fromhex(FIRMWARE_B)), False),
    9: PcrRule(9, (bytes.fromhex(KERNEL),), True),
    15: PcrRule(15, (bytes(32),), False),
}

CONSTELLATION_JSON = json.dumps(
    {
        "4": {"expected": FIRMWARE_A, "warnOnly": False},
        "9": {"expected": KERNEL, "warnOnly": True},
        "15": {"expected": ZERO, "warnOnly": False},
    }
)

CONSTELLATION_YAML = f"""
4:
  expected: "{FIRMWARE_A}"
  warnOnly: false
9:
  expected: "{KERNEL}"
  warnOnly: true
15:
  expected: "{ZERO}"
"""


def _own(pcrs: object = ..., **top) -> dict:
    doc = {"version": 1, "pcrs": {"15": {"allowed": [ZERO]}} if pcrs is ... else pcrs}
    doc.update(top)
    return doc


def _refused(text_or_doc, message: str) -> PolicyError:
    with pytest.raises(PolicyError) as err:
        if isinstance(text_or_doc, (str, bytes)):
            parse_policy(text_or_doc)
        else:
            parse_policy(json.dumps(text_or_doc))
    assert message in str(err.value)
    return err.value


@pytest.mark.parametrize(
    "text", [OWN_YAML, OWN_JSON, OWN_YAML.encode(), OWN_JSON.encode()], ids=["YAML", "JSON", "YAML bytes", "JSON bytes"]
)
def test_own_format_is_read(text):
    policy = parse_policy(text)
    assert policy.hash_algorithm == "sha256"
    assert policy.ak_trust == "pcrs-only" and policy.ak_trust_level == 1
    assert policy.rules == EXPECTED_RULES


def test_own_format_defaults_to_sha256_level_2_and_enforced_rules():
    policy = parse_policy(f"version: 1\npcrs:\n  0:\n    allowed: ['{FIRMWARE_A}']\n")
    assert policy.hash_algorithm == "sha256"
    assert policy.ak_trust == "ek-certificate" and policy.ak_trust_level == 2
    assert policy.rules[0].warn_only is False


@pytest.mark.parametrize("ak_trust,level", [("pcrs-only", 1), ("ek-certificate", 2)])
def test_ak_trust_levels(ak_trust, level):
    assert policy_from_document(_own(ak_trust=ak_trust)).ak_trust_level == level


@pytest.mark.parametrize("hash_algorithm,size", [("sha1", 20), ("sha256", 32), ("sha384", 48), ("sha512", 64)])
def test_digest_size_follows_the_hash_algorithm(hash_algorithm, size):
    policy = policy_from_document(_own({"0": {"allowed": ["ab" * size]}}, hash_algorithm=hash_algorithm))
    assert policy.rules[0].allowed == (b"\xab" * size,)


@pytest.mark.parametrize("text", [CONSTELLATION_JSON, CONSTELLATION_YAML], ids=["JSON", "YAML"])
def test_constellation_format_is_read(text):
    policy = parse_policy(text)
    assert policy.hash_algorithm == "sha256" and policy.ak_trust == "ek-certificate"
    assert policy.rules == {
        4: PcrRule(4, (bytes.fromhex(FIRMWARE_A),), False),
        9: PcrRule(9, (bytes.fromhex(KERNEL),), True),
        15: PcrRule(15, (bytes(32),), False),
    }


def test_constellation_expected_may_list_several_values():
    policy = policy_from_document({"4": {"expected": [FIRMWARE_A, FIRMWARE_B], "warnOnly": False}})
    assert policy.rules[4].allowed == (bytes.fromhex(FIRMWARE_A), bytes.fromhex(FIRMWARE_B))


@pytest.mark.parametrize("text", [OWN_YAML, CONSTELLATION_JSON], ids=["own", "Constellation"])
def test_dump_policy_round_trips(text):
    policy = parse_policy(text)
    assert parse_policy(dump_policy(policy)) == policy
    assert json.loads(dump_policy(policy))["version"] == 1


@pytest.mark.parametrize(
    "name,text", [("policy.yml", OWN_YAML), ("policy.json", OWN_JSON), ("constellation.json", CONSTELLATION_JSON)]
)
def test_load_policy_reads_a_file(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    assert load_policy(str(path)).rules[15] == PcrRule(15, (bytes(32),), False)


def test_policy_of_exactly_the_size_limit_is_read(tmp_path):
    path = tmp_path / "policy.json"
    path.write_text(OWN_JSON + " " * (MAX_POLICY_BYTES - len(OWN_JSON)))
    assert load_policy(str(path)).rules == EXPECTED_RULES


# Errors: each names the file or entry and what is wrong with it.


def test_missing_file_is_named(tmp_path):
    path = tmp_path / "absent.yml"
    with pytest.raises(
        PolicyError, match=f"^cannot read measurement policy {re.escape(str(path))}: No such file or directory$"
    ):
        load_policy(str(path))


def test_directory_is_named(tmp_path):
    with pytest.raises(
        PolicyError, match=f"^cannot read measurement policy {re.escape(str(tmp_path))}: Is a directory$"
    ):
        load_policy(str(tmp_path))


def test_path_through_a_file_is_named(tmp_path):
    (tmp_path / "file").write_text(OWN_YAML)
    with pytest.raises(PolicyError, match="cannot read measurement policy .*/file/policy.yml: Not a directory"):
        load_policy(str(tmp_path / "file" / "policy.yml"))


def test_oversized_file_is_refused(tmp_path):
    path = tmp_path / "policy.yml"
    path.write_text(OWN_YAML + "#" * MAX_POLICY_BYTES)
    with pytest.raises(
        PolicyError, match=f"^measurement policy {re.escape(str(path))} is larger than {MAX_POLICY_BYTES} bytes$"
    ):
        load_policy(str(path))


def test_oversized_text_is_refused():
    _refused(OWN_JSON + " " * MAX_POLICY_BYTES, f"policy is larger than {MAX_POLICY_BYTES} bytes")


def test_file_errors_name_the_file(tmp_path):
    path = tmp_path / "policy.yml"
    path.write_text("version: 2\npcrs: {}\n")
    with pytest.raises(
        PolicyError, match=f"^measurement policy {re.escape(str(path))}: policy version 2 is not supported"
    ):
        load_policy(str(path))


@pytest.mark.parametrize(
    "text",
    ["pcrs: [unclosed", "a: b: c", "{{", "version: 1\n\tpcrs: {}", b"\x00\xff\xfe"],
    ids=["unclosed flow", "nested mapping on one line", "braces", "tab indent", "binary"],
)
def test_not_yaml_is_refused(text):
    _refused(text, "policy is neither JSON nor YAML: ")


@pytest.mark.parametrize("text,kind", [("", "NoneType"), ("just words", "str"), ("- 15\n- 4\n", "list"), ("15", "int")])
def test_yaml_that_is_not_a_mapping_is_refused(text, kind):
    _refused(text, f"policy: policy must be a mapping, got {kind}")


@pytest.mark.parametrize("version", [2, 0, "1", None, [1]], ids=repr)
def test_wrong_version_is_refused(version):
    _refused(_own(version=version), f"policy version {version!r} is not supported (expected 1)")


def test_missing_version_is_refused():
    _refused({"pcrs": {"15": {"allowed": [ZERO]}}}, "policy version None is not supported (expected 1)")


def test_boolean_version_is_refused():
    _refused("version: true\npcrs: {15: {allowed: ['" + ZERO + "']}}", "policy version True is not supported")


@pytest.mark.parametrize(
    "doc,message",
    [
        (_own(extra=1), "policy has unknown key(s): extra"),
        (_own(measurements={}, zeta=1), "policy has unknown key(s): measurements, zeta"),
        (
            _own({"15": {"allowed": [ZERO], "warnOnly": True}}),
            "policy PCR 15: rule must be a mapping with 'allowed' and optional 'warn_only'",
        ),
        (_own({"15": [ZERO]}), "policy PCR 15: rule must be a mapping with 'allowed' and optional 'warn_only'"),
    ],
    ids=["top level", "two top-level keys", "Constellation spelling in own format", "rule a list"],
)
def test_unknown_key_is_named(doc, message):
    _refused(doc, message)


@pytest.mark.parametrize("index", ["24", "-1", "x", "", "1.5", "0x0f", "PCR15"])
def test_bad_index_is_named(index):
    _refused(_own({index: {"allowed": [ZERO]}}), f"policy pcrs: PCR index {index!r} is not 0..23")
    _refused({index: {"expected": ZERO}}, f"Constellation measurements: PCR index {index!r} is not 0..23")


def test_yaml_integer_and_string_indices_are_the_same_pcr():
    policy = parse_policy(f"version: 1\npcrs:\n  15: {{allowed: ['{ZERO}']}}\n  '4': {{allowed: ['{FIRMWARE_A}']}}\n")
    assert set(policy.rules) == {4, 15}


@pytest.mark.parametrize("index", ["\u00b2", "9" * 5000], ids=["superscript two", "5000 digits"])
def test_index_that_int_cannot_read_is_named(index):
    # A mapping, as controller.resolve_policy gets from policy_content (YAML text caps keys at 1024 characters).
    with pytest.raises(PolicyError, match="is not 0..23"):
        policy_from_document(_own({index: {"allowed": [ZERO]}}))


@pytest.mark.parametrize(
    "value", ["zz" * 32, "0x" + "00" * 31, "00 " * 10 + "00", "", 0, None, {"hex": ZERO}], ids=repr
)
def test_bad_hex_is_named(value):
    _refused(_own({"15": {"allowed": [value]}}), f"policy PCR 15: {value!r} is not a 32-byte hex digest")
    _refused({"15": {"expected": value}}, f"Constellation measurement 15: {value!r} is not a 32-byte hex digest")


def test_unquoted_all_digit_hex_in_yaml_is_refused_not_misread():
    # YAML reads 64 unquoted zeros as the integer 0: the operator must quote hex values.
    _refused(f"version: 1\npcrs:\n  15:\n    allowed: [{ZERO}]\n", "policy PCR 15: 0 is not a 32-byte hex digest")


def test_hex_with_a_trailing_newline_is_named():
    _refused(f"version: 1\npcrs:\n  15:\n    allowed: |\n      {'0' * 63}\n", "is not a 32-byte hex digest")


@pytest.mark.parametrize(
    "doc,size",
    [
        (_own({"15": {"allowed": ["00" * 31]}}), 32),
        (_own({"15": {"allowed": ["00" * 33]}}), 32),
        (_own({"15": {"allowed": [ZERO]}}, hash_algorithm="sha384"), 48),
        (_own({"15": {"allowed": ["00" * 48]}}, hash_algorithm="sha1"), 20),
        ({"15": {"expected": "00" * 48}}, 32),
    ],
    ids=[
        "31 bytes",
        "33 bytes",
        "sha256 value in a sha384 policy",
        "sha384 value in a sha1 policy",
        "Constellation 48 bytes",
    ],
)
def test_wrong_digest_length_is_named(doc, size):
    _refused(doc, f"is not a {size}-byte hex digest")


@pytest.mark.parametrize("flag", ["yes", "true", 1, 0, None, []], ids=repr)
def test_warn_only_that_is_not_a_boolean_is_named(flag):
    _refused(
        _own({"15": {"allowed": [ZERO], "warn_only": flag}}),
        f"policy PCR 15 warn_only: must be true or false, got {flag!r}",
    )
    _refused(
        {"15": {"expected": ZERO, "warnOnly": flag}},
        f"Constellation measurement 15 warnOnly: must be true or false, got {flag!r}",
    )


@pytest.mark.parametrize("pcrs", [{}, [], None, "15"], ids=repr)
def test_empty_or_non_mapping_pcrs_is_refused(pcrs):
    _refused(_own(pcrs), "policy 'pcrs' must be a non-empty mapping of PCR index -> rule")


def test_empty_constellation_measurements_are_refused():
    _refused("{}", "Constellation measurements are empty")


@pytest.mark.parametrize("allowed", [[], None, {}], ids=repr)
def test_rule_without_allowed_values_is_refused(allowed):
    _refused(_own({"15": {"allowed": allowed}}), "policy PCR 15: 'allowed' must list at least one hex value")


@pytest.mark.parametrize(
    "doc,message",
    [
        (_own(hash_algorithm="md5"), "policy hash_algorithm 'md5' is not one of sha1, sha256, sha384, sha512"),
        (_own(ak_trust="none"), "policy ak_trust 'none' is not one of pcrs-only, ek-certificate"),
        (_own(ak_trust=2), "policy ak_trust 2 is not one of pcrs-only, ek-certificate"),
    ],
)
def test_bad_hash_algorithm_or_ak_trust_is_named(doc, message):
    _refused(doc, message)


@pytest.mark.parametrize("rule", [{"warnOnly": False}, {"expected": ZERO, "extra": 1}, ZERO, None], ids=repr)
def test_malformed_constellation_entry_is_named(rule):
    _refused({"15": rule}, "Constellation measurement 15: must be {'expected': <hex>, 'warnOnly': <bool>}")


# Found by the fuzzer (tests/security/fuzz.py policy): each of these escaped parse_policy as something other than PolicyError,
# or (the empty list) loaded as a rule no value can meet.
@pytest.mark.parametrize(
    "text,message",
    [
        ('{"15": {"expected": []}}', "Constellation measurement 15: 'expected' must list at least one hex value"),
        (
            "version: 1\nhash_algorithm: {a: 1}\npcrs: {15: {allowed: x}}\n",
            "policy hash_algorithm {'a': 1} is not one of",
        ),
        ("version: 1\nak_trust: [1]\npcrs: {15: {allowed: x}}\n", "policy ak_trust [1] is not one of"),
        ("version: 1\n7: x\n~: y\npcrs: {15: {allowed: x}}\n", "policy has unknown key(s): 7, None"),
        ("[" * 1100 + "]" * 1100, "policy is nested too deeply to be a measurement policy"),
        ("version: " + "9" * 5000 + "\n", "policy holds a value that cannot be read: Exceeds the limit (4300 digits)"),
    ],
    ids=[
        "empty expected list",
        "unhashable hash_algorithm",
        "unhashable ak_trust",
        "non-string keys",
        "deep nesting",
        "huge integer",
    ],
)
def test_hostile_policy_documents_are_refused_with_a_policy_error(text, message):
    _refused(text, message)


# The node-lock mark: PCR 15 of a node locked for a cluster (DESIGN section 3), known answers computed with openssl.
NODE_LOCK_VECTORS = [
    (bytes(32), "sha256", "6e96bce3e21a7bdcddd1735dab055b838071df7dc4ae4f0e16be0a1b4cb8735c"),
    (bytes(range(32)), "sha256", "a50dd72494e3fc05b10b15491b2cd5ced7fba50d26db6d330e630a0550c72a95"),
    (b"cluster-a", "sha256", "fd2cea4f963ea4a5a945815f597044b9357c54e6a26a082cc258b254d3edba5d"),
    (
        bytes(32),
        "sha384",
        "d0be7ae9ae67557f04d29fc00487b26da5732cb3723ccf02b3570edb4b27665a07c15c8047f3d70354fb370929ecf9dc",
    ),
    (
        bytes(range(32)),
        "sha384",
        "aed50b3068995d983da97f83641403f03e6c27f74d9e86d9e992376e6663593086aecbcfd4ed65c4960c3223f554456e",
    ),
]


@pytest.mark.parametrize(
    "cluster_id,hash_algorithm,expected",
    NODE_LOCK_VECTORS,
    ids=["zero ID sha256", "counting ID sha256", "text ID sha256", "zero ID sha384", "counting ID sha384"],
)
def test_node_lock_mark_known_answers(cluster_id, hash_algorithm, expected):
    assert node_lock_mark(cluster_id, hash_algorithm).hex() == expected


def test_node_lock_mark_is_what_a_tpm_extends_into_pcr_15(swtpm):
    cluster_id = os.urandom(32)
    with issuer.Tpm(swtpm.tcti) as tpm:
        assert tpm.read_pcrs(indices=(NODE_LOCK_PCR,))[NODE_LOCK_PCR] == bytes(32)
        tpm.pcr_event(NODE_LOCK_PCR, cluster_id)
        assert tpm.read_pcrs(indices=(NODE_LOCK_PCR,))[NODE_LOCK_PCR] == node_lock_mark(cluster_id)


# controller.resolve_policy: the policy plus the node-lock expectation for PCR 15.
CLUSTER_ID = bytes(range(32)).hex()
BASE_POLICY = {
    "version": 1,
    "ak_trust": "pcrs-only",
    "pcrs": {"4": {"allowed": [FIRMWARE_A]}, "15": {"allowed": [KERNEL], "warn_only": True}},
}


def test_resolve_policy_without_node_lock_keeps_the_policy():
    assert controller.resolve_policy(None, BASE_POLICY, None) == policy_from_document(BASE_POLICY)


def test_resolve_policy_unlocked_expects_zero_pcr_15_enforced():
    policy = controller.resolve_policy(None, BASE_POLICY, "unlocked")
    assert policy.rules[NODE_LOCK_PCR] == PcrRule(NODE_LOCK_PCR, (bytes(32),), False)
    assert policy.rules[4] == PcrRule(4, (bytes.fromhex(FIRMWARE_A),), False)


@pytest.mark.parametrize("node_lock", [CLUSTER_ID, CLUSTER_ID.upper()], ids=["lower-case", "upper-case"])
def test_resolve_policy_cluster_id_expects_the_node_lock_mark(node_lock):
    policy = controller.resolve_policy(None, BASE_POLICY, node_lock)
    assert policy.rules[NODE_LOCK_PCR] == PcrRule(NODE_LOCK_PCR, (bytes.fromhex(NODE_LOCK_VECTORS[1][2]),), False)


@pytest.mark.parametrize(
    "node_lock",
    [
        "locked",
        "",
        "Unlocked",
        CLUSTER_ID[:-1],
        CLUSTER_ID + "0",
        "g" * 64,
        "0x" + CLUSTER_ID[2:],
        " " + CLUSTER_ID[1:],
    ],
    ids=["word", "empty", "capitalised unlocked", "63 hex", "65 hex", "not hex", "0x prefix", "leading space"],
)
def test_resolve_policy_refuses_garbage_node_lock(node_lock):
    with pytest.raises(PolicyError, match="^node_lock must be 'unlocked' or a 64-hex cluster ID, got ") as refused:
        controller.resolve_policy(None, BASE_POLICY, node_lock)
    # The value is quoted, cut to a short prefix when long (refusals never echo much of their input).
    assert repr(node_lock)[:20] in str(refused.value)


def test_resolve_policy_reads_a_path_text_bytes_or_mapping(tmp_path):
    path = tmp_path / "policy.yml"
    path.write_text(OWN_YAML)
    expected = parse_policy(OWN_YAML)
    assert controller.resolve_policy(str(path), None, None) == expected
    assert controller.resolve_policy(None, OWN_YAML, None) == expected
    assert controller.resolve_policy(None, OWN_JSON.encode(), None) == expected
    assert controller.resolve_policy(None, json.loads(OWN_JSON), None) == expected


def test_resolve_policy_names_the_content_in_errors():
    with pytest.raises(PolicyError, match="^policy_content: policy version 2 is not supported"):
        controller.resolve_policy(None, "version: 2\npcrs: {}", None)
    with pytest.raises(PolicyError, match="^policy must be a mapping, got NoneType$"):
        controller.resolve_policy(None, None, None)


def test_resolve_policy_unlocked_follows_the_hash_algorithm():
    policy = controller.resolve_policy(
        None, {"version": 1, "hash_algorithm": "sha384", "pcrs": {"0": {"allowed": ["00" * 48]}}}, "unlocked"
    )
    assert policy.rules[NODE_LOCK_PCR].allowed == (bytes(48),)


def test_resolved_node_lock_against_a_real_tpm(swtpm):
    """A fresh node passes 'unlocked' and fails the cluster lock; after the lock, the reverse."""
    cluster_id = os.urandom(32)

    def verify(node_lock):
        nonce = os.urandom(32)
        with issuer.Tpm(swtpm.tcti) as tpm:
            evidence = issuer.issue_evidence(tpm, nonce, EphemeralKey.generate().public_bytes(), include_ek=False)
        policy_content = {
            "version": 1,
            "ak_trust": "pcrs-only",
            "pcrs": {"0": {"allowed": [evidence.pcrs["sha256"][0].hex()]}},
        }
        policy = controller.resolve_policy(None, policy_content, node_lock)
        try:
            Verifier(policy).verify(evidence.to_json(), nonce)
        except VerificationError as exc:
            return [m["pcr"] for m in exc.mismatches]
        return []

    assert verify("unlocked") == []
    assert verify(cluster_id.hex()) == [NODE_LOCK_PCR]
    with issuer.Tpm(swtpm.tcti) as tpm:
        tpm.pcr_event(NODE_LOCK_PCR, cluster_id)
    assert verify(cluster_id.hex()) == []
    assert verify("unlocked") == [NODE_LOCK_PCR]


def test_measurement_policy_with_rule_does_not_change_the_original():
    policy = MeasurementPolicy("sha256", {0: PcrRule(0, (bytes(32),))}, "pcrs-only")
    changed = policy.with_rule(NODE_LOCK_PCR, [bytes(32)], warn_only=True)
    assert NODE_LOCK_PCR not in policy.rules and changed.rules[NODE_LOCK_PCR].warn_only is True


# Properties (the coverage-guided fuzzer in tests/security/fuzz.py goes further, from real policies).
PROPERTIES = settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
_SIZES = {"sha1": 20, "sha256": 32, "sha384": 48, "sha512": 64}


@st.composite
def _policies(draw) -> MeasurementPolicy:
    hash_algorithm = draw(st.sampled_from(sorted(_SIZES)))
    indices = draw(st.sets(st.integers(0, 23), min_size=1, max_size=24))
    digests = st.lists(
        st.binary(min_size=_SIZES[hash_algorithm], max_size=_SIZES[hash_algorithm]), min_size=1, max_size=3
    )
    rules = {i: PcrRule(i, tuple(draw(digests)), draw(st.booleans())) for i in indices}
    return MeasurementPolicy(hash_algorithm, rules, draw(st.sampled_from(["pcrs-only", "ek-certificate"])))


@PROPERTIES
@given(policy=_policies(), as_yaml=st.booleans())
def test_every_policy_survives_a_round_trip_through_its_file(policy, as_yaml):
    text = yaml.safe_dump(policy.to_document()) if as_yaml else dump_policy(policy)
    assert parse_policy(text) == policy


@PROPERTIES
@given(policy=_policies())
def test_every_sha256_policy_reads_the_same_in_constellation_format(policy):
    if policy.hash_algorithm != "sha256":
        return
    doc = {
        str(i): {"expected": [v.hex() for v in rule.allowed], "warnOnly": rule.warn_only}
        for i, rule in policy.rules.items()
    }
    assert parse_policy(json.dumps(doc)).rules == policy.rules


_YAML_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=20)
    | st.sampled_from(["sha256", "pcrs-only", ZERO, "15", "allowed", "expected", "warnOnly", "version", "pcrs"]),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "version",
                    "pcrs",
                    "hash_algorithm",
                    "ak_trust",
                    "allowed",
                    "warn_only",
                    "expected",
                    "warnOnly",
                    "0",
                    "15",
                    "24",
                ]
            )
            | st.integers(-1, 30)
            | st.text(max_size=5),
            children,
            max_size=5,
        )
    ),
    max_leaves=25,
)


@PROPERTIES
@given(doc=_YAML_VALUES, as_yaml=st.booleans())
def test_any_document_is_a_policy_or_a_policy_error(doc, as_yaml):
    try:
        text = yaml.safe_dump(doc) if as_yaml else json.dumps(doc)
    except ValueError:
        return
    try:
        policy = parse_policy(text)
    except PolicyError as exc:
        assert str(exc).startswith("policy")
        return
    assert policy.rules and all(rule.allowed for rule in policy.rules.values())
