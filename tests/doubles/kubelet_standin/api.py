"""The API server client and the kubelet's TLS bootstrap (pkg/kubelet/certificate/bootstrap, as in 1.20)."""
from __future__ import annotations

import base64
import datetime
import hashlib
import http.client
import json
import os
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

from . import StandinError

SIGNER = "kubernetes.io/kube-apiserver-client-kubelet"


class ApiError(StandinError):
    """A failed API request or an unusable kubeconfig."""

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


def _field(entry: dict, name: str, base: Path) -> bytes:
    """name-data (base64) or name (a file, relative to the kubeconfig) of a cluster or user entry."""
    if entry.get(f"{name}-data"):
        return base64.b64decode(entry[f"{name}-data"])
    if entry.get(name):
        return (base / entry[name]).read_bytes()
    return b""


def load_kubeconfig(path: Path) -> Kubeconfig:
    try:
        config = yaml.safe_load(path.read_text())
        context = next(c["context"] for c in config["contexts"] if c["name"] == config["current-context"])
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
        user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
        return Kubeconfig(cluster["server"], _field(cluster, "certificate-authority", path.parent),
                          _field(user, "client-certificate", path.parent), _field(user, "client-key", path.parent),
                          user.get("token", ""))
    except (OSError, yaml.YAMLError, KeyError, TypeError, StopIteration, ValueError) as exc:
        raise ApiError(f"unable to load kubeconfig {path}: {exc}") from None


def certificate_valid(cert_pem: bytes) -> bool:
    """isClientConfigStillValid: certificates present and none expired."""
    try:
        certificates = x509.load_pem_x509_certificates(cert_pem)
    except ValueError:
        return False
    now = datetime.datetime.now(datetime.timezone.utc)
    return all(now <= c.not_valid_after_utc for c in certificates)


class Client:
    """JSON over HTTPS to the API server, with the kubeconfig's CA and credentials."""

    def __init__(self, config: Kubeconfig) -> None:
        self.config = config
        url = urlsplit(config.server)
        self.host, self.port = url.hostname, url.port or 443
        self.context = ssl.create_default_context(cadata=config.ca_pem.decode())
        if config.cert_pem:
            # ssl loads a client certificate only from a file: a private one, removed at once.
            with tempfile.NamedTemporaryFile(dir="/run") as pem:
                # The certificate store's file holds both, and kubelet.conf names it twice.
                pem.write(config.cert_pem if config.cert_pem == config.key_pem else config.cert_pem + b"\n" + config.key_pem)
                pem.flush()
                self.context.load_cert_chain(pem.name)

    def request(self, method: str, path: str, body: dict | None = None,
                content_type: str = "application/json") -> dict:
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
            raise ApiError(f"{method} {path}: {response.status} {payload[:300].decode(errors='replace')}",
                           response.status)
        return json.loads(payload or b"{}")


def write_kubeconfig(path: Path, server: str, ca_pem: bytes, pem_path: Path) -> None:
    """writeKubeconfigFromBootstrapping: the bootstrap server and CA, the certificate store's current file."""
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "default-context", "preferences": {},
        "clusters": [{"name": "default-cluster", "cluster": {
            "server": server, "certificate-authority-data": base64.b64encode(ca_pem).decode()}}],
        "contexts": [{"name": "default-context", "context": {
            "cluster": "default-cluster", "user": "default-auth", "namespace": "default"}}],
        "users": [{"name": "default-auth", "user": {"client-certificate": str(pem_path), "client-key": str(pem_path)}}],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(yaml.safe_dump(config))
    temporary.chmod(0o600)
    temporary.replace(path)


def store_certificate(cert_dir: Path, cert_pem: bytes, key_pem: bytes) -> Path:
    """certificate.FileStore.Update: kubelet-client-<time>.pem, then the -current symlink to it."""
    cert_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%d-%H-%M-%S", time.gmtime())
    dated = cert_dir / f"kubelet-client-{stamp}.pem"
    descriptor = os.open(dated, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as output:
        output.write(cert_pem.rstrip(b"\n") + b"\n" + key_pem)
    current = cert_dir / "kubelet-client-current.pem"
    link = cert_dir / ".kubelet-client-current.pem.tmp"
    link.unlink(missing_ok=True)
    link.symlink_to(dated.name)
    link.replace(current)
    return current


def request_certificate(client: Client, node_name: str, log) -> tuple[bytes, bytes]:
    """requestNodeCertificate: a CSR for system:node:<name>, then the certificate once approved and issued."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
                         x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node_name}")])
    csr = x509.CertificateSigningRequestBuilder().subject_name(subject).sign(key, hashes.SHA256())
    public = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    name = "node-csr-" + base64.urlsafe_b64encode(hashlib.sha256(public).digest()).decode().rstrip("=")
    client.request("POST", "/apis/certificates.k8s.io/v1/certificatesigningrequests", {
        "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest", "metadata": {"name": name},
        "spec": {"request": base64.b64encode(csr.public_bytes(serialization.Encoding.PEM)).decode(),
                 "signerName": SIGNER, "usages": ["digital signature", "key encipherment", "client auth"]}})
    log(f"certificate signing request {name} created; waiting for it to be approved and issued")
    while True:
        status = client.request("GET", f"/apis/certificates.k8s.io/v1/certificatesigningrequests/{name}")["status"]
        conditions = {c["type"] for c in status.get("conditions", [])}
        if conditions & {"Denied", "Failed"}:
            raise ApiError(f"certificate signing request {name} was {'/'.join(sorted(conditions))}")
        if "Approved" in conditions and status.get("certificate"):
            key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                        serialization.NoEncryption())
            return base64.b64decode(status["certificate"]), key_pem
        time.sleep(1)


def client_config(kubeconfig: Path, bootstrap: Path | None, cert_dir: Path, rotate: bool, log) -> Kubeconfig | None:
    """The kubelet's credentials, as LoadClientConfig and the certificate manager of the 1.20 kubelet decide.

    A valid kubeconfig is used (with rotateCertificates, its certificate seeds an empty store). Otherwise
    kubelet.conf is written from the bootstrap kubeconfig pointing at kubelet-client-current.pem, and when
    that file holds no valid certificate the bootstrap kubeconfig is returned: request one with it.
    """
    current = cert_dir / "kubelet-client-current.pem"
    if kubeconfig.exists():
        try:
            config = load_kubeconfig(kubeconfig)
        except ApiError as exc:
            log(f"existing kubeconfig is not usable: {exc}")
        else:
            if certificate_valid(config.cert_pem):
                if rotate and not current.exists() and config.key_pem:
                    store_certificate(cert_dir, config.cert_pem, config.key_pem)
                return None
    if bootstrap is None:
        raise ApiError(f"{kubeconfig} holds no valid client certificate and no --bootstrap-kubeconfig was given")
    boot = load_kubeconfig(bootstrap)
    write_kubeconfig(kubeconfig, boot.server, boot.ca_pem, current)
    if current.exists() and certificate_valid(current.read_bytes()):
        log(f"using the client certificate in {current}: no bootstrap needed")
        return None
    log(f"no valid client certificate in {current}: TLS bootstrap with {bootstrap}")
    return boot
