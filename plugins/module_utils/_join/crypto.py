# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The CPU-bound steps of a join, without state: the join service runs them in its worker processes (``workers.py``).

``JoinCrypto.check`` is step 1's work (verify the evidence against the policy it is handed, check the request and that
the quote covers it, make the credential); ``JoinCrypto.seal_ticket`` is step 2's (sign the kubelet certificate, seal
the ticket). Neither touches a nonce, the registry, the control-plane slot or a token: those decisions stay in the
service's one process, around these calls, so each stays exactly-once. A worker holds the cluster CA (it signs) and
the EK CAs; never the root secrets or the nonce key. A ticket's plaintext passes through it to be sealed. Requests and
answers are picklable values only.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field, replace

try:
    from cryptography import x509
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
except ImportError:  # reported by the service at start
    pass

from .._attestation import tpm2
from .._attestation.evidence import EvidenceError, parse_evidence
from .._attestation.policy import NODE_LOCK_PCR, MeasurementPolicy, node_lock_mark
from .._attestation.tpm_evidence import EK_REQUIRED_ATTRIBUTES, check_ek_template
from .._attestation.tpm_variant import PCR15_NEXT, TPM
from .._attestation.verifier import VerificationError, VerificationResult, Verifier
from .._crypto import seal
from .._reset import NEEDS_RESET
from .attest import NODE_FAILURES, ClockInfo, quoted_identity
from .pki import ClusterPki, PkiError, RequestError, check_disk_uuid, check_node_name, load_kubelet_csr
from .protocol import JOIN, JoinTicket, RejoinTicket
from .request import BindingError, digest_matches, identity_of, public_key_digest, request_digest, split_user_data

CREDENTIAL_SECRET_BYTES = 32
STATUS_FOR_REASON = {
    "malformed": "INVALID_ARGUMENT",
    "nonce-unknown": "FAILED_PRECONDITION",
    "nonce-reused": "FAILED_PRECONDITION",
    "nonce-stale": "FAILED_PRECONDITION",
    "nonce-limit": "RESOURCE_EXHAUSTED",
    "node-name": "INVALID_ARGUMENT",
    "disk-uuid": "INVALID_ARGUMENT",
    "csr-malformed": "INVALID_ARGUMENT",
    "csr-signature": "INVALID_ARGUMENT",
    "csr-key": "INVALID_ARGUMENT",
    "csr-subject": "PERMISSION_DENIED",
    "ephemeral-key": "INVALID_ARGUMENT",
    "activation-unknown": "FAILED_PRECONDITION",
    "busy": "RESOURCE_EXHAUSTED",
}


class Refusal(Exception):
    """The service refuses a request. ``code`` is a gRPC status name, ``reason`` a stable code the client can act on."""

    def __init__(self, code: str, reason: str, message: str, mismatches: list[dict] | None = None):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.mismatches = mismatches or []
        # What the caller is told, when it must not learn the message (the service's log has that).
        self.public: str | None = None

    def generic(self, public: str) -> "Refusal":
        """The refusal, with ``public`` told to the caller instead of its message."""
        self.public = public
        return self

    def __reduce__(self):
        # Raised in a worker process, re-raised in the service's: pickled with all four fields.
        return (type(self), (self.code, self.reason, str(self), self.mismatches))

    @classmethod
    def of(cls, reason: str, message: str, mismatches: list[dict] | None = None) -> "Refusal":
        return cls(STATUS_FOR_REASON.get(reason, "PERMISSION_DENIED"), reason, message, mismatches)


@dataclass(frozen=True, repr=False)
class CheckRequest:
    """Step 1's input: what the node sent, with the measurement policy current when it arrived."""

    policy: MeasurementPolicy
    flow: str
    evidence: bytes
    nonce: bytes
    node_name: str
    control_plane: bool
    disk_uuid: str
    kubelet_csr: bytes


@dataclass(frozen=True, repr=False)
class Checked:
    """Step 1's output: the request verified and covered by the quote, the node's EK identity (digest and certificate),
    what the verification established, and the credential. Small: it crosses from a worker back to the service."""

    ak_trust_level: int
    warnings: list[dict]
    ephemeral_key: bytes
    ek: str
    ek_certificate: bytes | None
    kubelet_key: bytes
    secret: bytes = field(repr=False)
    credential: tpm2.Credential
    # The AK proven by this activation and the TPM's clock info in the quote: recorded for continuous attestation.
    ak_name: bytes = b""
    clock: ClockInfo | None = None


@dataclass(frozen=True, repr=False)
class AttestCheck:
    """A continuous attestation's input: the evidence, its nonce, and the policy current when it arrived."""

    policy: MeasurementPolicy
    evidence: bytes
    nonce: bytes


@dataclass(frozen=True, repr=False)
class Attested:
    """What a continuous attestation's evidence established: whose TPM (EK identity) quoted with which AK, its clock
    info, and the verification's failure where the quote verified but the node's measurements do not pass (``reason``
    empty when they do)."""

    ek: str
    ak_name: bytes
    clock: ClockInfo
    reason: str = ""
    message: str = ""
    mismatches: list[dict] = field(default_factory=list)
    warnings: list[dict] = field(default_factory=list)


@dataclass(frozen=True, repr=False)
class SealRequest:
    """Step 2's input: the ticket, and for a join the kubelet key (DER) to certify for the granted name."""

    ticket: JoinTicket | RejoinTicket
    ephemeral_key: bytes
    flow: str
    nonce: bytes
    kubelet_key: bytes = b""
    node_name: str = ""
    now: datetime.datetime | None = None


class _Verified:
    """The part of a VerificationResult ``JoinCrypto._ek`` reads, for evidence not verified yet."""

    def __init__(self, evidence):
        self.evidence = evidence


def _clock_of(quote: bytes) -> ClockInfo:
    """The clock info of a quote the verifier parsed already (it is signed: TPMS_ATTEST carries it)."""
    attest = tpm2.parse_attest(quote)
    return ClockInfo(attest.clock, attest.reset_count, attest.restart_count, bool(attest.safe))


class JoinCrypto:
    """Verifiers (made again only when the policy changes), the cluster CA, and the two CPU-bound steps."""

    def __init__(self, pki: ClusterPki, ek_cas: list, cluster_id: bytes, verifier_id: str):
        self._pki = pki
        self._ek_cas = ek_cas
        self._cluster_id = cluster_id
        self._verifier_id = verifier_id
        self._verifier_cache: tuple[MeasurementPolicy, Verifier, Verifier, Verifier] | None = None

    def _verifiers(self, policy: MeasurementPolicy) -> tuple[Verifier, Verifier, Verifier]:
        """(verifier of fresh nodes, of rejoining members, of running members); a policy from another process compares
        equal."""
        cached = self._verifier_cache
        if cached is None or not (cached[0] is policy or cached[0] == policy):
            unlocked = bytes(len(node_lock_mark(b"", policy.hash_algorithm)))
            member = node_lock_mark(self._cluster_id, policy.hash_algorithm)
            cached = (
                policy,
                Verifier(policy.with_rule(NODE_LOCK_PCR, [unlocked]), self._ek_cas),
                Verifier(policy.with_rule(NODE_LOCK_PCR, [unlocked, member]), self._ek_cas),
                # A running member carries the cluster's mark: PCR 15 zero means it rebooted and did not rejoin.
                Verifier(policy.with_rule(NODE_LOCK_PCR, [member]), self._ek_cas),
            )
            self._verifier_cache = cached
        return cached[1], cached[2], cached[3]

    def check(self, request: CheckRequest) -> Checked:
        fresh_only = request.flow == JOIN
        fresh, member, _running = self._verifiers(request.policy)
        try:
            verified = (fresh if fresh_only else member).verify(request.evidence, request.nonce)
        except VerificationError as exc:
            raise Refusal.of(exc.reason, self._explain(exc, request.policy, fresh_only), exc.mismatches) from None
        if verified.variant != TPM.name:  # a CVM's proof of possession and identity are issue 40 item 5
            raise Refusal.of("variant", f"the join service takes TPM evidence only, not {verified.variant}")
        node_name = request.node_name
        try:
            if node_name:
                check_node_name(node_name)
            check_disk_uuid(request.disk_uuid)
            csr = load_kubelet_csr(request.kubelet_csr, node_name) if fresh_only else None
        except RequestError as exc:
            raise Refusal.of(exc.reason, str(exc)) from None
        try:
            ephemeral_key, quoted = split_user_data(verified.evidence.user_data)
        except BindingError as exc:
            raise Refusal.of("request-binding", str(exc)) from None
        csr_key = csr.public_key() if csr is not None else None
        kubelet_key = (
            csr_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
            if csr_key is not None
            else b""
        )
        kubelet_digest = public_key_digest(csr_key) if csr_key is not None else b""
        if not digest_matches(
            quoted, request_digest(request.flow, node_name, request.control_plane, request.disk_uuid, kubelet_digest)
        ):
            raise Refusal.of(
                "request-binding",
                "the quote does not cover this request: the node name, role, disk UUID or kubelet key "
                "differ from what the TPM quoted",
            )
        try:
            seal.check_public_key(ephemeral_key)
        except seal.SealError as exc:
            raise Refusal.of(
                "ephemeral-key", f"the evidence's user_data is not a usable ephemeral key: {exc}"
            ) from None
        ek = self._ek(verified)
        secret, credential = self._credential(verified, ek)
        evidence = verified.evidence
        return Checked(
            verified.ak_trust_level,
            verified.warnings,
            ephemeral_key,
            identity_of(ek),
            evidence.ek_certificate,
            kubelet_key,
            secret,
            credential,
            verified.ak_name,
            _clock_of(evidence.quote),
        )

    def attest(self, request: AttestCheck) -> Attested:
        """Verify a running member's evidence with the join flow's verifier (PCR 15: this cluster's mark). A failure
        the quote itself states (the policy's PCRs, the event log) is returned for the caller to judge once it knows
        the AK is the node's own; any other failure is a Refusal."""
        try:
            evidence = parse_evidence(request.evidence)
            if evidence.variant != TPM.name:
                raise Refusal.of("variant", f"the join service takes TPM evidence only, not {evidence.variant}")
            ak_name = tpm2.parse_public(bytes(evidence.ak_public)).name
        except (EvidenceError, tpm2.StructureError) as exc:
            raise Refusal.of("malformed", f"the evidence is unreadable: {exc}") from None
        ek = identity_of(self._ek(_Verified(evidence)))
        if quoted_identity(evidence.user_data) != ek:
            raise Refusal.of(
                "request-binding",
                "the quote does not name the EK the evidence carries: continuous attestation quotes "
                "'confidential.kubernetes/attest/v1' followed by the node's EK identity",
            )
        running = self._verifiers(request.policy)[2]
        try:
            verified = running.verify(evidence, request.nonce)
        except VerificationError as exc:
            if exc.reason not in NODE_FAILURES:
                raise Refusal.of(exc.reason, str(exc), exc.mismatches) from None
            return Attested(ek, ak_name, _clock_of(evidence.quote), exc.reason, str(exc), exc.mismatches, exc.warnings)
        return Attested(ek, verified.ak_name, _clock_of(evidence.quote), warnings=verified.warnings)

    @staticmethod
    def _ek(verified: VerificationResult | _Verified) -> tpm2.Public:
        """The node is its EK: the evidence must carry the EK public key (and carries its certificate where one exists)."""
        evidence = verified.evidence
        if evidence.ek_public is None:
            raise Refusal.of(
                "ek-missing",
                "the evidence carries no EK public key: the join service identifies a node by its TPM's "
                "endorsement key",
            )
        try:
            ek = tpm2.parse_public(evidence.ek_public)
            ek_key = public_key_digest(ek.public_key())
        except tpm2.StructureError as exc:
            raise Refusal.of("malformed", f"evidence field 'ek_public': {exc}") from None
        try:
            check_ek_template(ek)
        except VerificationError as exc:
            raise Refusal.of(exc.reason, str(exc)) from None
        if evidence.ek_certificate is not None:
            try:
                certified = public_key_digest(x509.load_der_x509_certificate(evidence.ek_certificate).public_key())
            except (ValueError, TypeError, UnsupportedAlgorithm):
                raise Refusal.of(
                    "malformed", "evidence field 'ek_certificate' is not a readable DER certificate"
                ) from None
            if certified != ek_key:
                raise Refusal.of("ek-certificate", "the evidence's EK public key is not the key of its EK certificate")
        return ek

    @staticmethod
    def _credential(verified: VerificationResult, ek: tpm2.Public) -> tuple[bytes, tpm2.Credential]:
        """At level 2 the verifier's challenge; at level 1 one made here for the evidence's EK (identity needs it too)."""
        if verified.challenge is not None:
            return verified.challenge.secret, verified.challenge.credential
        missing = [name for name, bit in EK_REQUIRED_ATTRIBUTES.items() if not ek.attributes & bit]
        if missing:
            raise Refusal.of("ek-missing", f"the evidence's EK lacks required attribute(s): {', '.join(missing)}")
        secret = os.urandom(CREDENTIAL_SECRET_BYTES)
        try:
            return secret, tpm2.make_credential(ek, verified.ak_name, secret)
        except tpm2.StructureError as exc:
            raise Refusal.of("ek-missing", f"cannot make a credential for the evidence's EK: {exc}") from None

    def _explain(self, error: VerificationError, policy: MeasurementPolicy, fresh_only: bool) -> str:
        for mismatch in error.mismatches:
            # A CVM variant's mismatches name fields, not PCRs.
            if mismatch.get("pcr") != NODE_LOCK_PCR:
                continue
            # What PCR 15 shows here takes the place of the verifier's every-case advice.
            base = str(error).replace(f" {PCR15_NEXT}.", "").replace(f" {PCR15_NEXT}", "")
            if fresh_only and mismatch["actual"] == node_lock_mark(self._cluster_id, policy.hash_algorithm).hex():
                return f"{base}; PCR 15 shows the node is already a member of this cluster: a rebooted node asks for a rejoin ticket"
            return f"{base}; PCR 15 shows the node is locked for another cluster (or was tampered with): {NEEDS_RESET}"
        return str(error)

    def seal_ticket(self, request: SealRequest) -> bytes:
        """For a join, sign the kubelet certificate into the ticket first; then seal it to the node's ephemeral key."""
        ticket = request.ticket
        if request.kubelet_key:
            try:
                key = serialization.load_der_public_key(request.kubelet_key)
                ticket = replace(
                    ticket,
                    kubelet_client_crt=self._pki.sign_kubelet_client(key, request.node_name, request.now).decode(),
                )
            except PkiError as exc:
                raise Refusal("INTERNAL", "pki", str(exc)) from None
        try:
            return seal.seal(ticket.to_bytes(), request.ephemeral_key, request.flow, request.nonce, self._verifier_id)
        except seal.SealError as exc:
            raise Refusal.of(
                "ephemeral-key", f"the evidence's user_data is not a usable ephemeral key: {exc}"
            ) from None
