# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The join service's TLS certificate, issued from the cluster CA for this control plane's addresses.

``issue`` issues it when it is missing, about to expire (less than ``renew_before`` left: RENEW_BEFORE unless the caller
says otherwise, the renew playbook's threshold), not issued by the current CA, or lacks a wanted address (the
``join_service`` module runs it on the control plane).
"""

from __future__ import annotations

import datetime
import ipaddress
import os

from .._files import write_file_atomically, write_private_file

try:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
except ImportError as exc:  # reported by the join_service module through missing_required_lib()
    CRYPTOGRAPHY_IMPORT_ERROR: ImportError | None = exc
else:
    CRYPTOGRAPHY_IMPORT_ERROR = None

VALIDITY = datetime.timedelta(days=365)
RENEW_BEFORE = datetime.timedelta(days=30)
COMMON_NAME = "confidential-kubernetes-joinservice"


def _san_entries(names: list[str]) -> list:
    entries = []
    for name in names:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            entries.append(x509.DNSName(name))
    return entries


def needs_issue(
    cert_path: str,
    ca: x509.Certificate,
    names: list[str],
    now: datetime.datetime,
    renew_before: datetime.timedelta = RENEW_BEFORE,
) -> bool:
    try:
        with open(cert_path, "rb") as handle:
            current = x509.load_pem_x509_certificate(handle.read())
        current.verify_directly_issued_by(ca)
        present = current.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, ValueError, TypeError, x509.ExtensionNotFound, Exception):  # noqa: BLE001 - any doubt means re-issue
        return True
    wanted = set(_san_entries(names))
    return not wanted <= set(present) or current.not_valid_after_utc - now < renew_before


def issue(
    pki_dir: str,
    cert_path: str,
    key_path: str,
    names: list[str],
    check_mode: bool = False,
    renew_before: datetime.timedelta = RENEW_BEFORE,
) -> bool:
    """Issue the certificate when needed; returns whether it did (would, in check mode). The key is written 0600."""
    now = datetime.datetime.now(datetime.timezone.utc)
    with open(os.path.join(pki_dir, "ca.crt"), "rb") as handle:
        ca = x509.load_pem_x509_certificate(handle.read())
    if not needs_issue(cert_path, ca, names, now, renew_before):
        return False
    if check_mode:
        return True
    with open(os.path.join(pki_dir, "ca.key"), "rb") as handle:
        ca_key = serialization.load_pem_private_key(handle.read(), password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, COMMON_NAME)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(min(now + VALIDITY, ca.not_valid_after_utc))
        .add_extension(x509.SubjectAlternativeName(_san_entries(names)), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    write_private_file(
        key_path,
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )
    write_file_atomically(cert_path, certificate.public_bytes(serialization.Encoding.PEM), 0o644)
    return True
