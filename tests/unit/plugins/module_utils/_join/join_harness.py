"""Join service test harness: a test cluster PKI made with cryptography, root secrets, a policy from the swtpm's real PCRs,
and in-process services on 127.0.0.1 with real TLS."""

from __future__ import annotations

import asyncio
import base64
import datetime
import io
import ipaddress
import json
import os
import threading
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import issuer
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.nonces import NonceStore
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.policy import MeasurementPolicy, PcrRule, dump_policy
from ansible_collections.confidential.kubernetes.plugins.module_utils._join import joinservice_pb2 as pb2
from ansible_collections.confidential.kubernetes.plugins.module_utils._join import joinservice_pb2_grpc as pb2_grpc
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.client import request_ticket
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.config import ServiceConfig
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.log import StructuredLog
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.service import build_service
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.tokens import TokenMinter

POLICY_PCRS = (0, 4, 8, 9)
DISK_UUID = "0d3b1c4e-9f2a-4e57-8a61-2f4c9b7d5e13"
API_SERVER = "10.0.0.10:6443"
K8S_VERSION = "v1.33.4"
NOW = datetime.datetime.now(datetime.timezone.utc)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem_key(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def make_ca(common_name: str):
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    cert = (x509.CertificateBuilder().subject_name(_name(common_name)).issuer_name(_name(common_name))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(NOW - datetime.timedelta(days=1)).not_valid_after(NOW + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=True, data_encipherment=False,
                                         key_agreement=False, key_cert_sign=True, crl_sign=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return cert, key


def make_server_cert(ca_cert, ca_key):
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(_name("confidential-kubernetes-joinservice")).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(NOW - datetime.timedelta(days=1)).not_valid_after(NOW + datetime.timedelta(days=30))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def make_csr(node_name: str, key=None, subject: x509.Name | None = None) -> bytes:
    key = key or ec.generate_private_key(ec.SECP256R1())
    subject = subject or x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
                                    x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node_name}")])
    return x509.CertificateSigningRequestBuilder().subject_name(subject).sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def write(path: Path, data: bytes, mode: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.chmod(path, mode)
    return path


def make_cluster_pki(pki_dir: Path) -> dict:
    """kubeadm's PKI layout: ca, sa, front-proxy-ca, etcd/ca; returns the CA objects."""
    ca_cert, ca_key = make_ca("kubernetes")
    for name, common_name in (("ca", None), ("front-proxy-ca", "front-proxy-ca"), ("etcd/ca", "etcd-ca")):
        cert, key = (ca_cert, ca_key) if common_name is None else make_ca(common_name)
        write(pki_dir / f"{name}.crt", cert.public_bytes(serialization.Encoding.PEM), 0o644)
        write(pki_dir / f"{name}.key", _pem_key(key), 0o600)
    sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    write(pki_dir / "sa.key", _pem_key(sa), 0o600)
    write(pki_dir / "sa.pub", sa.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo), 0o644)
    return {"ca_cert": ca_cert, "ca_key": ca_key, "ca_pem": ca_cert.public_bytes(serialization.Encoding.PEM)}


def policy_from_swtpm(tcti: str, ak_trust: str) -> MeasurementPolicy:
    with issuer.Tpm(tcti) as tpm:
        values = tpm.read_pcrs("sha256", POLICY_PCRS)
    return MeasurementPolicy("sha256", {i: PcrRule(i, (values[i],)) for i in POLICY_PCRS}, ak_trust)


class FakeMinter(TokenMinter):
    """Records every token it mints; can be slowed down, or hold the joins of ``gated`` nodes at a gate."""

    def __init__(self, delay: float = 0.0, gate: threading.Event | None = None, gated: tuple[str, ...] = ()):
        self.tokens: list[tuple[str, str]] = []
        self.delay = delay
        self.gate = gate
        self.gated = gated
        self.entered = threading.Event()

    async def mint(self, token: str, node_name: str) -> None:
        self.entered.set()
        if self.gate is not None and (not self.gated or node_name in self.gated):
            await asyncio.get_running_loop().run_in_executor(None, self.gate.wait, 10)
        if self.delay:
            await asyncio.sleep(self.delay)
        self.tokens.append((node_name, token))


class Clock:
    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class JoinLab:
    """Files of a control-plane node plus services started on demand (all stopped at teardown)."""

    def __init__(self, tmp_path: Path, swtpm):
        self.dir = tmp_path
        self.swtpm = swtpm
        self.pki_dir = tmp_path / "pki"
        self.pki = make_cluster_pki(self.pki_dir)
        self.ca_pem = self.pki["ca_pem"]
        cert_pem, key_pem = make_server_cert(self.pki["ca_cert"], self.pki["ca_key"])
        self.tls_cert = write(tmp_path / "tls" / "server.crt", cert_pem, 0o644)
        self.tls_key = write(tmp_path / "tls" / "server.key", key_pem, 0o600)
        self.secrets = {name: os.urandom(32) for name in ("master_key", "master_salt", "measurement_salt")}
        self.secrets_file = write(tmp_path / "cluster-secrets.json",
                                  json.dumps({k: base64.b64encode(v).decode() for k, v in self.secrets.items()}).encode(), 0o600)
        self.ek_ca_file = write(tmp_path / "ek-ca.pem", swtpm.ca_pem, 0o644)
        self.policy_file = tmp_path / "policy.json"
        self.log_stream = io.StringIO()
        self.log = StructuredLog(self.log_stream)
        self.services = []

    def write_policy(self, ak_trust: str = "pcrs-only", tcti: str | None = None) -> MeasurementPolicy:
        policy = policy_from_swtpm(tcti or self.swtpm.tcti, ak_trust)
        self.policy_file.write_text(dump_policy(policy))
        return policy

    def config(self, port: int = 0, **overrides) -> ServiceConfig:
        settings = dict(listen=f"127.0.0.1:{port}", tls_cert=str(self.tls_cert), tls_key=str(self.tls_key),
                        secrets_file=str(self.secrets_file), policy_file=str(self.policy_file), ek_ca_file=str(self.ek_ca_file),
                        pki_dir=str(self.pki_dir), api_server_endpoint=API_SERVER, kubernetes_version=K8S_VERSION)
        settings.update(overrides)
        return ServiceConfig(**settings)

    def start(self, ak_trust: str | None = "pcrs-only", minter: TokenMinter | None = None, nonces: NonceStore | None = None,
              port: int = 0, drain_delay: float = 0.0, **settings):
        if ak_trust is not None:
            self.write_policy(ak_trust)
        minter = minter or FakeMinter()
        service = build_service(self.config(port, **settings), self.log, minter, nonces, drain_delay).start()
        service.minter = minter
        service.endpoint = f"127.0.0.1:{service.port}"
        self.services.append(service)
        return service

    def stub(self, service):
        channel = grpc.secure_channel(service.endpoint, grpc.ssl_channel_credentials(self.ca_pem),
                                      options=[("grpc.use_local_subchannel_pool", 1)])
        return pb2_grpc.JoinServiceStub(channel), channel

    def logs(self) -> list[dict]:
        return [json.loads(line) for line in self.log_stream.getvalue().splitlines()]

    def close(self) -> None:
        for service in self.services:
            service.stop_now()


def evidence_for(tcti: str, nonce: bytes, user_data: bytes) -> bytes:
    with issuer.Tpm(tcti) as tpm:
        return issuer.issue_evidence(tpm, nonce, user_data).to_json().encode()


def join_request(evidence: bytes, nonce: bytes, node_name: str = "worker-1", control_plane: bool = False, csr: bytes | None = None,
                 disk_uuid: str = DISK_UUID):
    return pb2.IssueJoinTicketRequest(evidence=evidence, nonce=nonce, node_name=node_name, control_plane=control_plane,
                                      kubelet_csr=csr if csr is not None else make_csr(node_name), disk_uuid=disk_uuid)


@pytest.fixture
def join_lab(tmp_path, swtpm):
    """A control plane's files and in-process join services (imported by the conftests that use it)."""
    lab = JoinLab(tmp_path, swtpm)
    yield lab
    lab.close()


def document_json(document: dict) -> bytes:
    return json.dumps(document).encode()


def assert_refused(stub_call, code, reason):
    """The call fails with this gRPC status, a message starting with the reason, and the reason in the trailing metadata."""
    with pytest.raises(grpc.RpcError) as err:
        stub_call()
    assert err.value.code() == code, err.value.details()
    assert err.value.details().startswith(f"{reason}: "), err.value.details()
    assert dict(err.value.trailing_metadata())["confidential-kubernetes-reason"] == reason
    return err.value


def join_with_client(lab, service, node_name="worker-1", control_plane=False, csr=None, tcti=None, **kwargs):
    """A node's whole join through the collection's client (nonce, evidence, request, credential activation, opening)."""
    return request_ticket([service.endpoint], lab.ca_pem, tcti or lab.swtpm.tcti, node_name, control_plane=control_plane,
                          disk_uuid=DISK_UUID, kubelet_csr_pem=csr or make_csr(node_name), **kwargs)
