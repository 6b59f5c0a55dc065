"""Coverage-guided fuzzing (atheris / libFuzzer) of what a hostile node controls.

  python tests/security/fuzz.py evidence|policy|join|eventlog [--runs N] [--seed S] [--artifacts DIR]

Targets:
  evidence  the evidence parser and verifier (level 1 and level 2 verifiers), from genuine swtpm evidence
  policy    the measurement policy loader, our format and Constellation's, JSON and YAML
  join      the join service's request decoding (IssueJoinTicketRequest / IssueRejoinTicketRequest / ActivateTicketRequest
            protobuf) and step 1 of TicketIssuer (nonce, verify, node name, disk UUID, kubelet CSR, request binding, the
            registry's grant) and step 2's proof check; one input in GRPC_EVERY goes to the real service over gRPC/TLS,
            whose status must carry a stated reason
  eventlog  the TCG event log parser (eventlog.parse), its replay, descriptions and the golden-log differences, from
            logs shaped like a real VM's (OVMF + the Linux EFI stub), GRUB's strings and the lab's; every log is read
            or refused with an EventLogError naming the event

Seeds are genuine: evidence quoted by a real swtpm, the policy it meets, CSRs made for the node.
Mutations are structure-aware (tests/security/mutate.py) plus libFuzzer's byte mutations, and
atheris keeps the inputs that reach new code. Every input must be accepted or refused with a
stated reason (VerificationError.reason, PolicyError, Refusal.reason, an undecodable protobuf body);
anything else is counted as unhandled, its input written to --artifacts, and the exit status is 1.
An accepted evidence document must carry exactly the genuine quote, signature, key and PCRs.

The default run count is FUZZ_RUNS (env) or 12000 per target; FUZZ_RUNS=200000 for a long run.
"""

from __future__ import annotations

import argparse
import base64
import collections
import hashlib
import json
import os
import random
import re
import shutil
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import support  # noqa: E402  (puts the collection on sys.path)

support.unit_conftest()

import atheris  # noqa: E402

with atheris.instrument_imports(include=["ansible_collections.confidential.kubernetes"]):
    from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import eventlog, issuer
    from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.policy import (
        MeasurementPolicy,
        PcrRule,
        PolicyError,
        dump_policy,
        parse_policy,
    )
    from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.verifier import (
        VerificationError,
        Verifier,
        load_ca_certificates,
    )
    from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.seal import X25519, EphemeralKey
    from ansible_collections.confidential.kubernetes.plugins.module_utils._join import joinservice_pb2 as pb2
    from ansible_collections.confidential.kubernetes.plugins.module_utils._join.issuance import (
        JoinRequest,
        Refusal,
        RejoinRequest,
    )
    from ansible_collections.confidential.kubernetes.plugins.module_utils._join.nonces import MacNonces
    from ansible_collections.confidential.kubernetes.plugins.module_utils._join.tolerant import Undecodable, _tolerant

import grpc  # noqa: E402

import mutate  # noqa: E402

sys.path.insert(0, str(support.REPO / "tests" / "unit" / "plugins" / "module_utils" / "_attestation"))
import eventlogs  # noqa: E402  (the fixture logs the unit tests build)

POLICY_PCRS = (0, 4, 8, 9, 15)
DEFAULT_RUNS = 12000
GRPC_EVERY = 20


class Finding(Exception):
    """An input was handled, but wrongly (e.g. accepted although it is not the genuine evidence)."""


class Target:
    name = ""
    max_len = 400_000

    def __init__(self, tpms: support.ManufacturedTpms):
        self.seeds: list[bytes] = []

    def run(self, data: bytes) -> tuple[str, str]:
        """('accepted', detail) or ('rejected', reason); anything raised is unhandled."""
        raise NotImplementedError

    def mutate(self, data: bytes, rng: random.Random) -> bytes:
        raise NotImplementedError

    def close(self) -> None:
        return None


def _genuine(tcti: str, nonce: bytes, user_data: bytes, include_ek: bool = True, event_log=None):
    with issuer.Tpm(tcti) as tpm:
        return issuer.issue_evidence(tpm, nonce, user_data, include_ek=include_ek, event_log=event_log)


# Evidence arrives as bytes (the join service), or as text or an object (an Ansible task's `evidence` option, maybe
# from YAML). An input starting with one of these markers (never the start of JSON) is given to the verifier in
# that form: the rest as text that keeps lone surrogates, or that text loaded as JSON with its integer-looking
# top-level keys as integers, as YAML loads `1: x`.
AS_TEXT, AS_OBJECT = b"\x00S", b"\x00D"


def _text(body: bytes) -> str:
    try:
        return body.decode("utf-8", "surrogatepass")  # UTF-8 with encoded surrogates (ED A0 80) as lone surrogates
    except UnicodeDecodeError:
        return body.decode("utf-8", "surrogateescape")  # other invalid bytes as lone surrogates U+DC80..U+DCFF


def _document_form(data: bytes):
    """The document as the verifier gets it: bytes, or the text or object an input with a marker stands for."""
    form, body = data[:2], data[2:]
    if form == AS_TEXT:
        return _text(body)
    if form == AS_OBJECT:
        try:
            document = json.loads(_text(body))
        except (ValueError, RecursionError):
            return body  # not JSON: the verifier gets the bytes
        if isinstance(document, dict):
            return {int(key) if re.fullmatch(r"-?[0-9]{1,5}", key) else key: value for key, value in document.items()}
        return document
    return data


def _long_text_with_a_lone_surrogate(document: dict) -> bytes:
    """Issue 14: over 16,384 characters with a lone surrogate made parse_evidence raise UnicodeEncodeError."""
    text = json.dumps(dict(document, pad="\ud800" + "x" * 16_400), ensure_ascii=False)
    return AS_TEXT + text.encode("utf-8", "surrogatepass")


def _keys_of_mixed_types(document: dict) -> bytes:
    """Issue 14: an object with unknown keys of mixed types (integer and text) made sorted() raise TypeError."""
    return AS_OBJECT + json.dumps(dict(document, **{"1": "x", "extra": "y"})).encode()


class EvidenceTarget(Target):
    name = "evidence"

    def __init__(self, tpms):
        super().__init__(tpms)
        instance = tpms.start("lab")
        try:
            self.nonce = os.urandom(32)
            self.golden = _genuine(instance.tcti, self.nonce, EphemeralKey.generate().public_bytes())
            others = [
                _genuine(instance.tcti, self.nonce, EphemeralKey.generate().public_bytes(), include_ek=False),
                _genuine(
                    instance.tcti, self.nonce, os.urandom(32), event_log=eventlogs.ipl_log({9: ["/boot/vmlinuz"]})
                ),
            ]
        finally:
            instance.stop()
        values = self.golden.pcrs["sha256"]
        rules = {i: PcrRule(i, (values[i],)) for i in POLICY_PCRS}
        cas = load_ca_certificates(tpms.tpms["lab"].ca_pem)
        self.verifiers = [
            Verifier(MeasurementPolicy("sha256", rules, "pcrs-only")),
            Verifier(MeasurementPolicy("sha256", rules, "ek-certificate"), cas),
        ]
        genuine = [self.golden.to_json().encode()] + [e.to_json().encode() for e in others]
        self.documents = [json.loads(seed) for seed in genuine]
        golden = self.documents[0]
        self.seeds = genuine + [
            AS_TEXT + genuine[0],
            AS_OBJECT + genuine[0],
            _long_text_with_a_lone_surrogate(golden),
            _keys_of_mixed_types(golden),
        ]

    def run(self, data):
        verifier = self.verifiers[len(data) % 2]
        try:
            result = verifier.verify(_document_form(data), self.nonce)
        except VerificationError as exc:
            if not exc.reason or not str(exc):
                raise Finding(f"VerificationError without reason or message: {exc.reason!r}") from None
            return "rejected", exc.reason
        genuine = self.golden if result.evidence.user_data == self.golden.user_data else None
        signed = (result.evidence.quote, result.evidence.signature, result.evidence.ak_public)
        if (
            genuine is None
            or signed != (genuine.quote, genuine.signature, genuine.ak_public)
            or any(result.pcrs[i] != genuine.pcrs["sha256"][i] for i in POLICY_PCRS)
        ):
            # The other seeds are genuine too (same TPM, same nonce): accepted only if unchanged where it matters.
            if not any(document["quote"] == _b64(result.evidence.quote) for document in self.documents[1:]):
                raise Finding("evidence accepted that is not a genuine quote")
        return "accepted", "level-2 challenge" if result.challenge else "level-1"

    def mutate(self, data, rng):
        form, body = (data[:2], data[2:]) if data[:2] in (AS_TEXT, AS_OBJECT) else (b"", data)
        if rng.random() < 0.05:
            form = rng.choice([b"", AS_TEXT, AS_OBJECT])
        return form + mutate.mutate_json(body, rng, self.documents)


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


_POLICY_REASONS = [
    ("size", r"larger than"),
    ("not-yaml", r"neither JSON nor YAML"),
    ("not-mapping", r"must be a mapping, got"),
    ("unknown-key", r"unknown key"),
    ("version", r"version .* is not supported"),
    ("hash-algorithm", r"hash_algorithm"),
    ("ak-trust", r"ak_trust"),
    ("pcrs-shape", r"'pcrs' must be"),
    ("index", r"PCR index"),
    ("rule-shape", r"rule must be|must be \{"),
    ("allowed", r"'allowed' must|'expected' must"),
    ("hex", r"hex digest"),
    ("flag", r"must be true or false"),
    ("empty", r"are empty"),
    ("depth", r"nested too deeply"),
    ("unreadable-value", r"cannot be read"),
]


class PolicyTarget(Target):
    name = "policy"
    max_len = 300_000

    def __init__(self, tpms):
        super().__init__(tpms)
        instance = tpms.start("lab")
        try:
            self.nonce = os.urandom(32)
            self.golden = _genuine(instance.tcti, self.nonce, EphemeralKey.generate().public_bytes(), include_ek=False)
        finally:
            instance.stop()
        self.golden_json = self.golden.to_json().encode()
        values = self.golden.pcrs["sha256"]
        own = MeasurementPolicy("sha256", {i: PcrRule(i, (values[i],), i == 9) for i in POLICY_PCRS}, "pcrs-only")
        constellation = {str(i): {"expected": values[i].hex(), "warnOnly": i == 9} for i in POLICY_PCRS}
        import yaml

        self.seeds = [
            dump_policy(own).encode(),
            yaml.safe_dump(own.to_document()).encode(),
            json.dumps(constellation).encode(),
            yaml.safe_dump(constellation).encode(),
            dump_policy(MeasurementPolicy("sha1", {0: PcrRule(0, (bytes(20),))}, "ek-certificate")).encode(),
            b"version: 1\nhash_algorithm: sha384\npcrs:\n  15: {allowed: '" + b"00" * 48 + b"'}\n",
        ]
        self.documents = [yaml.safe_load(seed) for seed in self.seeds]

    def run(self, data):
        try:
            policy = parse_policy(data, "fuzzed policy")
        except PolicyError as exc:
            message = str(exc)
            if not message.startswith("fuzzed policy"):
                raise Finding(f"PolicyError does not name its source: {message[:200]}") from None
            return "rejected", next(
                (code for code, pattern in _POLICY_REASONS if re.search(pattern, message)), "policy-error"
            )
        # A policy that loads must be usable: verifying genuine evidence against it only ever refuses with a reason.
        if not isinstance(policy.rules, dict) or not all(
            isinstance(r.allowed, tuple) and r.allowed for r in policy.rules.values()
        ):
            raise Finding("policy loaded with an empty rule")
        try:
            Verifier(policy).verify(self.golden_json, self.nonce)
            outcome = "verifies golden"
        except VerificationError as exc:
            outcome = f"golden: {exc.reason}"
        return "accepted", outcome

    def mutate(self, data, rng):
        return mutate.mutate_policy(data, rng, self.documents)


class _Reusable(MacNonces):
    """The seeds' nonce stays valid, so mutated requests get past the nonce check to the checks behind it."""

    def __init__(self, nonce: bytes):
        super().__init__(ttl=60)
        self.nonce = nonce

    def check(self, nonce):
        return self._clock() + self.ttl if nonce == self.nonce else super().check(nonce)

    def consume(self, nonce):
        if nonce != self.nonce:
            super().consume(nonce)


class JoinTarget(Target):
    name = "join"

    def __init__(self, tpms):
        super().__init__(tpms)
        import tempfile
        from join_harness import DISK_UUID, JoinLab, bound_user_data, make_csr
        from cryptography.hazmat.primitives.asymmetric import ec, rsa

        self.swtpm = tpms.start("lab")
        self.lab = JoinLab(Path(tempfile.mkdtemp(prefix="ck-fuzz-join-")), self.swtpm)
        self.nonce = os.urandom(32)
        # The real service (gRPC over TLS) around the issuer: every GRPC_EVERY-th input goes over the wire.
        self.lab.enrol(self.swtpm.tcti, "worker-1", disk_uuid=DISK_UUID)
        self.service = self.lab.start("ek-certificate", nonces=_Reusable(self.nonce), ticket_rate=1e6, ticket_burst=1e6)
        self.issuer = self.service.issuer
        stub, self.channel = self.lab.stub(self.service)
        self.raw_calls = {
            kind: self.channel.unary_unary(f"/confidential.kubernetes.join.v1.JoinService/{method}")
            for kind, method in ((b"J", "IssueJoinTicket"), (b"R", "IssueRejoinTicket"), (b"A", "ActivateTicket"))
        }
        self.inputs = 0
        self.csrs = [
            make_csr("worker-1"),
            make_csr("cp-2"),
            make_csr("worker-1", rsa.generate_private_key(65537, 1024)),
            make_csr("worker-1", ec.generate_private_key(ec.SECP521R1())),
            make_csr(""),
        ]
        # Genuine evidence quotes the ephemeral key followed by the digest of exactly the request it comes with.
        bound = [
            bound_user_data(EphemeralKey.generate().public_bytes(), "join", "worker-1", False, DISK_UUID, self.csrs[0]),
            bound_user_data(
                EphemeralKey.generate(X25519).public_bytes(), "join", "", False, DISK_UUID.upper(), self.csrs[4]
            ),
            bound_user_data(EphemeralKey.generate().public_bytes(), "rejoin", "worker-1", False, DISK_UUID),
        ]
        evidence, nameless, rejoin = (_genuine(self.swtpm.tcti, self.nonce, data).to_json().encode() for data in bound)
        self.evidences = [evidence, nameless, rejoin]
        self.seeds = [
            b"J"
            + pb2.IssueJoinTicketRequest(
                evidence=evidence,
                nonce=self.nonce,
                node_name="worker-1",
                control_plane=False,
                kubelet_csr=self.csrs[0],
                disk_uuid=DISK_UUID,
            ).SerializeToString(),
            b"J"
            + pb2.IssueJoinTicketRequest(
                evidence=nameless,
                nonce=self.nonce,
                node_name="",
                control_plane=False,
                kubelet_csr=self.csrs[4],
                disk_uuid=DISK_UUID.upper(),
            ).SerializeToString(),
            b"R"
            + pb2.IssueRejoinTicketRequest(
                evidence=rejoin, nonce=self.nonce, node_name="worker-1", disk_uuid=DISK_UUID
            ).SerializeToString(),
            b"A" + pb2.ActivateTicketRequest(nonce=self.nonce, activation_proof=os.urandom(32)).SerializeToString(),
        ]
        self.evidence_documents = [json.loads(e) for e in self.evidences]

    def run(self, data):
        kind, body = data[:1], data[1:]
        self.inputs += 1
        if self.inputs % GRPC_EVERY == 0:
            return self._over_grpc(kind, body)
        # The service's own deserializer: what a request body becomes before the servicer sees it.
        request = _tolerant(_MESSAGES.get(kind, pb2.IssueJoinTicketRequest).FromString)(body)
        if isinstance(request, Undecodable):
            return "rejected", "protobuf-decode"
        try:
            # What the JoinServicer methods hand to the issuer.
            if kind == b"R":
                self.issuer.begin_rejoin(
                    RejoinRequest(request.evidence, request.nonce, request.node_name, request.disk_uuid)
                )
                return "accepted", "rejoin challenge"
            if kind == b"A":
                self.issuer.take(request.nonce, request.activation_proof)
                raise Finding("an activation proof of random bytes was accepted")
            challenge = self.issuer.begin_join(
                JoinRequest(
                    request.evidence,
                    request.nonce,
                    request.node_name,
                    request.control_plane,
                    request.kubelet_csr,
                    request.disk_uuid,
                )
            )
        except Refusal as refusal:
            if refusal.code not in ("INVALID_ARGUMENT", "PERMISSION_DENIED", "FAILED_PRECONDITION", "ABORTED"):
                raise Finding(f"refusal {refusal.reason} with status {refusal.code}") from None
            return "rejected", refusal.reason
        if challenge.node_name != "worker-1" or challenge.control_plane:
            raise Finding(
                f"the registry granted {challenge.node_name} (control plane: {challenge.control_plane}) to worker-1's TPM"
            )
        return "accepted", "join challenge"

    def _over_grpc(self, kind: bytes, body: bytes) -> tuple[str, str]:
        try:
            self.raw_calls.get(kind, self.raw_calls[b"J"])(body, timeout=60)
        except grpc.RpcError as error:
            reason = dict(error.trailing_metadata() or ()).get("confidential-kubernetes-reason")
            if error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in (error.details() or ""):
                return "rejected", "message-size (gRPC)"  # the service's max_receive_message_length (MAX_MESSAGE_BYTES)
            if error.code() in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL) or not reason:
                raise Finding(f"gRPC {error.code().name} without a stated reason: {error.details()}") from None
            return "rejected", f"{reason} (gRPC)"
        return "accepted", "over gRPC"

    def mutate(self, data, rng):
        kind, body = (data[:1], data[1:]) if data[:1] in _MESSAGES else (b"J", data)
        message_type = _MESSAGES[kind]
        op = rng.randrange(12)
        if op == 0:
            return rng.choice([b"J", b"R", b"A", b"X"]) + body
        if op == 1:
            return kind + mutate.mutate_bytes(body, rng)
        if op == 2:  # protobuf merges a concatenation: fields given twice, unknown fields
            extra = rng.choice(
                [
                    b"\x1a\x03cp1",
                    b"\x20\x01",
                    b"\x12\x00",
                    b"\xf8\x07\x01",
                    b"\x0a\xff\xff\xff\xff\x0f",
                    b"\x32\x02\xc3\x28",
                    rng.randbytes(rng.randrange(1, 12)),
                ]
            )
            return kind + (body + extra if rng.random() < 0.5 else extra + body)
        request = _tolerant(message_type.FromString)(body)
        if isinstance(request, Undecodable):
            return kind + mutate.mutate_bytes(body, rng)
        if kind == b"A":
            if op <= 6:
                request.activation_proof = mutate.mutate_bytes(request.activation_proof or os.urandom(32), rng)
            else:
                request.nonce = rng.choice([b"", os.urandom(32), self.nonce, mutate.mutate_bytes(self.nonce, rng)])
            return kind + request.SerializeToString()
        if op <= 6:
            request.evidence = mutate.mutate_json(
                request.evidence or rng.choice(self.evidences), rng, self.evidence_documents
            )
        elif op == 7:
            request.nonce = rng.choice(
                [
                    b"",
                    os.urandom(32),
                    self.nonce[:31],
                    self.nonce + b"\x00",
                    bytes(32),
                    mutate.mutate_bytes(self.nonce, rng),
                ]
            )
        elif op == 8:
            request.node_name = rng.choice(
                [
                    "Worker-1",
                    "worker_1",
                    "",
                    "a" * 254,
                    "worker-1.",
                    "-worker",
                    "cp-2",
                    "worker-1\u0000",
                    "w\u00f6rker",
                    "worker-1 ",
                    "x" * 63 + "." + "y" * 63,
                    "\U0001d518",
                    "..",
                    "worker-2",
                ]
            )
        elif op == 9 and kind != b"R":
            if rng.random() < 0.5:
                request.kubelet_csr = rng.choice(self.csrs)
            else:
                request.kubelet_csr = mutate.mutate_bytes(request.kubelet_csr or self.csrs[0], rng)
        elif op == 10:
            request.disk_uuid = rng.choice(
                [
                    "",
                    "not-a-uuid",
                    "0D3B1C4E-9F2A-4E57-8A61-2F4C9B7D5E13",
                    "0d3b1c4e9f2a4e578a612f4c9b7d5e13",
                    "0d3b1c4e-9f2a-4e57-8a61-2f4c9b7d5e13\n",
                    "\uff10" * 8 + "-9f2a-4e57-8a61-2f4c9b7d5e13",
                    "../../etc/passwd",
                    "{0d3b1c4e-9f2a-4e57-8a61-2f4c9b7d5e13}",
                ]
            )
        elif kind != b"R":
            request.control_plane = not request.control_plane
        return kind + request.SerializeToString()

    def close(self):
        self.channel.close()
        self.lab.close()
        self.swtpm.stop()
        shutil.rmtree(self.lab.dir, ignore_errors=True)


_EVENT_LOG_REASONS = [
    ("size", r"larger than"),
    ("empty", r"is empty"),
    ("not-bytes", r"must be bytes"),
    ("truncated", r"truncated"),
    ("not-crypto-agile", r"must be EV_NO_ACTION|Spec ID Event03"),
    ("spec-version", r"spec version"),
    ("algorithms", r"algorithm|digest size"),
    ("vendor-info", r"vendor information"),
    ("pcr-index", r"PCR index"),
    ("digest-count", r"digest\(s\)|two .* digests"),
    ("too-many-events", r"more than"),
    ("locality", r"StartupLocality"),
]


class EventLogTarget(Target):
    name = "eventlog"
    max_len = eventlog.MAX_EVENT_LOG_BYTES + 4096

    def __init__(self, tpms):
        super().__init__(tpms)
        golden = eventlogs.firmware_log(locality=None)
        self.golden = eventlog.golden_events(eventlog.parse(golden), "sha256")
        self.seeds = [
            golden,
            eventlogs.firmware_log(),
            eventlogs.firmware_log(command_line="quiet", banks=("sha256",)),
            eventlogs.firmware_log(banks=("sha1", "sha256", "sha384", "sha512")),
            eventlogs.ipl_log({8: ["grub_cmd: linux /vmlinuz", "kernel_cmdline: ro"], 9: ["/vmlinuz", "/initrd"]}),
            eventlog.build(("sha256",), []),
        ]

    def run(self, data):
        try:
            log = eventlog.parse(data)
            replayed = log.replay()
        except eventlog.EventLogError as exc:
            message = str(exc)
            if not message.startswith("event"):
                raise Finding(f"EventLogError does not name the log or the event: {message[:200]}") from None
            reason = next(
                (code for code, pattern in _EVENT_LOG_REASONS if re.search(pattern, message)), "event-log-error"
            )
            return "rejected", reason
        # A log that parses must be usable throughout: named, described (bounded), compared with the golden log.
        for event in log.events:
            if len(event.description) > eventlog.MAX_DESCRIPTION or not event.type_name.startswith("EV_"):
                raise Finding(f"event {event.number}: description or type name out of bounds")
        if "sha256" in replayed:
            for pcr in replayed["sha256"]:
                for difference in eventlog.differences(self.golden, log, "sha256", pcr):
                    difference.summary()
            eventlog.golden_events(log, "sha256")
        return "accepted", "replayed" if replayed else "no known bank"

    def mutate(self, data, rng):
        data = bytearray(data)
        choice = rng.random()
        if not data or choice < 0.15:
            return bytes(rng.choice(self.seeds)[: rng.randrange(1, 200)])  # truncated inside the header
        position = rng.randrange(len(data))
        if choice < 0.45:  # a size, count, PCR index or type field: boundary values
            value = rng.choice([0, 1, 2, 3, 8, 23, 24, 255, 0x7FFFFFFF, 0xFFFFFFFF, len(data), rng.getrandbits(32)])
            data[position : position + 4] = value.to_bytes(4, "little")
        elif choice < 0.6:  # an algorithm id or a digest size
            value = rng.choice([0x0004, 0x000B, 0x000C, 0x000D, 0x0012, 0, 0xFFFF, 20, 32, 65])
            data[position : position + 2] = value.to_bytes(2, "little")
        elif choice < 0.75:
            data[position] ^= 1 << rng.randrange(8)
        elif choice < 0.85:
            del data[position : position + rng.randrange(1, 64)]
        else:  # an event repeated or spliced in from another log
            other = rng.choice(self.seeds)
            start = rng.randrange(len(other))
            data[position:position] = other[start : start + rng.randrange(1, 400)]
        return bytes(data)


_MESSAGES = {b"J": pb2.IssueJoinTicketRequest, b"R": pb2.IssueRejoinTicketRequest, b"A": pb2.ActivateTicketRequest}
TARGETS = {t.name: t for t in (EvidenceTarget, PolicyTarget, JoinTarget, EventLogTarget)}


class Campaign:
    def __init__(self, target: Target, runs: int, artifacts: Path):
        self.target = target
        self.runs = runs
        self.artifacts = artifacts
        self.count = 0
        self.outcomes: collections.Counter = collections.Counter()
        self.reasons: collections.Counter = collections.Counter()
        self.unhandled: collections.Counter = collections.Counter()
        self.started = time.monotonic()
        self.cleanup: list[Path] = []

    def test_one_input(self, data: bytes) -> None:
        self.count += 1
        try:
            outcome, reason = self.target.run(data)
        except Exception as exc:  # noqa: BLE001 - the property under test: nothing else escapes
            self._record_unhandled(data, exc)
        else:
            self.outcomes[outcome] += 1
            self.reasons[f"{outcome}:{reason}"] += 1
        if self.count >= self.runs:
            self.finish()

    def _record_unhandled(self, data: bytes, exc: BaseException) -> None:
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        where = f"{type(exc).__name__} at {Path(frame.filename).name}:{frame.lineno}"
        self.unhandled[where] += 1
        if self.unhandled[where] == 1:
            self.artifacts.mkdir(parents=True, exist_ok=True)
            path = self.artifacts / f"{self.target.name}-{hashlib.sha256(data).hexdigest()[:16]}"
            path.write_bytes(data)
            sys.stderr.write(
                f"UNHANDLED {where}: {str(exc)[:300]}\n  input: {path}\n{''.join(traceback.format_exception(exc)[-6:])}\n"
            )

    def summary(self) -> str:
        reasons = ", ".join(
            f"{reason.split(':', 1)[1]} {n}"
            for reason, n in self.reasons.most_common()
            if reason.startswith("rejected:")
        )
        accepted = ", ".join(
            f"{reason.split(':', 1)[1]} {n}"
            for reason, n in self.reasons.most_common()
            if reason.startswith("accepted:")
        )
        return (
            f"fuzz {self.target.name}: {self.count} inputs, {self.outcomes['accepted']} accepted ({accepted or '-'}), "
            f"{self.outcomes['rejected']} rejected (reasons: {reasons or '-'}), {sum(self.unhandled.values())} unhandled, "
            f"{time.monotonic() - self.started:.1f} s"
        )

    def finish(self) -> None:
        sys.stdout.write(self.summary() + "\n")
        for where, n in self.unhandled.most_common():
            sys.stdout.write(f"  unhandled: {where} x{n}\n")
        sys.stdout.flush()
        self.target.close()
        for directory in self.cleanup:
            shutil.rmtree(directory, ignore_errors=True)
        # libFuzzer would go on mutating; the campaign has its count.
        os._exit(1 if self.unhandled else 0)


def main(argv: list[str] | None = None) -> None:
    """Fuzz one target; ends the process with 0, or 1 if any input was unhandled (libFuzzer never returns)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", choices=sorted(TARGETS))
    parser.add_argument("--runs", type=int, default=int(os.environ.get("FUZZ_RUNS", DEFAULT_RUNS)))
    parser.add_argument("--seed", type=int, default=int(os.environ.get("FUZZ_SEED", "1")))
    parser.add_argument(
        "--artifacts", type=Path, default=Path(os.environ.get("FUZZ_ARTIFACTS", "/tmp/ck-fuzz-artifacts"))
    )
    args = parser.parse_args(argv)
    tpms = support.ManufacturedTpms()
    target = TARGETS[args.target](tpms)
    campaign = Campaign(target, args.runs, args.artifacts)
    campaign.cleanup.append(tpms.dir)
    corpus = tpms.dir / f"corpus-{args.target}"
    corpus.mkdir()
    for index, seed in enumerate(target.seeds):
        (corpus / f"seed-{index}").write_bytes(seed)

    def custom_mutator(data: bytes, max_size: int, seed: int) -> bytes:
        rng = random.Random(seed)
        if rng.random() < 0.2:
            return atheris.Mutate(data, max_size)
        if not data or rng.random() < 0.5:
            # Half the time start again from a genuine document, so that mutations reach the checks behind the parser.
            data = rng.choice(target.seeds)
        try:
            result = target.mutate(data, rng)
        except (RecursionError, TypeError, ValueError):
            # A document nested deeper than the mutator walks, or YAML values JSON cannot hold: libFuzzer changes its bytes.
            return atheris.Mutate(data, max_size)
        return result[:max_size]

    campaign.started = time.monotonic()
    atheris.Setup(
        [
            sys.argv[0],
            f"-seed={args.seed}",
            f"-runs={args.runs * 2}",
            f"-max_len={target.max_len}",
            "-rss_limit_mb=3072",
            "-timeout=60",
            "-mutate_depth=2",
            "-print_final_stats=0",
            "-print_pcs=0",
            str(corpus),
        ],
        campaign.test_one_input,
        custom_mutator=custom_mutator,
    )
    try:
        atheris.Fuzz()
    finally:
        campaign.finish()


if __name__ == "__main__":
    main()
