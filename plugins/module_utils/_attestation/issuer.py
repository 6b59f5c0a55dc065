# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node side: TPM quotes, PCR reads, EK certificates and credential activation on tpm2-pytss.

libtpms has three transient object slots and swtpm no resource manager, so
every handle and session created here is flushed before the TPM is closed.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

from .evidence import variant_of
from .variants import Evidence

DEVICE_PATHS = ("/dev/tpmrm0",)
SWTPM_SOCKET_PATHS = ("/run/tpm/swtpm.sock",)
ALL_PCRS = tuple(range(24))
PCR_READ_BATCH = 8
EK_RSA2048_PERSISTENT_HANDLE = 0x81010001
AK_TEMPLATE = "ecc256:ecdsa_sha256:null"


class TpmError(RuntimeError):
    """The TPM is missing, unreachable or refused an operation; the message says which."""


def resolve_tcti(setting: str | None) -> str:
    """``auto`` (or empty) picks /dev/tpmrm0 on real hosts, the lab's swtpm socket otherwise."""
    if setting and setting != "auto":
        return setting
    for path in DEVICE_PATHS:
        if os.path.exists(path):
            return f"device:{path}"
    for path in SWTPM_SOCKET_PATHS:
        if os.path.exists(path):
            return f"swtpm:path={path}"
    raise TpmError(
        f"no TPM found: none of {', '.join(DEVICE_PATHS + SWTPM_SOCKET_PATHS)} exists; set the TCTI explicitly"
    )


def _tss():
    # ESYS logs every TPM error response to stderr; callers report errors themselves.
    os.environ.setdefault("TSS2_LOG", "all+NONE")
    try:
        import tpm2_pytss
        from tpm2_pytss import constants, types
    except ImportError as exc:
        raise TpmError(f"tpm2-pytss is not installed on this node ({exc}); install the node requirements") from None
    return tpm2_pytss, constants, types


class Tpm:
    """One ESAPI connection; use as a context manager so every handle is flushed."""

    def __init__(self, tcti: str | None = None):
        self.tcti = resolve_tcti(tcti)
        self._tss, self._c, self._t = _tss()
        self._handles: list = []
        try:
            self.esapi = self._tss.ESAPI(self.tcti)
        except Exception as exc:
            raise TpmError(f"cannot open TPM via TCTI {self.tcti!r}: {exc}") from None

    def __enter__(self) -> "Tpm":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        for handle in reversed(self._handles):
            try:
                self.esapi.flush_context(handle)
            except Exception:  # noqa: BLE001 - best effort: the TPM may already be gone
                pass
        self._handles.clear()
        self.esapi.close()

    def _track(self, handle):
        self._handles.append(handle)
        return handle

    def flush(self, handle) -> None:
        """Flush a transient object or session; persistent objects are only closed."""
        if handle in self._handles:
            self._handles.remove(handle)
            self.esapi.flush_context(handle)
        else:
            self.esapi.tr_close(handle)

    @contextmanager
    def _call(self, what: str):
        try:
            yield
        except self._tss.TSS2_Exception as exc:
            raise TpmError(f"TPM refused {what}: {exc}") from None

    def read_pcrs(self, bank: str = "sha256", indices: tuple[int, ...] = ALL_PCRS) -> dict[int, bytes]:
        values: dict[int, bytes] = {}
        for start in range(0, len(indices), PCR_READ_BATCH):
            batch = indices[start : start + PCR_READ_BATCH]
            selection = self._t.TPML_PCR_SELECTION.parse(f"{bank}:{','.join(map(str, batch))}")
            with self._call("PCR read"):
                digests = self.esapi.pcr_read(selection)[2]
            if len(digests) != len(batch):
                raise TpmError(f"TPM returned {len(digests)} values for PCR(s) {batch} in bank {bank}")
            values.update({index: bytes(digest) for index, digest in zip(batch, digests)})
        return values

    def attestation_key(self):
        """The AK: an ECC P-256 restricted signing primary in the endorsement hierarchy.

        Primaries are derived from the hierarchy seed, so the same template gives
        the same key (and name) on every call until the TPM is cleared.
        """
        attrs = self._c.TPMA_OBJECT
        attributes = (
            attrs.FIXEDTPM
            | attrs.FIXEDPARENT
            | attrs.SENSITIVEDATAORIGIN
            | attrs.USERWITHAUTH
            | attrs.RESTRICTED
            | attrs.SIGN_ENCRYPT
            | attrs.NODA
        )
        template = self._t.TPM2B_PUBLIC.parse(AK_TEMPLATE, objectAttributes=attributes, nameAlg="sha256")
        with self._call("creating the attestation key"):
            handle, public = self.esapi.create_primary(None, template, self._c.ESYS_TR.ENDORSEMENT)[:2]
        return self._track(handle), public.publicArea.marshal()

    def endorsement_key(self):
        """(EK certificate DER or None, EK handle, EK TPMT_PUBLIC) for the RSA-2048 EK."""
        from tpm2_pytss.utils import NoSuchIndex, create_ek_template

        def nv_read(index) -> bytes:
            try:
                nv = self.esapi.tr_from_tpmpublic(index)
            except self._tss.TSS2_Exception:
                raise NoSuchIndex(index) from None
            try:
                size = self.esapi.nv_read_public(nv)[0].nvPublic.dataSize
                data = b""
                while len(data) < size:
                    data += bytes(self.esapi.nv_read(nv, min(512, size - len(data)), len(data)))
                return data
            finally:
                self.esapi.tr_close(nv)

        with self._call("reading the EK certificate"):
            certificate, template = create_ek_template("EK-RSA2048", nv_read)
        certificate = bytes(certificate) if certificate else None
        persistent = self._persistent_ek(template)
        if persistent is not None:
            return certificate, persistent[0], persistent[1]
        with self._call("creating the endorsement key"):
            handle, public = self.esapi.create_primary(None, template, self._c.ESYS_TR.ENDORSEMENT)[:2]
        return certificate, self._track(handle), public.publicArea.marshal()

    def _persistent_ek(self, template):
        """The EK at the TCG handle 0x81010001, when it is there and was made from this template.

        Re-creating an RSA EK costs a second or more on real TPMs; the persisted
        one is the same key when its public area matches the template's.
        """
        try:
            handle = self.esapi.tr_from_tpmpublic(EK_RSA2048_PERSISTENT_HANDLE)
        except self._tss.TSS2_Exception:
            return None
        public = self.esapi.read_public(handle)[0].publicArea
        wanted = template.publicArea
        same = (
            public.type == wanted.type
            and public.nameAlg == wanted.nameAlg
            and int(public.objectAttributes) == int(wanted.objectAttributes)
            and bytes(public.authPolicy) == bytes(wanted.authPolicy)
        )
        if not same:
            self.esapi.tr_close(handle)
            return None
        return handle, public.marshal()

    def quote(
        self,
        ak,
        qualifying: bytes,
        indices: tuple[int, ...] = ALL_PCRS,
        bank: str = "sha256",
        more_banks: dict[str, tuple[int, ...]] | None = None,
    ) -> tuple[bytes, bytes]:
        """TPM2_Quote of ``indices`` in ``bank``, then of each of ``more_banks`` (a bank the TPM has not allocated
        comes back selected with no PCR)."""
        banks = {bank: indices, **(more_banks or {})}
        text = "+".join(f"{name}:{','.join(map(str, selected))}" for name, selected in banks.items())
        selection = self._t.TPML_PCR_SELECTION.parse(text)
        scheme = self._t.TPMT_SIG_SCHEME(scheme=self._c.TPM2_ALG.NULL)
        with self._call("quote"):
            attest, signature = self.esapi.quote(ak, selection, self._t.TPM2B_DATA(qualifying), scheme)
        return bytes(attest), signature.marshal()

    def activate_credential(self, ak, ek, blob: bytes, encrypted_seed: bytes) -> bytes:
        """TPM2_ActivateCredential; the EK's policy needs PolicySecret(TPM_RH_ENDORSEMENT)."""
        c, t = self._c, self._t
        with self._call("starting the EK policy session"):
            session = self.esapi.start_auth_session(
                c.ESYS_TR.NONE,
                c.ESYS_TR.NONE,
                c.TPM2_SE.POLICY,
                t.TPMT_SYM_DEF(algorithm=c.TPM2_ALG.NULL),
                c.TPM2_ALG.SHA256,
            )
        self._track(session)
        try:
            with self._call("PolicySecret for the EK"):
                self.esapi.policy_secret(c.ESYS_TR.ENDORSEMENT, session, b"", b"", b"", 0)
            id_object = t.TPM2B_ID_OBJECT.unmarshal(len(blob).to_bytes(2, "big") + blob)[0]
            secret = t.TPM2B_ENCRYPTED_SECRET.unmarshal(len(encrypted_seed).to_bytes(2, "big") + encrypted_seed)[0]
            with self._call("credential activation"):
                return bytes(
                    self.esapi.activate_credential(
                        ak, ek, id_object, secret, session1=c.ESYS_TR.PASSWORD, session2=session
                    )
                )
        finally:
            self.flush(session)

    def pcr_event(self, index: int, data: bytes) -> None:
        handle = getattr(self._c.ESYS_TR, f"PCR{index}")
        with self._call(f"PCR_Event on PCR {index}"):
            self.esapi.pcr_event(handle, data)


def issue_evidence(
    tpm: Tpm,
    nonce: bytes,
    user_data: bytes,
    include_ek: bool = True,
    event_log: bytes | None = None,
    variant: str = "tpm",
    warnings: list[str] | None = None,
) -> Evidence:
    """Evidence of ``variant`` (the TPM's quote unless said otherwise; variants.py) bound to ``nonce`` and
    ``user_data``; EvidenceError for a variant that is not registered. What the node should know (an event log left
    out) is appended to ``warnings``."""
    options: dict = dict(include_ek=include_ek, event_log=event_log)
    if warnings is not None:  # only asked of a variant by a caller that reads them
        options["warnings"] = warnings
    return variant_of(variant).issue(tpm, nonce, user_data, **options)


def answer_challenge(tpm: Tpm, blob: bytes, encrypted_seed: bytes) -> bytes:
    """Activate a verifier's credential with this TPM's AK and EK."""
    ak = tpm.attestation_key()[0]
    ek = tpm.endorsement_key()[1]
    return tpm.activate_credential(ak, ek, blob, encrypted_seed)
