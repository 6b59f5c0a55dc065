# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The cluster's certificate authorities with ECDSA P-256 keys, for kubeadm versions without ``encryptionAlgorithm``.

kubeadm from 1.31 (config API v1beta4) makes ECDSA keys itself (ClusterConfiguration ``encryptionAlgorithm:
ECDSA-P256``). Older kubeadm always makes RSA-2048 CAs, but uses CAs it finds in the certificates directory: so they
are made here, on the node, the way kubeadm makes its own (subject, ten-year validity, CA:true, key usages, key mode
0600), before ``kubeadm init``, which then signs every certificate it issues with them. A CA already there is kept.
"""

from __future__ import annotations

import datetime
import os

try:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
except ImportError:  # reported by the module that needs it
    pass

RSA_2048 = "rsa-2048"
ECDSA_P256 = "ecdsa-p256"
CA_KEY_ALGORITHMS = (RSA_2048, ECDSA_P256)
# The CAs of kubeadm's PKI (path relative to the certificates directory without .crt/.key, common name).
KUBEADM_CAS = (("ca", "kubernetes"), ("front-proxy-ca", "front-proxy-ca"), ("etcd/ca", "etcd-ca"))
CA_VALIDITY = datetime.timedelta(days=3650)


class CaError(RuntimeError):
    """A CA cannot be made or is half there; the message names the file."""


def make_ca(common_name: str, now: datetime.datetime | None = None) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) of a self-signed ECDSA P-256 CA as kubeadm makes one: CN, ten years, CA:true,
    keyUsage digitalSignature/keyEncipherment/keyCertSign (critical), subject key identifier, SAN DNS:<CN>."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=True,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(common_name)]), critical=False)
        .sign(key, hashes.SHA256())
    )
    # kubeadm writes EC keys as SEC 1 ("EC PRIVATE KEY"), and reads them back the same way.
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
    )
    return certificate.public_bytes(serialization.Encoding.PEM), key_pem


def missing_cas(pki_dir: str) -> list[str]:
    """The kubeadm CAs (``ca``, ``front-proxy-ca``, ``etcd/ca``) with neither certificate nor key in ``pki_dir``.

    A CA with only one of its two files is an error: kubeadm would fail on it, and neither file may be replaced."""
    missing = []
    for name, dummy in KUBEADM_CAS:
        present = [os.path.exists(os.path.join(pki_dir, f"{name}.{suffix}")) for suffix in ("crt", "key")]
        if all(present):
            continue
        if any(present):
            have, lacks = ("crt", "key") if present[0] else ("key", "crt")
            raise CaError(
                f"{pki_dir}/{name}.{have} exists without {pki_dir}/{name}.{lacks}: a half-made CA; restore the missing file "
                "or remove both (on a node that is not initialised yet)"
            )
        missing.append(name)
    return missing


def make_missing_cas(pki_dir: str, names: list[str]) -> None:
    """Make the CAs ``names`` (from ``missing_cas``): the key is created 0600 and never overwrites a file."""
    common_names = dict(KUBEADM_CAS)
    for name in names:
        certificate, key = make_ca(common_names[name])
        key_path, cert_path = os.path.join(pki_dir, f"{name}.key"), os.path.join(pki_dir, f"{name}.crt")
        os.makedirs(os.path.dirname(key_path), mode=0o755, exist_ok=True)
        try:
            _write_new(key_path, key, 0o600)
            _write_new(cert_path, certificate, 0o644)
        except FileExistsError as exc:
            raise CaError(f"{exc.filename} appeared while its CA was being made; nothing was overwritten") from None


def _write_new(path: str, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as handle:
        os.fchmod(handle.fileno(), mode)
        handle.write(data)
