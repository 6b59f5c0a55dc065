"""The API server client and the kubelet's TLS bootstrap (pkg/kubelet/certificate/bootstrap, as in 1.20)."""

from __future__ import annotations

import base64
import datetime
import hashlib
import http.client
import json
import ssl
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from . import StandinError, write_private


class ApiError(StandinError):
    """A failed API request (status = the HTTP status, 0 when there was no answer) or an unusable kubeconfig."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Kubeconfig:
    server: str
    ca_pem: bytes
    cert_pem: bytes = b""
    key_pem: bytes = b""
    token: str = ""


def load_kubeconfig(path: Path) -> Kubeconfig:
    def field(entry: dict, name: str) -> bytes:
        if entry.get(f"{name}-data"):
            return base64.b64decode(entry[f"{name}-data"])
        return (path.parent / entry[name]).read_bytes() if entry.get(name) else b""

    try:
        config = yaml.safe_load(path.read_text())
        context = next(c["context"] for c in config["contexts"] if c["name"] == config["current-context"])
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
        user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
        return Kubeconfig(
            cluster["server"],
            field(cluster, "certificate-authority"),
            field(user, "client-certificate"),
            field(user, "client-key"),
            user.get("token", ""),
        )
    except (OSError, yaml.YAMLError, KeyError, TypeError, StopIteration, ValueError) as exc:
        raise ApiError(f"unable to load kubeconfig {path}: {exc}") from None


def certificate_valid(cert_pem: bytes) -> bool:
    """isClientConfigStillValid: certificates present and none expired."""
    try:
        certificates = x509.load_pem_x509_certificates(cert_pem)
    except ValueError:
        return False
    return all(datetime.datetime.now(datetime.timezone.utc) <= c.not_valid_after_utc for c in certificates)


class Client:
    """JSON over HTTPS to the API server, with the kubeconfig's CA and credentials."""

    def __init__(self, config: Kubeconfig) -> None:
        self.config, url = config, urlsplit(config.server)
        self.host, self.port = url.hostname, url.port or 443
        self.context = ssl.create_default_context(cadata=config.ca_pem.decode())
        if config.cert_pem:
            # ssl loads a client certificate only from a file: a private one on tmpfs, removed at once.
            with tempfile.NamedTemporaryFile(dir="/run") as pem:
                # The certificate store's file holds both, and kubelet.conf names it twice.
                pem.write(
                    config.cert_pem if config.cert_pem == config.key_pem else config.cert_pem + b"\n" + config.key_pem
                )
                pem.flush()
                self.context.load_cert_chain(pem.name)

    def request(self, method: str, path: str, body: dict | None = None, content_type: str = "application/json") -> dict:
        headers = {"Accept": "application/json", "Content-Type": content_type, "User-Agent": "kubelet-standin"}
        if self.config.token:
            headers["Authorization"] = f"Bearer {self.config.token}"
        connection = http.client.HTTPSConnection(self.host, self.port, context=self.context, timeout=10)
        try:
            connection.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
            response = connection.getresponse()
            payload = response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise ApiError(f"{method} {path}: {exc}") from None
        finally:
            connection.close()
        if response.status >= 300:
            raise ApiError(
                f"{method} {path}: {response.status} {payload[:300].decode(errors='replace')}", response.status
            )
        return json.loads(payload or b"{}")


def write_kubeconfig(path: Path, server: str, ca_pem: bytes, pem_path: Path) -> None:
    """writeKubeconfigFromBootstrapping: the bootstrap server and CA, the certificate store's current file."""
    cluster = {"server": server, "certificate-authority-data": base64.b64encode(ca_pem).decode()}
    context = {"cluster": "default-cluster", "user": "default-auth", "namespace": "default"}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "default-context",
        "preferences": {},
        "clusters": [{"name": "default-cluster", "cluster": cluster}],
        "contexts": [{"name": "default-context", "context": context}],
        "users": [{"name": "default-auth", "user": {"client-certificate": str(pem_path), "client-key": str(pem_path)}}],
    }
    write_private(path, yaml.safe_dump(config).encode())


def store_certificate(cert_dir: Path, cert_pem: bytes, key_pem: bytes) -> None:
    """certificate.FileStore.Update: kubelet-client-<time>.pem (0600), then the -current symlink to it."""
    dated = cert_dir / time.strftime("kubelet-client-%Y-%m-%d-%H-%M-%S.pem", time.gmtime())
    write_private(dated, cert_pem.rstrip(b"\n") + b"\n" + key_pem)
    link = cert_dir / ".kubelet-client-current.pem.tmp"
    link.unlink(missing_ok=True)
    link.symlink_to(dated.name)
    link.replace(cert_dir / "kubelet-client-current.pem")


def request_certificate(client: Client, node_name: str, log) -> tuple[bytes, bytes]:
    """requestNodeCertificate: a CSR for system:node:<name>, then the certificate once approved and issued."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node_name}"),
        ]
    )
    csr = x509.CertificateSigningRequestBuilder().subject_name(subject).sign(key, hashes.SHA256())
    public = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    name = "node-csr-" + base64.urlsafe_b64encode(hashlib.sha256(public).digest()).decode().rstrip("=")
    client.request(
        "POST",
        "/apis/certificates.k8s.io/v1/certificatesigningrequests",
        {
            "apiVersion": "certificates.k8s.io/v1",
            "kind": "CertificateSigningRequest",
            "metadata": {"name": name},
            "spec": {
                "request": base64.b64encode(csr.public_bytes(serialization.Encoding.PEM)).decode(),
                "signerName": "kubernetes.io/kube-apiserver-client-kubelet",
                "usages": ["digital signature", "key encipherment", "client auth"],
            },
        },
    )
    log(f"certificate signing request {name} created; waiting for it to be approved and issued")
    while True:
        status = client.request("GET", f"/apis/certificates.k8s.io/v1/certificatesigningrequests/{name}")["status"]
        conditions = {c["type"] for c in status.get("conditions", [])}
        if conditions & {"Denied", "Failed"}:
            raise ApiError(f"certificate signing request {name} was {'/'.join(sorted(conditions))}")
        if "Approved" in conditions and status.get("certificate"):
            return base64.b64decode(status["certificate"]), key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
            )
        time.sleep(1)


def client_config(kubeconfig: Path, bootstrap: Path | None, cert_dir: Path, rotate: bool, log) -> Kubeconfig | None:
    """LoadClientConfig + the certificate manager (1.20): a valid kubeconfig is used (with rotation, its certificate
    seeds an empty store); else kubelet.conf is written from the bootstrap kubeconfig pointing at the store's current
    file, and the bootstrap kubeconfig is returned when that file holds no valid certificate: request one with it."""
    current = cert_dir / "kubelet-client-current.pem"
    if kubeconfig.exists():
        try:
            config = load_kubeconfig(kubeconfig)
        except ApiError as exc:
            config = Kubeconfig("", b"")
            log(f"existing kubeconfig is not usable: {exc}")
        if certificate_valid(config.cert_pem):
            if rotate and config.key_pem and not current.exists():
                store_certificate(cert_dir, config.cert_pem, config.key_pem)
            return None
    if bootstrap is None:
        raise ApiError(f"{kubeconfig} holds no valid client certificate and no --bootstrap-kubeconfig was given")
    boot = load_kubeconfig(bootstrap)
    write_kubeconfig(kubeconfig, boot.server, boot.ca_pem, current)
    if certificate_valid(current.read_bytes() if current.exists() else b""):
        log(f"using the client certificate in {current}: no bootstrap needed")
        return None
    log(f"no valid client certificate in {current}: TLS bootstrap with {bootstrap}")
    return boot
