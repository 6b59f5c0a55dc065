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

from . import eventlog, tpm2
from .evidence import Evidence, qualifying_data
from .issuer import Tpm, TpmError
from .policy import MeasurementPolicy
from .variants import Variant, VariantVerifier, register
from .verifier import ActivationChallenge, VerificationError, VerificationResult, check_ek_template

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
        self.policy = policy
        self.ek_ca_certificates = ek_ca_certificates
        self._now = now
        # What every verify asks of the policy, worked out once.
        self._ak_trust_level = policy.ak_trust_level
        self._bank_id = tpm2.HASH_IDS[policy.hash_algorithm]
        self._policy_pcrs = frozenset(policy.rules)
        self._policy_mask = sum(1 << index for index in policy.rules)
        self._rules = tuple((index, rule.allowed, rule.warn_only) for index, rule in sorted(policy.rules.items()))

    def verify(self, evidence: Evidence, nonce: bytes) -> VerificationResult:
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
        log = _check_event_log(evidence, attest) if evidence.event_log else None
        warnings = self._check_policy(pcrs, log)
        challenge = self._check_ak_trust(evidence, ak)
        return VerificationResult(evidence, ak.name, self._ak_trust_level, pcrs, warnings, challenge)

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
                + f" ({values}). {_PCR_POLICY_NEXT}",
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


@lru_cache(maxsize=64)
def _parsed_event_log(raw: bytes) -> tuple[eventlog.EventLog, dict[str, dict[int, bytes]]]:
    """A log parsed and replayed once per exact byte string: a node sends the same log at every attestation."""
    log = eventlog.parse(raw)
    return log, log.replay()


def _check_event_log(evidence: Evidence, attest: tpm2.Attest) -> eventlog.EventLog:
    """The log must replay to the quoted value of every PCR it extends, in every quoted bank it has."""
    try:
        log, replayed = _parsed_event_log(bytes(evidence.event_log))
    except eventlog.EventLogError as exc:
        raise VerificationError("malformed", f"evidence field 'event_log': {exc}") from None
    compared = False
    differing = []
    for alg, indices, _mask in attest.pcr_selection:
        bank = tpm2.HASHES.get(alg)
        values = replayed.get(bank)
        if values is None:
            continue
        compared = True
        quoted = evidence.pcrs[bank]
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

    def verifier(self, policy: MeasurementPolicy, ek_ca_certificates: list[x509.Certificate], now) -> TpmVerifier:
        return TpmVerifier(policy, ek_ca_certificates, now)

    def issue(
        self, device: Tpm, nonce: bytes, user_data: bytes, include_ek: bool = True, event_log: bytes | None = None
    ) -> Evidence:
        """Quote every sha256 PCR over SHA-256(nonce || SHA-256(user_data)); with ``include_ek`` the EK public key (the
        TPM's identity, which the join service proves by credential activation) and its certificate where one exists."""
        ak, ak_public = device.attestation_key()
        ek_certificate = ek_public = None
        if include_ek:
            ek_certificate, ek, ek_public = device.endorsement_key()
            device.flush(ek)
        for _attempt in range(3):
            before = device.read_pcrs()
            attest, signature = device.quote(ak, qualifying_data(nonce, user_data))
            # A PCR extended between read and quote would make the digest check fail.
            if device.read_pcrs() == before:
                break
        else:
            raise TpmError("PCRs kept changing while quoting; retry when the node is idle")
        device.flush(ak)
        return Evidence(
            variant=self.name,
            ak_public=ak_public,
            quote=attest,
            signature=signature,
            pcrs={"sha256": before},
            user_data=user_data,
            ek_public=ek_public,
            ek_certificate=ek_certificate,
            event_log=event_log or None,
        )


TPM = register(TpmVariant())
