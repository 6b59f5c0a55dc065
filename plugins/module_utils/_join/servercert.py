# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The join service's TLS certificate, issued from the cluster CA for this control plane's addresses.

``python -m ...servercert --pki-dir D --cert C --key K --san IP...`` issues it when it is missing, about to
expire, not issued by the current CA, or lacks a wanted address; prints ``changed`` or ``unchanged``.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import sys

from .._files import write_file_atomically, write_private_file

try:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
except ImportError:  # reported at use
    pass

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


def needs_issue(cert_path: str, ca: x509.Certificate, names: list[str], now: datetime.datetime) -> bool:
    try:
        with open(cert_path, "rb") as handle:
            current = x509.load_pem_x509_certificate(handle.read())
        current.verify_directly_issued_by(ca)
        present = current.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, ValueError, TypeError, x509.ExtensionNotFound, Exception):  # noqa: BLE001 - any doubt means re-issue
        return True
    wanted = set(_san_entries(names))
    return not wanted <= set(present) or current.not_valid_after_utc - now < RENEW_BEFORE


def issue(pki_dir: str, cert_path: str, key_path: str, names: list[str]) -> bool:
    """Issue the certificate when needed; returns whether it did. The key is written 0600."""
    now = datetime.datetime.now(datetime.timezone.utc)
    with open(os.path.join(pki_dir, "ca.crt"), "rb") as handle:
        ca = x509.load_pem_x509_certificate(handle.read())
    if not needs_issue(cert_path, ca, names, now):
        return False
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
    write_private_file(key_path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    write_file_atomically(cert_path, certificate.public_bytes(serialization.Encoding.PEM), 0o644)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Issue the join service's TLS certificate from the cluster CA when needed.")
    parser.add_argument("--pki-dir", default="/etc/kubernetes/pki")
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--san", action="append", required=True, help="an IP address or DNS name (repeatable)")
    args = parser.parse_args(argv)
    try:
        changed = issue(args.pki_dir, args.cert, args.key, args.san)
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"cannot issue the join service certificate: {exc}\n")
        return 1
    sys.stdout.write("changed\n" if changed else "unchanged\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
