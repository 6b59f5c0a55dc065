"""A first control plane as the init hand-over and kubeadm init leave it, in a temp root with a real swtpm (the tests
of init_state, module and module_utils)."""

from __future__ import annotations

import datetime
import json
import os

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.issuer import Tpm
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.root_secrets import RootSecrets
from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm import (
    ADMIN_CONF,
    CA_CERT,
    Kubeadm,
    ca_cert_hash,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._nodelock import NodeLock
from ansible_collections.confidential.kubernetes.plugins.module_utils._ticket.init import init_state

ADMIN_KUBECONFIG = b"apiVersion: v1\nkind: Config\n"
SECRETS = "/etc/confidential-kubernetes/cluster-secrets.json"


def make_ca_pem() -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubernetes")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return certificate.public_bytes(serialization.Encoding.PEM)


class InitialisedNode:
    """What the init hand-over and kubeadm init leave on a node, in a temp root, for a cluster of random secrets."""

    def __init__(self, tmp_path, tcti: str):
        self.root = tmp_path / "root"
        self.tcti = tcti
        self.secrets = RootSecrets(os.urandom(32), os.urandom(32), os.urandom(32))
        self.cluster_id = self.secrets.cluster_id().hex()
        self.lock_record = str(tmp_path / "lock" / "nodelock.json")
        self.kubeadm = Kubeadm(root=str(self.root))
        self.secrets_file = self.kubeadm.path(SECRETS)
        self.lock().take(self.secrets.cluster_id())
        ca_pem = make_ca_pem()
        self.write(CA_CERT, ca_pem)
        self.write(ADMIN_CONF, ADMIN_KUBECONFIG, 0o600)
        self.kubeadm.record_init_completed(ca_cert_hash(ca_pem))
        self.keep(self.secrets)

    def lock(self) -> NodeLock:
        return NodeLock(lambda: Tpm(self.tcti), self.lock_record, boot_id=lambda: "boot-1")

    def write(self, absolute: str, data: bytes, mode: int = 0o644) -> None:
        path = self.kubeadm.path(absolute)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(data)
        os.chmod(path, mode)

    def keep(self, secrets: RootSecrets, mode: int = 0o600) -> None:
        self.write(SECRETS, json.dumps(secrets.to_document()).encode(), mode)

    def state(self, cluster_id: str | None = "this"):
        return init_state(
            self.cluster_id if cluster_id == "this" else cluster_id, self.lock(), self.kubeadm, self.secrets_file
        )
