"""Join service test harness: a test cluster PKI made with cryptography, root secrets, a policy from the swtpm's real PCRs,
a node enrolment made from the swtpms' real EKs, the part of the Kubernetes API the service uses (behind the seam of its
one API client, ``kubeapi.ClusterApi``), and in-process services on 127.0.0.1 with real TLS.

Unless a test enrols TPMs itself (``JoinLab.enrol``), ``start`` enrols the lab's swtpm as worker ``worker-1``."""

from __future__ import annotations

import _posixsubprocess
import asyncio
import base64
import datetime
import io
import ipaddress
import json
import os
import subprocess
import threading
import time
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import issuer
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.policy import (
    MeasurementPolicy,
    PcrRule,
    dump_policy,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.seal import EphemeralKey
from ansible_collections.confidential.kubernetes.plugins.module_utils._join import joinservice_pb2 as pb2
from ansible_collections.confidential.kubernetes.plugins.module_utils._join import joinservice_pb2_grpc as pb2_grpc
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.bindings import ApiDiskBindings
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.client import (
    open_ticket,
    prove_activation,
    request_ticket,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.config import ServiceConfig
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.log import StructuredLog
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.nonces import MacNonces
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.registry import Enrolment, dump_enrolment
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.request import (
    bind_user_data,
    csr_key_digest,
    ek_identity,
    request_digest,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.issuance import STEP1_NOT_GRANTED
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.service import build_service
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.kubeapi import (
    ApiStatusError,
    ApiUnavailable,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.tokens import ApiTokenMinter

POLICY_PCRS = (0, 4, 8, 9)
DISK_UUID = "0d3b1c4e-9f2a-4e57-8a61-2f4c9b7d5e13"
OTHER_DISK_UUID = "5a0c7e21-3b9d-4f16-9c2e-7d81a4f0b362"
API_SERVER = "10.0.0.10:6443"
K8S_VERSION = "v1.33.4"
NOW = datetime.datetime.now(datetime.timezone.utc)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem_key(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def make_ca(common_name: str):
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - datetime.timedelta(days=1))
        .not_valid_after(NOW + datetime.timedelta(days=3650))
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
        .sign(key, hashes.SHA256())
    )
    return cert, key


def make_server_cert(ca_cert, ca_key):
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("confidential-kubernetes-joinservice"))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - datetime.timedelta(days=1))
        .not_valid_after(NOW + datetime.timedelta(days=30))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def make_csr(node_name: str, key=None, subject: x509.Name | None = None) -> bytes:
    key = key or ec.generate_private_key(ec.SECP256R1())
    # A node that asks the registry for its name puts the group only.
    subject = subject or x509.Name(
        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes")]
        + ([x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node_name}")] if node_name else [])
    )
    return (
        x509.CertificateSigningRequestBuilder()
        .subject_name(subject)
        .sign(key, hashes.SHA256())
        .public_bytes(serialization.Encoding.PEM)
    )


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
    write(
        pki_dir / "sa.pub",
        sa.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo),
        0o644,
    )
    return {"ca_cert": ca_cert, "ca_key": ca_key, "ca_pem": ca_cert.public_bytes(serialization.Encoding.PEM)}


def policy_from_swtpm(tcti: str, ak_trust: str) -> MeasurementPolicy:
    with issuer.Tpm(tcti) as tpm:
        values = tpm.read_pcrs("sha256", POLICY_PCRS)
    return MeasurementPolicy("sha256", {i: PcrRule(i, (values[i],)) for i in POLICY_PCRS}, ak_trust)


def _stamp(when: datetime.datetime | None = None) -> str:
    return (when or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeWatch:
    """What ``ClusterApi.watch`` returns, over FakeApi's objects: told of every change, and synced (listed) at once
    unless the API is unreachable for its resource, then as soon as it is reachable again; until synced it holds
    nothing, as ``kubeapi.WatchedList`` holds nothing before its first list."""

    def __init__(self, objects, summarize, on_change):
        self._objects = objects
        self._summarize = summarize
        self.on_change = on_change
        self.synced = threading.Event()

    def snapshot(self) -> dict:
        if not self.synced.is_set():
            return {}
        kept = {}
        for item in self._objects():
            summary = self._summarize(item)
            if summary is not None:
                kept[item["metadata"]["name"]] = summary
        return kept


class FakeApi:
    """The part of the Kubernetes API the join service uses, answering the calls of its API client (``ClusterApi``'s
    create/read/replace/delete/list/watch) as the API server would: bootstrap-token Secrets, disk-binding ConfigMaps,
    Nodes, CSRs. ``tokens`` records every token registered, ``retired`` every token ID deleted. Token registrations can
    be slowed down or held at a gate (for the nodes in ``gated``, or all); ``fail_bindings`` makes the API unreachable
    for ConfigMaps, and ``withheld`` keeps a resource's changes from the watches. The real API server's answers to the
    same calls are tested in test_tokens.py, test_bindings.py and test_kubeapi.py."""

    host = "https://10.0.0.10:6443"

    def __init__(self, delay: float = 0.0, gate: threading.Event | None = None, gated: tuple[str, ...] = ()):
        self.tokens: list[tuple[str, str]] = []
        self.retired: list[str] = []
        self.secrets: dict[str, dict] = {}
        self.configmaps: dict[str, dict] = {}
        self.nodes: dict[str, str] = {}
        self.heartbeats: dict[str, str] = {}
        self.csrs: list[tuple[str, str]] = []
        self.calls: list[tuple[str, str]] = []
        self.delay = delay
        self.gate = gate
        self.gated = gated
        self.entered = threading.Event()
        self._fail_bindings = False
        # Resources whose changes the watches do not deliver (yet): a watch event still on its way.
        self.withheld: set[str] = set()
        self._watches: dict[str, list[FakeWatch]] = {}
        self.others: dict[str, dict] = {}
        self._version = 0

    def minter(self) -> ApiTokenMinter:
        return ApiTokenMinter(self)

    def bindings(self) -> ApiDiskBindings:
        return ApiDiskBindings(self)

    def register_node(self, name: str, created: datetime.datetime | None = None) -> None:
        """The node's kubelet registered its Node object."""
        self.nodes[name] = _stamp(created)
        self._changed("nodes")

    def report_ready(self, name: str) -> None:
        """The node's kubelet reported its status (the Ready condition's heartbeat) now."""
        self.heartbeats[name] = _stamp()
        self._changed("nodes")

    def add_csr(self, username: str, conditions: str = "") -> None:
        self.csrs.append((username, conditions))
        self._changed("certificatesigningrequests")

    def authenticates(self, token: str) -> bool:
        """Whether the API server would accept this bootstrap token now (its Secret exists and matches)."""
        token_id, token_secret = token.split(".")
        secret = self.secrets.get(f"bootstrap-token-{token_id}")
        return secret is not None and base64.b64decode(secret["data"]["token-secret"]).decode() == token_secret

    # --- the ClusterApi calls ---------------------------------------------------------------------------------

    def _store(self, resource: str) -> dict:
        # Anything else (leases, events; nodes, which this API does not serve as objects: read answers 404) is kept as is.
        if resource == "secrets":
            return self.secrets
        if resource == "configmaps":
            return self.configmaps
        return self.others.setdefault(resource, {})

    @property
    def fail_bindings(self) -> bool:
        return self._fail_bindings

    @fail_bindings.setter
    def fail_bindings(self, failing: bool) -> None:
        self._fail_bindings = failing
        if not failing:
            # The watches that could not list while the API was away list now.
            for watched in self._watches.get("configmaps", []):
                if not watched.synced.is_set():
                    watched.synced.set()
                    watched.on_change()

    def _reachable(self, resource: str, what: str) -> None:
        if resource == "configmaps" and self.fail_bindings:
            raise ApiUnavailable(f"the Kubernetes API at {self.host} did not answer {what} (connection refused)")

    async def create(self, resource: str, body: dict, namespace: str = "kube-system") -> dict:
        name = body["metadata"]["name"]
        self.calls.append(("create", resource))
        self._reachable(resource, f"creating {resource} kube-system/{name}")
        body = json.loads(json.dumps(body))
        if resource == "secrets":
            node = body["stringData"]["description"].removeprefix("confidential.kubernetes join of ")
            self.entered.set()
            if self.gate is not None and (not self.gated or node in self.gated):
                await asyncio.get_running_loop().run_in_executor(None, self.gate.wait, 10)
            if self.delay:
                await asyncio.sleep(self.delay)
            body["data"] = {k: base64.b64encode(v.encode()).decode() for k, v in body.pop("stringData").items()}
        store = self._store(resource)
        if name in store:
            raise ApiStatusError(
                409, f'creating {resource} kube-system/{name}: HTTP 409: {resource} "{name}" already exists'
            )
        return self._put(resource, name, body)

    def _put(self, resource: str, name: str, body: dict) -> dict:
        self._version += 1
        body["metadata"]["resourceVersion"] = str(self._version)
        body["metadata"].setdefault("creationTimestamp", _stamp())
        self._store(resource)[name] = body
        if resource == "secrets":
            data = {k: base64.b64decode(v).decode() for k, v in body["data"].items()}
            node = data["description"].removeprefix("confidential.kubernetes join of ")
            self.tokens.append((node, f"{data['token-id']}.{data['token-secret']}"))
        self._changed(resource)
        return body

    async def read(self, resource: str, name: str) -> dict:
        self.calls.append(("read", resource))
        self._reachable(resource, f"reading {resource} kube-system/{name}")
        item = self._store(resource).get(name)
        if item is None:
            raise ApiStatusError(404, f'reading {resource} kube-system/{name}: HTTP 404: {resource} "{name}" not found')
        return json.loads(json.dumps(item))

    async def replace(self, resource: str, name: str, body: dict) -> dict:
        self.calls.append(("replace", resource))
        self._reachable(resource, f"replacing {resource} kube-system/{name}")
        held = self._store(resource).get(name, {}).get("metadata", {}).get("resourceVersion")
        if held != body["metadata"].get("resourceVersion"):
            raise ApiStatusError(
                409, f"replacing {resource} kube-system/{name}: HTTP 409: the object has been modified"
            )
        return self._put(resource, name, json.loads(json.dumps(body)))

    async def delete(self, resource: str, name: str) -> bool:
        self.calls.append(("delete", resource))
        self._reachable(resource, f"deleting {resource} kube-system/{name}")
        if self._store(resource).pop(name, None) is None:
            return False
        if resource == "secrets":
            self.retired.append(name.removeprefix("bootstrap-token-"))
        self._changed(resource)
        return True

    async def list(self, resource: str, **selectors: str) -> list[dict]:
        self.calls.append(("list", resource))
        self._reachable(resource, f"listing {resource}")
        return json.loads(json.dumps(self._objects(resource)))

    def _objects(self, resource: str) -> list[dict]:
        if resource == "nodes":
            return [
                {
                    "metadata": {"name": name, "creationTimestamp": created},
                    "status": {"conditions": [{"type": "Ready", "lastHeartbeatTime": self.heartbeats[name]}]}
                    if name in self.heartbeats
                    else {},
                }
                for name, created in self.nodes.items()
            ]
        if resource == "certificatesigningrequests":
            return [
                {
                    "metadata": {"name": f"csr-{number}"},
                    "spec": {"username": user},
                    "status": {"conditions": [{"type": kind} for kind in conditions.split()]},
                }
                for number, (user, conditions) in enumerate(self.csrs)
            ]
        return list(self._store(resource).values())

    def watch(self, resource: str, summarize, on_change, on_failure=None, **selectors) -> FakeWatch:
        watched = FakeWatch(lambda: self._objects(resource), summarize, on_change)
        self._watches.setdefault(resource, []).append(watched)
        if not (resource == "configmaps" and self.fail_bindings):
            watched.synced.set()
            on_change()
        return watched

    def _changed(self, resource: str) -> None:
        if resource in self.withheld:
            return
        for watched in self._watches.get(resource, []):
            if watched.synced.is_set():
                watched.on_change()

    def close(self) -> None:
        """A service that used this API stopped; the API (and the other services' watches) stay."""


class ProcessCounter:
    """While entered, counts every process this Python process starts, whichever way: subprocess (asyncio's too) and
    multiprocessing (fork_exec), posix_spawn, fork. ``started`` names the call of each."""

    TARGETS = (
        (subprocess, "_fork_exec"),
        (_posixsubprocess, "fork_exec"),
        (os, "posix_spawn"),
        (os, "posix_spawnp"),
        (os, "fork"),
    )

    def __init__(self):
        self.started: list[str] = []
        self._real: list[tuple] = []

    def __enter__(self) -> "ProcessCounter":
        for module, name in self.TARGETS:
            real = getattr(module, name)

            def counting(*args, _real=real, _name=name, **kwargs):
                self.started.append(_name)
                return _real(*args, **kwargs)

            self._real.append((module, name, real))
            setattr(module, name, counting)
        return self

    def __exit__(self, *exc_info) -> None:
        for module, name, real in self._real:
            setattr(module, name, real)
        self._real.clear()


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
        self.secrets_file = write(
            tmp_path / "cluster-secrets.json",
            json.dumps({k: base64.b64encode(v).decode() for k, v in self.secrets.items()}).encode(),
            0o600,
        )
        self.ek_ca_file = write(tmp_path / "ek-ca.pem", swtpm.ca_pem, 0o644)
        self.policy_file = tmp_path / "policy.json"
        self.enrolment_file = tmp_path / "node-enrolment.json"
        self.enrolments: dict[str, Enrolment] = {}
        # The API the services share unless a test gives one (a restarted service finds what its predecessor wrote).
        self.api: FakeApi | None = None
        self.log_stream = io.StringIO()
        self.log = StructuredLog(self.log_stream)
        self.services = []

    def write_policy(self, ak_trust: str = "pcrs-only", tcti: str | None = None) -> MeasurementPolicy:
        policy = policy_from_swtpm(tcti or self.swtpm.tcti, ak_trust)
        self.policy_file.write_text(dump_policy(policy))
        return policy

    def enrol(
        self,
        tcti: str,
        node_name: str,
        control_plane: bool = False,
        disk_uuid: str | None = None,
        enrolment_id: str = "",
    ) -> str:
        """Enrol the TPM behind ``tcti`` (its real EK) as the controller does; returns its identity."""
        with issuer.Tpm(tcti) as tpm:
            certificate, handle, ek_public = tpm.endorsement_key()
            tpm.flush(handle)
        identity = ek_identity(ek_public)
        self.enrolments = {ek: e for ek, e in self.enrolments.items() if e.node_name != node_name}
        self.enrolments[identity] = Enrolment(identity, node_name, control_plane, disk_uuid, enrolment_id, certificate)
        self.write_enrolment()
        return identity

    def write_enrolment(self) -> None:
        # A new file (inode) each time, as the role's copy writes it.
        staged = self.enrolment_file.with_suffix(".new")
        staged.write_bytes(dump_enrolment(list(self.enrolments.values())))
        os.replace(staged, self.enrolment_file)

    def config(self, port: int = 0, **overrides) -> ServiceConfig:
        settings = dict(
            listen=f"127.0.0.1:{port}",
            tls_cert=str(self.tls_cert),
            tls_key=str(self.tls_key),
            secrets_file=str(self.secrets_file),
            policy_file=str(self.policy_file),
            ek_ca_file=str(self.ek_ca_file),
            pki_dir=str(self.pki_dir),
            api_server_endpoint=API_SERVER,
            kubernetes_version=K8S_VERSION,
            enrolment_file=str(self.enrolment_file),
            bindings_file=str(self.dir / "disk-bindings.json"),
            quarantine_file=str(self.dir / "attestation-quarantine.json"),
            policy_check_interval=0,
        )
        settings.update(overrides)
        return ServiceConfig(**settings)

    def start(
        self,
        ak_trust: str | None = "pcrs-only",
        api: FakeApi | None = None,
        nonces: MacNonces | None = None,
        port: int = 0,
        drain_delay: float = 0.0,
        **settings,
    ):
        if ak_trust is not None:
            self.write_policy(ak_trust)
        if not self.enrolments:
            self.enrol(self.swtpm.tcti, "worker-1")
        api = api or self.api or FakeApi()
        self.api = api
        service = build_service(self.config(port, **settings), self.log, None, nonces, drain_delay, api).start()
        service.minter = api
        service.endpoint = f"127.0.0.1:{service.port}"
        self.services.append(service)
        return service

    def stub(self, service):
        channel = grpc.secure_channel(
            service.endpoint, grpc.ssl_channel_credentials(self.ca_pem), options=[("grpc.use_local_subchannel_pool", 1)]
        )
        return pb2_grpc.JoinServiceStub(channel), channel

    def logs(self) -> list[dict]:
        return [json.loads(line) for line in self.log_stream.getvalue().splitlines()]

    def close(self) -> None:
        for service in self.services:
            service.stop_now()


def evidence_for(tcti: str, nonce: bytes, user_data: bytes) -> bytes:
    with issuer.Tpm(tcti) as tpm:
        return issuer.issue_evidence(tpm, nonce, user_data).to_json().encode()


def bound_user_data(
    key_public: bytes,
    flow: str = "join",
    node_name: str = "worker-1",
    control_plane: bool = False,
    disk_uuid: str = DISK_UUID,
    csr: bytes = b"",
) -> bytes:
    """What a genuine node quotes: its ephemeral key followed by the digest of what it asks for."""
    return bind_user_data(key_public, request_digest(flow, node_name, control_plane, disk_uuid, csr_key_digest(csr)))


def join_request(
    tcti: str,
    nonce: bytes,
    key_public: bytes,
    node_name: str = "worker-1",
    control_plane: bool = False,
    csr: bytes | None = None,
    disk_uuid: str = DISK_UUID,
    evidence: bytes | None = None,
):
    """A genuine node's step 1: evidence from ``tcti`` bound to the nonce, the key and exactly this request."""
    csr = csr if csr is not None else make_csr(node_name)
    if evidence is None:
        evidence = evidence_for(
            tcti, nonce, bound_user_data(key_public, "join", node_name, control_plane, disk_uuid, csr)
        )
    return pb2.IssueJoinTicketRequest(
        evidence=evidence,
        nonce=nonce,
        node_name=node_name,
        control_plane=control_plane,
        kubelet_csr=csr,
        disk_uuid=disk_uuid,
    )


def activate(stub, tcti: str, challenge, nonce: bytes):
    """A node's step 2: activate the credential with the TPM behind ``tcti`` and send the proof."""
    proof = prove_activation(tcti, challenge.credential_blob, challenge.credential_encrypted_seed, nonce)
    return stub.ActivateTicket(pb2.ActivateTicketRequest(nonce=nonce, activation_proof=proof))


def join_raw(lab, stub, tcti: str | None = None, **request) -> tuple[dict, bytes]:
    """Both steps over a raw stub; returns the opened ticket and the nonce."""
    tcti = tcti or lab.swtpm.tcti
    nonce = stub.GetNonce(pb2.GetNonceRequest()).nonce
    key = EphemeralKey.generate()
    challenge = stub.IssueJoinTicket(join_request(tcti, nonce, key.public_bytes(), **request))
    response = activate(stub, tcti, challenge, nonce)
    return open_ticket(key, response.sealed_ticket, "join", nonce, lab.services[-1].issuer.verifier_id), nonce


def told_only_the_log(lab, told: str, detail: str) -> bool:
    """A step-1 registry refusal: the caller was told the generic text, not ``detail``; the service's log has it."""
    logged = any(line.get("result") == "refused" and detail in (line.get("msg") or "") for line in lab.logs())
    return detail not in told and STEP1_NOT_GRANTED in told and logged


def wait_for(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


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


def join_with_client(
    lab, service, node_name="worker-1", control_plane=False, csr=None, tcti=None, disk_uuid=None, **kwargs
):
    """A node's whole join through the collection's client (nonce, evidence, request, credential activation, opening).

    The lab's swtpm joins with DISK_UUID, any other TPM with OTHER_DISK_UUID (each node its own disk)."""
    tcti = tcti or lab.swtpm.tcti
    disk_uuid = disk_uuid or (DISK_UUID if tcti == lab.swtpm.tcti else OTHER_DISK_UUID)
    return request_ticket(
        [service.endpoint],
        lab.ca_pem,
        tcti,
        node_name,
        control_plane=control_plane,
        disk_uuid=disk_uuid,
        kubelet_csr_pem=csr if csr is not None else make_csr(node_name),
        **kwargs,
    )
