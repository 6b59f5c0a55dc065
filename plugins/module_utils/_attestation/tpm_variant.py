# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The TPM evidence variant (DESIGN section 3): a TPM 2.0 quote of the PCRs by an attestation key, checked in pure
Python over ``cryptography``; the first entry of the variant registry (variants.py)."""

from __future__ import annotations

import hmac
import os
from functools import lru_cache

try:
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
except ImportError:  # reported by the modules through missing_required_lib()
    pass

from .._reset import NEEDS_RESET
from . import eventlog, logcache, tpm2
from .evidence import qualifying_data
from .issuer import Tpm, TpmError
from .policy import NODE_LOCK_PCR, MeasurementPolicy
from .tpm_evidence import BODY_OPTIONAL, BODY_REQUIRED, ActivationChallenge, TpmResult, check_ek_template, parse_body
from .tpm_evidence import TpmEvidence as Evidence
from .variants import Variant, VariantVerifier, VerificationError, register

AK_REQUIRED_ATTRIBUTES = {
    "restricted": tpm2.ATTR_RESTRICTED,
    "sign": tpm2.ATTR_SIGN,
    "fixedTPM": tpm2.ATTR_FIXED_TPM,
    "fixedParent": tpm2.ATTR_FIXED_PARENT,
    "sensitiveDataOrigin": tpm2.ATTR_SENSITIVE_DATA_ORIGIN,
}
_AK_REQUIRED_MASK = sum(AK_REQUIRED_ATTRIBUTES.values())
_NO_VALUES: dict[int, bytes] = {}  # a bank the evidence lacks; only read
_SCHEMES_FOR_KEY = {tpm2.ALG_ECC: (tpm2.ALG_ECDSA,), tpm2.ALG_RSA: (tpm2.ALG_RSASSA, tpm2.ALG_RSAPSS)}


# The next step after a PCR mismatch: either the node is not the image that was enrolled, or the image is new.
_PCR_POLICY_NEXT = (
    "If this node runs a known-good image that the policy does not know yet, enrol it "
    "(confidential.kubernetes.measurements; several golden nodes with measurements_merge=true); "
    "otherwise it is not the image you enrolled and gets no cluster secret"
)
# PCR 15 is the node lock, not the image: measurements.yml refuses to enrol it, so its mismatch has its own next step
# (the join service, which knows the cluster, says more precisely which, in its place).
PCR15_NEXT = (
    "PCR 15 is the node lock, not the image: it differs when the node is locked to another cluster (or to this one "
    "while a fresh node is expected), or was rebooted and has not rejoined. A member of this cluster: reboot it and let "
    "it rejoin (it does at boot; recover.yml when no join service answers). A node to start afresh: " + NEEDS_RESET
)


@lru_cache(maxsize=64)
def _usable_public(raw: bytes) -> tpm2.Public:
    """A TPMT_PUBLIC parsed, its key built and its name computed once per exact byte string: a node quotes
    with the same AK join after join. Keyed by the bytes themselves, so a different AK is never served from here."""
    public = tpm2.parse_public(raw)
    # ak_public is not covered by the signature: prove now that it names a usable key.
    public.public_key()
    public.name
    return public


class TpmVerifier(VariantVerifier):
    """The checks of TPM evidence, in the order of DESIGN section 3."""

    def __init__(self, policy: MeasurementPolicy, ek_ca_certificates: list[x509.Certificate], now):
        if not set(policy.rules) - {NODE_LOCK_PCR}:
            # A policy of CVM sections only (the join service and the hand-overs add PCR 15's rule to every policy):
            # with no rule of what booted, every quote would pass whatever it booted.
            raise VerificationError(
                "policy",
                "the measurement policy has no 'pcrs' rule besides the node lock (PCR 15), so it accepts no tpm evidence",
            )
        self.policy = policy
        self.ek_ca_certificates = ek_ca_certificates
        self._now = now
        # What every verify asks of the policy, worked out once.
        self._ak_trust_level = policy.ak_trust_level
        self._bank_id = tpm2.HASH_IDS[policy.hash_algorithm]
        self._policy_pcrs = frozenset(policy.rules)
        self._policy_mask = sum(1 << index for index in policy.rules)
        self._rules = tuple((index, rule.allowed, rule.warn_only) for index, rule in sorted(policy.rules.items()))

    def verify(self, evidence: Evidence, nonce: bytes) -> TpmResult:
        field_name = "ak_public"
        try:
            ak = _usable_public(bytes(evidence.ak_public))
            field_name = "quote"
            attest = tpm2.parse_attest(evidence.quote)
            field_name = "signature"
            signature = tpm2.parse_signature(evidence.signature)
        except tpm2.StructureError as exc:
            raise VerificationError("malformed", f"evidence field {field_name!r}: {exc}") from None
        self._check_signature_scheme(ak, signature)
        self._check_ak_attributes(ak)
        if not tpm2.verify_signature(ak, signature, evidence.quote):
            raise VerificationError("signature", "quote signature does not verify with the attestation key")
        if attest.magic != tpm2.TPM_GENERATED_VALUE:
            raise VerificationError("magic", f"quote magic is 0x{attest.magic:08x}, not TPM_GENERATED_VALUE 0xff544347")
        if attest.type != tpm2.TPM_ST_ATTEST_QUOTE:
            raise VerificationError("attest-type", f"attestation type is 0x{attest.type:04x}, not a quote (0x8018)")
        if not hmac.compare_digest(attest.extra_data, qualifying_data(nonce, evidence.user_data)):
            raise VerificationError("nonce", "quote is not bound to this nonce and ephemeral key (extraData mismatch)")
        pcrs = self._check_pcr_selection_and_digest(evidence, attest, signature.hash_alg)
        log = _check_event_log(evidence, attest, ak.name) if evidence.event_log else None
        warnings = self._check_policy(pcrs, log)
        challenge = self._check_ak_trust(evidence, ak)
        return TpmResult(evidence, ak.name, self._ak_trust_level, pcrs, warnings, challenge)

    @staticmethod
    def _check_signature_scheme(ak: tpm2.Public, signature: tpm2.Signature) -> None:
        allowed = _SCHEMES_FOR_KEY[ak.type]
        if signature.alg not in allowed:
            raise VerificationError(
                "signature-scheme",
                f"signature algorithm 0x{signature.alg:04x} does not match the AK type 0x{ak.type:04x}",
            )
        scheme_alg, scheme_hash = ak.scheme
        if scheme_alg != tpm2.ALG_NULL and (scheme_alg, scheme_hash) != (signature.alg, signature.hash_alg):
            raise VerificationError("signature-scheme", "signature scheme differs from the scheme fixed in the AK")
        if signature.hash_alg not in (tpm2.ALG_SHA256, tpm2.ALG_SHA384, tpm2.ALG_SHA512):
            raise VerificationError(
                "signature-scheme", f"signature hash 0x{signature.hash_alg:04x} is not SHA-256 or stronger"
            )

    @staticmethod
    def _check_ak_attributes(ak: tpm2.Public) -> None:
        if ak.attributes & (_AK_REQUIRED_MASK | tpm2.ATTR_DECRYPT) == _AK_REQUIRED_MASK:
            return
        missing = [name for name, bit in AK_REQUIRED_ATTRIBUTES.items() if not ak.attributes & bit]
        if ak.attributes & tpm2.ATTR_DECRYPT:
            missing.append("not decrypt")
        if missing:
            raise VerificationError(
                "ak-attributes", f"attestation key lacks required attribute(s): {', '.join(missing)}"
            )

    def _check_pcr_selection_and_digest(
        self, evidence: Evidence, attest: tpm2.Attest, digest_alg: int
    ) -> dict[int, bytes]:
        policy_bank: tuple[int, ...] = ()
        covered = 0
        quoted: tuple[bytes, ...] = ()
        absent: list[int] = []
        for alg, indices, mask in attest.pcr_selection:
            if alg == self._bank_id:
                policy_bank, covered = indices, mask
            bank = evidence.pcrs.get(tpm2.HASHES.get(alg), _NO_VALUES)
            try:
                quoted += tuple(map(bank.__getitem__, indices))
            except KeyError:
                absent += (i for i in indices if i not in bank)
        if self._policy_mask & ~covered:
            missing = sorted(self._policy_pcrs.difference(policy_bank))
            raise VerificationError(
                "pcr-selection",
                f"quote does not cover policy PCR(s) {', '.join(map(str, missing))} in bank {self.policy.hash_algorithm}",
            )
        if absent:
            raise VerificationError(
                "pcr-digest", f"evidence lacks values for quoted PCR(s) {', '.join(map(str, absent))}"
            )
        # TPM2_Quote digests the selected PCRs with the signing scheme's hash.
        if not hmac.compare_digest(tpm2.pcr_digest(digest_alg, quoted), attest.pcr_digest):
            raise VerificationError("pcr-digest", "PCR values in the evidence do not match the digest the TPM quoted")
        # Only quoted values: a value the evidence carries beyond the selection is not covered by the signature.
        bank = evidence.pcrs.get(self.policy.hash_algorithm, _NO_VALUES)
        if len(bank) == len(policy_bank):
            return dict(bank)  # each quoted index was found in this bank above: it holds exactly the quoted values
        return dict(zip(policy_bank, map(bank.__getitem__, policy_bank)))

    def _check_policy(self, pcrs: dict[int, bytes], log: eventlog.EventLog | None = None) -> list[dict]:
        mismatches, warnings = [], []
        for index, allowed_values, warn_only in self._rules:
            actual = pcrs[index]
            for allowed in allowed_values:
                if hmac.compare_digest(actual, allowed):
                    break
            else:
                entry = {
                    "pcr": index,
                    "actual": actual.hex(),
                    "allowed": [v.hex() for v in allowed_values],
                    "warn_only": warn_only,
                }
                (warnings if warn_only else mismatches).append(entry)
        if (mismatches or warnings) and log is not None and self.policy.event_log:
            self._explain(mismatches + warnings, log)
        if mismatches:
            names = ", ".join(str(m["pcr"]) for m in mismatches)
            values = "; ".join(
                f"PCR {m['pcr']} is {m['actual']}, the policy allows {', '.join(m['allowed'])}" for m in mismatches
            )
            events = "; ".join(d["summary"] for m in mismatches for d in m.get("events", ()))
            raise VerificationError(
                "pcr-policy",
                f"PCR(s) {names} do not match the measurement policy"
                + (f": {events}" if events else "")
                + f" ({values}). {_pcr_policy_next(mismatches)}",
                mismatches,
                warnings,
            )
        return warnings

    def _explain(self, entries: list[dict], log: eventlog.EventLog) -> None:
        """Name the events behind each failing PCR: those that differ from the enrolled golden log."""
        bank = self.policy.hash_algorithm
        if bank not in log.banks:
            return
        for entry in entries:
            found = eventlog.differences(self.policy.event_log, log, bank, entry["pcr"])
            entry["events"] = [dict(d.to_result(), summary=d.summary()) for d in found]

    def _check_ak_trust(self, evidence: Evidence, ak: tpm2.Public) -> ActivationChallenge | None:
        if self._ak_trust_level < 2:
            return None
        if evidence.ek_certificate is None or evidence.ek_public is None:
            raise VerificationError(
                "ek-certificate",
                "policy requires AK trust level 2 but the evidence carries no EK certificate and EK public key: "
                "the TPM holds no EK certificate in NV (TCG indices 0x01c00002 for RSA, 0x01c0000a for ECC P-256); "
                "provision the vendor's, or enrol the policy with measurements_ak_trust=pcrs-only (AK trust level 1)",
            )
        if not self.ek_ca_certificates:
            raise VerificationError(
                "ek-ca",
                "policy requires AK trust level 2 but no EK CA certificate is configured: "
                "set confidential_ek_ca_file to a PEM file of your TPM vendors' EK CA certificates",
            )
        try:
            certificate = x509.load_der_x509_certificate(evidence.ek_certificate)
            ek = tpm2.parse_public(evidence.ek_public)
            # ek_public is not covered by any signature: prove now that it names a usable key (as for the AK).
            ek_key = _spki(ek.public_key())
        except (ValueError, tpm2.StructureError) as exc:
            raise VerificationError("malformed", f"EK certificate or EK public key is unreadable: {exc}") from None
        try:
            self._check_chain(certificate)
        except ValueError as exc:  # cryptography parses a certificate's fields on first use
            raise VerificationError("malformed", f"EK certificate is unreadable: {exc}") from None
        try:
            certified_key = _spki(certificate.public_key())
        except (ValueError, UnsupportedAlgorithm) as exc:
            raise VerificationError("ek-certificate", f"EK certificate holds an unusable public key: {exc}") from None
        if certified_key != ek_key:
            raise VerificationError(
                "ek-certificate", "EK public key in the evidence is not the key of the EK certificate"
            )
        check_ek_template(ek)
        secret = os.urandom(32)
        try:
            credential = tpm2.make_credential(ek, ak.name, secret)
        except tpm2.StructureError as exc:
            raise VerificationError("ek-certificate", f"cannot make a credential for this EK: {exc}") from None
        return ActivationChallenge(ak.name, credential, secret)

    def _check_chain(self, certificate: x509.Certificate) -> None:
        """The EK certificate must be issued by a CA certificate of the configured bundle."""
        now = self._now()
        if not certificate.not_valid_before_utc <= now <= certificate.not_valid_after_utc:
            stamp = "%Y-%m-%dT%H:%M:%SZ"
            raise VerificationError(
                "ek-certificate",
                f"EK certificate is outside its validity period ({certificate.not_valid_before_utc:{stamp}} to "
                f"{certificate.not_valid_after_utc:{stamp}}; the verifier's clock says {now:{stamp}}): check that "
                "clock, else the TPM needs a new EK certificate",
            )
        for anchor in self.ek_ca_certificates:
            if anchor.subject != certificate.issuer or not _is_ca(anchor):
                continue
            if not anchor.not_valid_before_utc <= now <= anchor.not_valid_after_utc:
                continue
            try:
                certificate.verify_directly_issued_by(anchor)
            except (ValueError, TypeError, InvalidSignature, UnsupportedAlgorithm):
                continue
            return
        issuer = certificate.issuer.rfc4514_string()
        raise VerificationError(
            "ek-certificate",
            f"EK certificate does not chain to the configured EK CA (issuer {issuer}): add the certificate of "
            f"{issuer} - the vendor's CA, often an intermediate, that issued the EK certificate - to "
            "confidential_ek_ca_file (openssl verify -partial_chain -CAfile <that file> <EK certificate> checks it)",
        )


@lru_cache(maxsize=4)
def _parsed_event_log(raw: bytes) -> tuple[eventlog.EventLog, dict[str, dict[int, bytes]]]:
    """A node's own log parsed and replayed once per exact byte string, for the node's side (what to quote); the
    verifier, which sees every node's logs, uses PARSED_EVENT_LOGS below instead."""
    log = eventlog.parse(raw)
    return log, log.replay()


def _parse_log(raw: bytes) -> tuple[eventlog.EventLog, dict[str, dict[int, bytes] | None]]:
    """A log parsed, and a dict for its banks' replays: each bank is replayed when a quote first covers it."""
    log = eventlog.parse(raw)
    eventlog.startup_locality(log)  # a malformed StartupLocality event makes the log malformed, as a replay would
    return log, {}


# Parsed logs and their replays, one slot per attestation key (logcache.py): a node sends the same log at every
# attestation, and a node sending other logs replaces only its own entry.
PARSED_EVENT_LOGS: logcache.LogCache[tuple[eventlog.EventLog, dict[str, dict[int, bytes] | None]]] = logcache.LogCache()


def _check_event_log(evidence: Evidence, attest: tpm2.Attest, ak_name: bytes) -> eventlog.EventLog:
    """The log must replay to the quoted value of every PCR it extends, in every quoted bank it has."""
    try:
        log, replayed = PARSED_EVENT_LOGS.get(ak_name, bytes(evidence.event_log), _parse_log)
    except eventlog.EventLogError as exc:
        raise VerificationError("malformed", f"evidence field 'event_log': {exc}") from None
    compared = False
    differing = []
    for alg, indices, _mask in attest.pcr_selection:
        bank = tpm2.HASHES.get(alg)
        if bank in replayed:
            values = replayed[bank]
        else:
            values = replayed[bank] = eventlog.replay_bank(log, bank) if bank is not None else None
        # A bank the quote selects without a PCR of it (a TPM that has not allocated the bank) proves nothing.
        if values is None or not indices:
            continue
        compared = True
        quoted = evidence.pcrs.get(bank, _NO_VALUES)
        differing += (
            {"pcr": i, "bank": bank, "quoted": quoted[i].hex(), "replayed": values[i].hex()}
            for i in indices
            if i in values and not hmac.compare_digest(values[i], quoted[i])
        )
    if not compared:
        raise VerificationError(
            "event-log-mismatch", f"the event log has no bank the quote covers (it has {', '.join(log.banks)})"
        )
    if differing:
        names = ", ".join(f"{d['bank']}:{d['pcr']}" for d in differing)
        raise VerificationError(
            "event-log-mismatch", f"the event log does not replay to the quoted PCR(s) {names}", differing
        )
    return log


def _pcr_policy_next(mismatches: list[dict]) -> str:
    """What to do next: enrol an image for the image's PCRs, reboot and rejoin or reset for the node lock's."""
    steps = [PCR15_NEXT] if any(m["pcr"] == NODE_LOCK_PCR for m in mismatches) else []
    if any(m["pcr"] != NODE_LOCK_PCR for m in mismatches):
        steps.append(_PCR_POLICY_NEXT)
    return ". ".join(steps)


def _log_banks_to_quote(raw: bytes) -> dict[str, tuple[int, ...]]:
    """The banks besides sha256 to quote for a log without sha256 (a SHA-1 format log): the PCRs it extends."""
    log, replayed = _parsed_event_log(bytes(raw))
    if "sha256" in replayed:
        return {}
    return {bank: tuple(sorted(values)) for bank, values in replayed.items() if values}


def _allocated(device: Tpm, bank: str, indices: tuple[int, ...]) -> bool:
    """Whether the TPM has this bank (a TPM reads no value of a bank it has not allocated)."""
    try:
        device.read_pcrs(bank, indices[:1])
    except TpmError:
        return False
    return True


def _spki(public_key) -> bytes:
    """A public key of any type as SubjectPublicKeyInfo DER, so that keys of different types compare unequal instead of failing."""
    return public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _is_ca(certificate: x509.Certificate) -> bool:
    try:
        return certificate.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        return False


class TpmVariant(Variant):
    name = "tpm"
    body_required = BODY_REQUIRED
    body_optional = BODY_OPTIONAL

    def parse_body(self, document: dict, user_data: bytes) -> Evidence:
        return parse_body(document, user_data)

    def verifier(self, policy: MeasurementPolicy, ek_ca_certificates: list[x509.Certificate], now) -> TpmVerifier:
        return TpmVerifier(policy, ek_ca_certificates, now)

    def issue(
        self,
        device: Tpm,
        nonce: bytes,
        user_data: bytes,
        include_ek: bool = True,
        event_log: bytes | None = None,
        warnings: list[str] | None = None,
    ) -> Evidence:
        """Quote every sha256 PCR over SHA-256(nonce || SHA-256(user_data)); with ``include_ek`` the EK public key (the
        TPM's identity, which the join service proves by credential activation) and its certificate where one exists.

        A log without a sha256 bank (the SHA-1 format) has its bank's PCRs quoted too, so that the verifier can replay
        it; on a TPM that has not allocated that bank the log proves nothing and is left out, with a warning appended
        to ``warnings``."""
        ak, ak_public = device.attestation_key()
        ek_certificate = ek_public = None
        if include_ek:
            ek_certificate, ek, ek_public = device.endorsement_key()
            device.flush(ek)
        wanted = _log_banks_to_quote(event_log) if event_log else {}
        more_banks = {bank: indices for bank, indices in wanted.items() if _allocated(device, bank, indices)}
        for _attempt in range(3):
            before = device.read_pcrs()
            pcrs = {"sha256": before, **{bank: device.read_pcrs(bank, i) for bank, i in more_banks.items()}}
            attest, signature = device.quote(ak, qualifying_data(nonce, user_data), more_banks=more_banks)
            # A PCR extended between read and quote would make the digest check fail.
            if device.read_pcrs() == before and all(device.read_pcrs(b, i) == pcrs[b] for b, i in more_banks.items()):
                break
        else:
            raise TpmError("PCRs kept changing while quoting; retry when the node is idle")
        device.flush(ak)
        if wanted and not more_banks:
            if warnings is not None:
                warnings.append(
                    f"the event log is in the {', '.join(wanted)} bank only, which this TPM has not allocated: "
                    "no quote can cover it, so the evidence goes without it (its PCRs are checked as quoted)"
                )
            event_log = None
        return Evidence(
            variant=self.name,
            ak_public=ak_public,
            quote=attest,
            signature=signature,
            pcrs=pcrs,
            user_data=user_data,
            ek_public=ek_public,
            ek_certificate=ek_certificate,
            event_log=event_log or None,
        )


TPM = register(TpmVariant())
