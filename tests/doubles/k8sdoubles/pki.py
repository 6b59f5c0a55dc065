"""Real X.509 PKI in kubeadm's layout, made with `cryptography`."""

from __future__ import annotations

import base64
import datetime as _dt
import hashlib
import hmac
import ipaddress
import json
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .common import DoubleError, atomic_write, host_path

CA_VALIDITY = _dt.timedelta(days=3650)
CERT_VALIDITY = _dt.timedelta(days=365)

PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey


def generate_key(algorithm: str = "RSA-2048") -> PrivateKey:
    if algorithm.startswith("RSA-"):
        return rsa.generate_private_key(public_exponent=65537, key_size=int(algorithm[4:]))
    if algorithm == "ECDSA-P256":
        return ec.generate_private_key(ec.SECP256R1())
    if algorithm == "ECDSA-P384":
        return ec.generate_private_key(ec.SECP384R1())
    raise DoubleError(f"unsupported encryption algorithm {algorithm!r}")


def key_pem(key: PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def public_pem(key: PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def spki_hash(cert: x509.Certificate) -> str:
    """kubeadm's CA pin: sha256 over the SubjectPublicKeyInfo DER."""
    der = cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(der).hexdigest()


def _name(common_name: str, organizations: list[str] | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations or []]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attributes)


def _signing_hash(key: PrivateKey) -> hashes.HashAlgorithm:
    return (
        hashes.SHA256()
        if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.key_size <= 256
        else hashes.SHA384()
    )


def _key_usage(key_encipherment: bool = False, key_cert_sign: bool = False) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=key_encipherment,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=key_cert_sign,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    )


def new_ca(common_name: str, algorithm: str) -> tuple[x509.Certificate, PrivateKey]:
    key = generate_key(algorithm)
    start = _dt.datetime.now(_dt.timezone.utc) - _dt.timedelta(minutes=5)
    name = _name(common_name)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(_key_usage(key_encipherment=True, key_cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, _signing_hash(key))
    )
    return cert, key


@dataclass
class CertSpec:
    common_name: str
    organizations: list[str] = field(default_factory=list)
    server: bool = False
    client: bool = False
    dns_names: list[str] = field(default_factory=list)
    ips: list[str] = field(default_factory=list)


def sign_public_key(
    spec: CertSpec,
    public_key: object,
    ca_cert: x509.Certificate,
    ca_key: PrivateKey,
    validity: _dt.timedelta = CERT_VALIDITY,
) -> x509.Certificate:
    start = _dt.datetime.now(_dt.timezone.utc) - _dt.timedelta(minutes=5)
    usages = []
    if spec.server:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    if spec.client:
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(spec.common_name, spec.organizations))
        .issuer_name(ca_cert.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(min(start + validity, ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            _key_usage(key_encipherment=not isinstance(public_key, ec.EllipticCurvePublicKey)), critical=True
        )
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()), critical=False)
    )
    if usages:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    alt_names: list[x509.GeneralName] = [x509.DNSName(name) for name in dict.fromkeys(spec.dns_names)]
    alt_names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in dict.fromkeys(spec.ips)]
    if alt_names:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
    return builder.sign(ca_key, _signing_hash(ca_key))


def new_cert(
    spec: CertSpec, ca_cert: x509.Certificate, ca_key: PrivateKey, algorithm: str
) -> tuple[x509.Certificate, PrivateKey]:
    key = generate_key(algorithm)
    return sign_public_key(spec, key.public_key(), ca_cert, ca_key), key


def load_cert(path: str) -> x509.Certificate:
    """Load a PEM certificate by logical path; errors name the logical path."""
    try:
        data = host_path(path).read_bytes()
    except OSError:
        raise DoubleError(
            f"couldn't load the certificate file {path}: open {path}: no such file or directory"
        ) from None
    try:
        return x509.load_pem_x509_certificate(data)
    except ValueError:
        raise DoubleError(
            f"couldn't load the certificate file {path}: data does not contain any valid RSA or ECDSA certificates"
        ) from None


def load_key(path: str) -> PrivateKey:
    try:
        data = host_path(path).read_bytes()
    except OSError:
        raise DoubleError(
            f"couldn't load the private key file {path}: open {path}: no such file or directory"
        ) from None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except ValueError:
        raise DoubleError(
            f"couldn't load the private key file {path}: data does not contain a valid RSA or ECDSA private key"
        ) from None
    if not isinstance(key, (rsa.RSAPrivateKey, ec.EllipticCurvePrivateKey)):
        raise DoubleError(f"couldn't load the private key file {path}: unsupported key type")
    return key


def is_ca(cert: x509.Certificate) -> bool:
    try:
        return cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        return False


def key_matches(cert: x509.Certificate, key: PrivateKey) -> bool:
    fmt = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return cert.public_key().public_bytes(*fmt) == key.public_key().public_bytes(*fmt)


def write_pair(directory: str, base: str, cert: x509.Certificate, key: PrivateKey) -> None:
    atomic_write(host_path(f"{directory}/{base}.crt"), cert_pem(cert), 0o644)
    atomic_write(host_path(f"{directory}/{base}.key"), key_pem(key), 0o600)


def kubeconfig(
    cluster_name: str,
    server: str,
    ca_pem: bytes,
    user: str,
    client_cert_pem: bytes | None = None,
    client_key_pem: bytes | None = None,
    token: str | None = None,
    client_cert_file: str | None = None,
) -> dict:
    """A kubeconfig document shaped like the ones kubeadm writes."""
    credentials: dict[str, str] = {}
    if client_cert_file:
        credentials = {"client-certificate": client_cert_file, "client-key": client_cert_file}
    elif client_cert_pem is not None and client_key_pem is not None:
        credentials = {
            "client-certificate-data": base64.b64encode(client_cert_pem).decode(),
            "client-key-data": base64.b64encode(client_key_pem).decode(),
        }
    if token:
        credentials["token"] = token
    context = f"{user}@{cluster_name}"
    return {
        "apiVersion": "v1",
        "clusters": [
            {
                "cluster": {
                    "certificate-authority-data": base64.b64encode(ca_pem).decode(),
                    "server": server,
                },
                "name": cluster_name,
            }
        ],
        "contexts": [{"context": {"cluster": cluster_name, "user": user}, "name": context}],
        "current-context": context,
        "kind": "Config",
        "preferences": {},
        "users": [{"name": user, "user": credentials}],
    }


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def detached_jws(payload: str, token_id: str, token_secret: str) -> str:
    """The bootstrap signer's detached JWS: HS256, key = token secret."""
    header = b64url(json.dumps({"alg": "HS256", "kid": token_id}, separators=(",", ":")).encode())
    signing_input = f"{header}.{b64url(payload.encode())}".encode()
    signature = hmac.new(token_secret.encode(), signing_input, hashlib.sha256).digest()
    return f"{header}..{b64url(signature)}"


def detached_jws_valid(jws: str, payload: str, token_id: str, token_secret: str) -> bool:
    """Verify like k8s.io/cluster-bootstrap DetachedTokenIsValid."""
    parts = jws.split(".")
    if len(parts) != 3 or parts[1] != "":
        return False
    try:
        padded = parts[0] + "=" * (-len(parts[0]) % 4)
        header = json.loads(base64.urlsafe_b64decode(padded))
    except (ValueError, json.JSONDecodeError):
        return False
    if header.get("alg") != "HS256" or header.get("kid") != token_id:
        return False
    return hmac.compare_digest(jws, detached_jws(payload, token_id, token_secret))


def new_certificate_key() -> str:
    return secrets.token_hex(32)


def encrypt_with_certificate_key(certificate_key: str, plaintext: bytes) -> bytes:
    """kubeadm's cryptoutil.EncryptBytes: AES-GCM, nonce prepended."""
    key = decode_certificate_key(certificate_key)
    nonce = secrets.token_bytes(12)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, None)


def decrypt_with_certificate_key(certificate_key: str, ciphertext: bytes) -> bytes:
    key = decode_certificate_key(certificate_key)
    if len(ciphertext) < 12:
        raise DoubleError("size of data is less than the nonce")
    try:
        return AESGCM(key).decrypt(ciphertext[:12], ciphertext[12:], None)
    except Exception:
        raise DoubleError("cipher: message authentication failed") from None


def decode_certificate_key(certificate_key: str) -> bytes:
    try:
        key = bytes.fromhex(certificate_key)
    except ValueError:
        raise DoubleError(
            f"error decoding certificate key: encoding/hex: invalid byte in {certificate_key!r}"
        ) from None
    if len(key) != 32:
        raise DoubleError(f"error decoding certificate key: crypto/aes: invalid key size {len(key)}")
    return key


def csr_pem(common_name: str, organizations: list[str], key: PrivateKey) -> bytes:
    request = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(_name(common_name, organizations))
        .sign(key, _signing_hash(key))
    )
    return request.public_bytes(serialization.Encoding.PEM)


def pki_file_exists(path: str) -> bool:
    return host_path(path).exists()


def read_logical(path: str) -> bytes:
    return host_path(path).read_bytes()


def ensure_dir(path: str, mode: int = 0o755) -> Path:
    target = host_path(path)
    target.mkdir(parents=True, exist_ok=True, mode=mode)
    return target
