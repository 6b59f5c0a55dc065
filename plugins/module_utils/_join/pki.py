# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The cluster PKI as the join service uses it: request checks, kubelet client certificates, control-plane files."""

from __future__ import annotations

import datetime
import os
import re
from dataclasses import dataclass

try:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
except ImportError:  # reported by the service at start
    pass

from .._files import FileTooLargeError, read_bounded
from .._kubeadm import ca_cert_hash
from .protocol import CONTROL_PLANE_FILE_MODES

MAX_CSR_BYTES = 16 * 1024
KUBELET_CERT_VALIDITY = datetime.timedelta(days=365)
# Tolerate clocks of nodes a little behind the service's.
BACKDATE = datetime.timedelta(minutes=5)
NODES_GROUP = "system:nodes"
NODE_USER_PREFIX = "system:node:"
# X.520's upper bound for a common name, which cryptography enforces when it builds the kubelet subject.
MAX_COMMON_NAME = 64
RSA_MIN_BITS = 2048
RSA_MAX_BITS = 8192
EC_CURVES = ("secp256r1", "secp384r1")
MAX_PKI_FILE_BYTES = 64 * 1024
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


class RequestError(ValueError):
    """A join request field is unacceptable; ``reason`` is a stable code."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class PkiError(RuntimeError):
    """The cluster PKI on this host is missing or unreadable; the join service cannot serve joins."""


def check_node_name(node_name: str) -> str:
    """Kubernetes node names are DNS-1123 subdomains: lower case, at most 253 characters."""
    if not isinstance(node_name, str) or len(node_name) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(node_name):
        raise RequestError(
            "node-name",
            f"node name {node_name!r} is not a DNS-1123 subdomain (lower-case letters, digits, '-' and '.', "
            "at most 253 characters)",
        )
    return node_name


def check_disk_uuid(disk_uuid: str) -> str:
    if not isinstance(disk_uuid, str) or not _UUID.fullmatch(disk_uuid):
        raise RequestError("disk-uuid", f"disk UUID {disk_uuid!r} is not a UUID (8-4-4-4-12 hex digits)")
    return disk_uuid.lower()


def kubelet_subject(node_name: str) -> x509.Name:
    """The kubelet's identity; without a name (a node the registry names) the group only."""
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, NODES_GROUP)]
    if node_name:
        attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, NODE_USER_PREFIX + node_name))
    return x509.Name(attributes)


def _attributes(name: x509.Name) -> list[tuple[str, str]]:
    return sorted((attribute.oid.dotted_string, str(attribute.value)) for attribute in name)


def load_kubelet_csr(pem: bytes, node_name: str) -> x509.CertificateSigningRequest:
    """The kubelet's CSR: readable, self-signed, a strong key, and the identity the node asked for.

    Only its key goes into the certificate, which names the node the registry granted; the subject must still be the
    node's own request (``O=system:nodes,CN=system:node:<name>``, or ``O=system:nodes`` alone when the node asks the
    registry for its name), so that a CSR made for another node is refused rather than silently renamed.
    """
    if len(NODE_USER_PREFIX + node_name) > MAX_COMMON_NAME:
        raise RequestError(
            "node-name",
            f"node name {node_name!r} is too long for a kubelet client certificate: "
            f"'{NODE_USER_PREFIX}<node name>' may have at most {MAX_COMMON_NAME} characters",
        )
    if len(pem) > MAX_CSR_BYTES:
        raise RequestError("csr-malformed", f"kubelet CSR is larger than {MAX_CSR_BYTES} bytes")
    try:
        csr = x509.load_pem_x509_csr(pem)
    except ValueError:
        raise RequestError("csr-malformed", "kubelet CSR is not a PEM certificate signing request") from None
    try:
        signed = csr.is_signature_valid
    except Exception:  # noqa: BLE001 - cryptography raises several types for unsupported signature algorithms
        signed = False
    if not signed:
        raise RequestError("csr-signature", "kubelet CSR signature does not verify with its own public key")
    _check_key(csr.public_key())
    if _attributes(csr.subject) != _attributes(kubelet_subject(node_name)):
        wanted = f"O={NODES_GROUP},CN={NODE_USER_PREFIX}{node_name}" if node_name else f"O={NODES_GROUP}"
        raise RequestError(
            "csr-subject",
            f"kubelet CSR subject {csr.subject.rfc4514_string()!r} is not "
            f"'{wanted}': a node may only ask for its own identity",
        )
    return csr


def _check_key(key: object) -> None:
    if isinstance(key, rsa.RSAPublicKey):
        if not RSA_MIN_BITS <= key.key_size <= RSA_MAX_BITS:
            raise RequestError(
                "csr-key",
                f"kubelet CSR has an RSA-{key.key_size} key; RSA keys must have {RSA_MIN_BITS} to {RSA_MAX_BITS} bits",
            )
        return
    if isinstance(key, ec.EllipticCurvePublicKey):
        if key.curve.name not in EC_CURVES:
            raise RequestError(
                "csr-key", f"kubelet CSR has an EC key on {key.curve.name}; only P-256 and P-384 are accepted"
            )
        return
    raise RequestError(
        "csr-key", f"kubelet CSR has a {type(key).__name__} key; use RSA >= {RSA_MIN_BITS} bits or EC P-256/P-384"
    )


def _read(path: str) -> bytes:
    try:
        return read_bounded(path, MAX_PKI_FILE_BYTES)
    except OSError as exc:
        raise PkiError(
            f"cannot read {path}: {exc.strerror}; the join service must run on a control-plane node with the cluster PKI"
        ) from None
    except FileTooLargeError as exc:
        raise PkiError(str(exc)) from None


@dataclass(frozen=True, repr=False)
class ClusterPki:
    """The cluster CA (certificate and key) from the kubeadm PKI directory, loaded once at start."""

    pki_dir: str
    ca_pem: bytes
    ca_certificate: x509.Certificate
    ca_key: object
    ca_cert_hash: str
    authority_key_identifier: x509.AuthorityKeyIdentifier

    @classmethod
    def load(cls, pki_dir: str) -> "ClusterPki":
        ca_pem = _read(os.path.join(pki_dir, "ca.crt"))
        key_pem = _read(os.path.join(pki_dir, "ca.key"))
        try:
            certificate = x509.load_pem_x509_certificate(ca_pem)
        except ValueError:
            raise PkiError(f"{pki_dir}/ca.crt is not a PEM certificate") from None
        try:
            key = serialization.load_pem_private_key(key_pem, password=None)
        except (ValueError, TypeError):
            raise PkiError(f"{pki_dir}/ca.key is not an unencrypted PEM private key") from None
        if key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        ) != certificate.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        ):
            raise PkiError(f"{pki_dir}/ca.key is not the key of {pki_dir}/ca.crt")
        return cls(
            pki_dir,
            ca_pem,
            certificate,
            key,
            ca_cert_hash(ca_pem),
            x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key()),
        )

    def sign_kubelet_client(self, public_key: object, node_name: str, now: datetime.datetime) -> bytes:
        """A kubelet client certificate (clientAuth) for the key of the node's CSR and the granted ``node_name`` (nothing
        else of the CSR is copied), issued by the cluster CA for one year: signed ECDSA-SHA256 by an ECDSA CA (kubeadm's
        ``encryptionAlgorithm: ECDSA-P256``), RSA-SHA256 by kubeadm's default RSA-2048 one."""
        algorithm = (
            None if isinstance(self.ca_key, (ed25519.Ed25519PrivateKey, ed448.Ed448PrivateKey)) else hashes.SHA256()
        )
        certificate = (
            x509.CertificateBuilder()
            .subject_name(kubelet_subject(node_name))
            .issuer_name(self.ca_certificate.subject)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE)
            .not_valid_after(now + KUBELET_CERT_VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=True,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .add_extension(self.authority_key_identifier, critical=False)
            .sign(self.ca_key, algorithm)
        )
        return certificate.public_bytes(serialization.Encoding.PEM)

    def control_plane_files(self) -> dict[str, tuple[bytes, int]]:
        """The shared control-plane PKI, read at request time (relative path -> (content, mode))."""
        return {
            name: (_read(os.path.join(self.pki_dir, name)), mode) for name, mode in CONTROL_PLANE_FILE_MODES.items()
        }
