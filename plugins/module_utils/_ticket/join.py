# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node side of a join: the kubelet CSR, the request to the join service, and applying the ticket."""

from __future__ import annotations

import base64
import binascii
import json
import os
import re

from . import TicketError, cluster_id_of, keep_root_secrets, key_state_disk, root_secrets, secret_bytes, write_if_changed

try:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
except ImportError:  # reported by the modules through missing_required_lib()
    pass

PKI_DIR = "/etc/kubernetes/pki"
KUBELET_PKI_DIR = "/var/lib/kubelet/pki"
KUBELET_CLIENT = "kubelet-client-current.pem"
# Files a control-plane ticket may carry, relative to the PKI directory.
CONTROL_PLANE_FILES = {"ca.crt", "ca.key", "sa.key", "sa.pub", "front-proxy-ca.crt", "front-proxy-ca.key", "etcd/ca.crt", "etcd/ca.key"}
_MODE = re.compile(r"0[0-7]{3}")


def kubelet_csr(node_name: str) -> tuple[bytes, bytes]:
    """A fresh P-256 key and its CSR for CN=system:node:<name>, O=system:nodes."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
                         x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node_name}")])
    csr = x509.CertificateSigningRequestBuilder().subject_name(subject).sign(key, hashes.SHA256())
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return key_pem, csr.public_bytes(serialization.Encoding.PEM)


def request(params: dict, disk_uuid: str, csr_pem: bytes) -> dict:
    from .._join.client import JoinError, request_ticket
    try:
        return request_ticket(
            endpoints=params["endpoints"], ca_pem=params["cluster_ca"].encode(), tcti=params["tcti"],
            node_name=params["node_name"], control_plane=params["control_plane"], disk_uuid=disk_uuid,
            kubelet_csr_pem=csr_pem, attempts=params["attempts"], timeout=params["timeout"])
    except JoinError as exc:
        raise TicketError(f"no join ticket: {exc}") from None


def _text(payload: dict, name: str) -> str:
    value = payload.get(name)
    if not isinstance(value, str) or not value:
        raise TicketError(f"join ticket lacks {name!r}")
    return value


def apply_join_ticket(payload: dict, params: dict, lock, kubelet_key_pem: bytes) -> dict:
    """Lock the node for the ticket's cluster, key the disk, write the files; returns the non-secret result."""
    cluster_id = cluster_id_of(payload)
    lock.take(cluster_id)
    disk = key_state_disk(params["state_disk"], secret_bytes(payload, "state_disk_key"), False)
    # kubeadm writes ca.crt itself on workers (its preflight refuses an existing one); control planes get
    # it with the rest of their PKI below.
    _text(payload, "ca_crt")
    kubelet_pem = _text(payload, "kubelet_client_crt").encode() + kubelet_key_pem
    write_if_changed(os.path.join(KUBELET_PKI_DIR, KUBELET_CLIENT), kubelet_pem, 0o600, False)
    files = payload.get("control_plane_files") or {}
    if params["control_plane"] and not files:
        raise TicketError("a control-plane join ticket must carry the control-plane PKI files")
    for relative, entry in sorted(files.items()):
        if relative not in CONTROL_PLANE_FILES or not isinstance(entry, dict) or not _MODE.fullmatch(str(entry.get("mode", ""))):
            raise TicketError(f"join ticket carries an unexpected control-plane file {relative!r}")
        try:
            content = base64.b64decode(entry.get("content", ""), validate=True)
        except (binascii.Error, ValueError):
            raise TicketError(f"control-plane file {relative!r} in the join ticket is not base64") from None
        write_if_changed(os.path.join(PKI_DIR, relative), content, int(entry["mode"], 8), False)
    secrets = payload.get("cluster_secrets")
    if params["control_plane"]:
        # A control plane runs a join service of its own, which needs the root secrets.
        keep_root_secrets(params["secrets_file"], root_secrets(secrets, "the join ticket's cluster secrets"), False)
    write_if_changed(params["token_file"], _text(payload, "bootstrap_token").encode(), 0o600, False)
    hashes_ = payload.get("ca_cert_hashes")
    if not isinstance(hashes_, list) or not hashes_:
        raise TicketError("join ticket lacks the CA pins")
    record = {"cluster_id": cluster_id.hex(), "api_server_endpoint": _text(payload, "api_server_endpoint"), "ca_cert_hashes": hashes_}
    write_if_changed(params["join_record"], (json.dumps(record, sort_keys=True) + "\n").encode(), 0o644, False)
    return dict(record, state_disk=disk)
