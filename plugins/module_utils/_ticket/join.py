# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node side of a join, the one implementation behind the join_ticket and kubeadm_join modules and the boot-time join.

``NodeJoin`` tells where a node stands (``state()``) and takes it one step on:
a fresh node gets a join ticket (kubelet CSR, nonce, evidence, ticket), takes the
node lock, re-keys its state disk, writes the files and leaves the bootstrap token
in a 0600 file for ``kubeadm join``; a member whose PCR 15 was reset by a reboot
gets a rejoin ticket (disk key and measurement secret only), marks PCR 15 again
and checks (or opens) its state disk with the key; a member is left alone.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields

from . import (
    SECRETS_FILE,
    NoJoinService,
    TicketError,
    cluster_id_of,
    disk_uuid,
    keep_root_secrets,
    key_state_disk,
    luks_uuid,
    state_disk_ready,
    write_if_changed,
)
from .._join.protocol import JOIN, REJOIN, JoinTicket, RejoinTicket
from .._kubeadm import BOOTSTRAP_KUBELET_CONF, CA_CERT, KUBELET_CONF, TOKEN_FILE
from .._kubeadm import encryption
from .._nodelock import DEFAULT_RECORD, NodeLock
from .._reset import NEEDS_RESET
from .versions import check_cluster_version

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

JOIN_RECORD = "/etc/confidential-kubernetes/join.json"

RECORD_FIELDS = ("cluster_id", "api_server_endpoint", "ca_cert_hashes")
# Where a node stands (NodeJoin.state()).
FRESH = "fresh"  # never joined: a full join
PENDING = "pending"  # ticket applied in this boot, kubeadm join still to run
MEMBER = "member"  # joined, PCR 15 carries the cluster's mark: nothing to do
REBOOTED = "rebooted"  # joined, PCR 15 reset by a reboot: a rejoin


def kubelet_csr(node_name: str) -> tuple[bytes, bytes]:
    """A fresh P-256 key and its CSR for CN=system:node:<name>, O=system:nodes (O only for a node the registry names)."""
    key = ec.generate_private_key(ec.SECP256R1())
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes")]
    if node_name:
        attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node_name}"))
    subject = x509.Name(attributes)
    csr = x509.CertificateSigningRequestBuilder().subject_name(subject).sign(key, hashes.SHA256())
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return key_pem, csr.public_bytes(serialization.Encoding.PEM)


@dataclass
class JoinSettings:
    """What a node needs to join (nothing secret): the options of join_ticket, and of the boot-time join's configuration.

    An empty ``node_name`` asks the join service for the name its registry grants this TPM (the enrolled name, or the
    pool name derived from the EK); a name given must be the granted one."""

    endpoints: list
    cluster_ca: str
    node_name: str
    state_disk: dict
    control_plane: bool = False
    tcti: str = "auto"
    attempts: int = 8
    timeout: float = 30.0
    total_timeout: float = 300.0
    token_file: str = TOKEN_FILE
    lock_record: str = DEFAULT_RECORD
    join_record: str = JOIN_RECORD
    secrets_file: str = SECRETS_FILE
    kubelet_version: str = ""
    # auto: the firmware's event log where the node has one and it can be used; none: no event log.
    event_log: str = "auto"
    # A control plane's Secrets encryption configuration (empty: none) and its key generations (the cluster's own, as
    # its other control planes' files name them).
    encryption_config: str = encryption.CONFIG_PATH
    encryption_keys: tuple = (0,)

    @classmethod
    def of(cls, options: dict) -> "JoinSettings":
        return cls(**{f.name: options[f.name] for f in fields(cls) if options.get(f.name) is not None})


class NodeJoin:
    """One node's join. ``lock`` and ``root`` are seams for tests (a NodeLock on a swtpm with its own boot ID, a temp root
    for the Kubernetes files)."""

    def __init__(self, settings: JoinSettings, lock: NodeLock | None = None, root: str = "/"):
        self.settings = settings
        self.lock = lock or NodeLock.for_tcti(settings.tcti, settings.lock_record)
        # What the operator should know of the evidence this node sent (an event log left out).
        self.warnings: list[str] = []
        self.root = root
        self.kubelet_conf = self._path(KUBELET_CONF)

    def _path(self, absolute: str) -> str:
        return os.path.join(self.root, absolute.lstrip("/"))

    def record(self) -> dict | None:
        """The non-secret record of the join (cluster ID, API server endpoint, CA pins), None before a ticket was applied."""
        try:
            with open(self.settings.join_record, encoding="utf-8") as handle:
                record = json.load(handle)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise TicketError(f"join record {self.settings.join_record} is unreadable ({exc}); {NEEDS_RESET}") from None
        if not isinstance(record, dict) or not all(isinstance(record.get(k), (str, list)) for k in RECORD_FIELDS):
            raise TicketError(f"join record {self.settings.join_record} is malformed; {NEEDS_RESET}")
        return record

    def state(self) -> str:
        """FRESH, PENDING, MEMBER or REBOOTED; a TicketError for a node that is none of these (it needs a reset).

        A joined node is judged by what the root disk keeps (the lock record and the join record) and PCR 15 first:
        its ``kubelet.conf`` lives on the state disk, which stays locked after a reboot until a rejoin opens it, so its
        absence says nothing before the disk is open. Only a node marked in this boot whose disk is ready is judged by
        ``kubelet.conf``; one marked whose disk is not open (a rejoin cut short between the mark and the disk) rejoins
        again, which the join service allows with the cluster's mark.
        """
        record = self.record()
        lock = self.lock.state()
        kubelet_conf = os.path.exists(self.kubelet_conf)
        if lock.locked and record is not None and lock.cluster_id == record["cluster_id"]:
            if lock.pcr15_state == "unlocked":
                return REBOOTED
            if lock.pcr15_state == "marked":
                if not state_disk_ready(self.settings.state_disk):
                    return REBOOTED
                if kubelet_conf:
                    return MEMBER
                return self._pending()
        if kubelet_conf and record is None:
            raise TicketError(
                f"{self.kubelet_conf} exists but there is no join record {self.settings.join_record}: "
                "this node was joined or initialised by other means; nothing was changed"
            )
        if record is not None and lock.locked:
            raise TicketError(
                f"the node joined cluster {record['cluster_id']} but its lock record says "
                f"{lock.cluster_id} and PCR 15 is {lock.pcr15} ({lock.pcr15_state}): it was tampered "
                f"with; {NEEDS_RESET}"
            )
        if not lock.locked:
            if kubelet_conf:
                raise TicketError(
                    f"the node joined cluster {record['cluster_id']} but has no lock record "
                    f"{self.settings.lock_record}: it was tampered with; {NEEDS_RESET}"
                )
            return FRESH
        raise self._not_joined()

    def _not_joined(self) -> TicketError:
        return TicketError(
            f"the node is locked (lock record {self.settings.lock_record}) but has not joined: a "
            f"join failed after the point of no return; {NEEDS_RESET}"
        )

    def _pending(self) -> str:
        """A node marked in this boot, its disk ready, no kubelet.conf: a kubeadm join to run, or one cut short."""
        if not os.path.exists(self.settings.token_file):
            raise self._not_joined()
        # Workers get ca.crt from kubeadm itself; either file means kubeadm join started and was cut short.
        leftovers = (self._path(BOOTSTRAP_KUBELET_CONF), None if self.settings.control_plane else self._path(CA_CERT))
        started = [path for path in leftovers if path and os.path.exists(path)]
        if started:
            raise TicketError(f"kubeadm join was interrupted on this node ({started[0]} is left behind): {NEEDS_RESET}")
        return PENDING

    def _request(self, flow: str, uuid: str, csr_pem: bytes = b"", attempts: int = 0) -> JoinTicket | RejoinTicket:
        from .._join.client import JoinError, request_ticket

        settings = self.settings
        try:
            return request_ticket(
                endpoints=settings.endpoints,
                ca_pem=settings.cluster_ca.encode(),
                tcti=settings.tcti,
                node_name=settings.node_name,
                control_plane=settings.control_plane and flow == JOIN,
                disk_uuid=uuid,
                kubelet_csr_pem=csr_pem,
                flow=flow,
                attempts=attempts or settings.attempts,
                timeout=settings.timeout,
                total_timeout=settings.total_timeout,
                event_log=settings.event_log,
                warnings=self.warnings,
            )
        except JoinError as exc:
            if exc.retryable:
                raise NoJoinService(f"no {flow} ticket: {exc}") from None
            raise TicketError(f"no {flow} ticket: {exc}") from None

    def _require_cluster_ca(self, flow: str) -> None:
        """The join services' TLS is checked against the cluster CA: a join or rejoin without it changes nothing."""
        if not self.settings.cluster_ca.strip():
            raise TicketError(
                f"cluster_ca is empty: a {flow} needs the cluster CA (PEM) to check the join services' TLS certificates; "
                "nothing was changed"
            )

    def join(self) -> dict:
        """A fresh node: ticket, node lock, state disk, files, token file. Returns the join record and the state disk result."""
        self._require_cluster_ca(JOIN)
        try:
            encryption.check_generations(list(self.settings.encryption_keys))
        except encryption.EncryptionConfigError as exc:
            raise TicketError(f"{exc}; nothing was changed") from None
        uuid = disk_uuid(self.settings.state_disk, False)[0]
        private_key_pem, csr_pem = kubelet_csr(self.settings.node_name)
        return self._apply_join_ticket(self._request(JOIN, uuid, csr_pem), private_key_pem)

    def rejoin(self, attempts: int = 0) -> dict:
        """A rebooted member: rejoin ticket, PCR 15 marked again, the state disk checked (or opened) with its key.

        ``attempts`` (0: the settings') bounds the tries; NoJoinService when no join service answered at all."""
        self._require_cluster_ca(REJOIN)
        record = self.record()
        ticket = self._request(REJOIN, luks_uuid(self.settings.state_disk), attempts=attempts)
        cluster_id = cluster_id_of(ticket)
        if record is None or cluster_id.hex() != record["cluster_id"]:
            raise TicketError(
                f"the rejoin ticket is for cluster {cluster_id.hex()}, but this node joined "
                f"{record['cluster_id'] if record else 'no cluster'}; nothing was changed"
            )
        self.lock.take(cluster_id)
        disk = key_state_disk(self.settings.state_disk, ticket.state_disk_key, False)
        return dict(record, state_disk=disk)

    def node_name(self) -> str:
        """The node's name: the one its join ticket granted (in the join record), else the one it was configured with."""
        record = self.record()
        return (record or {}).get("node_name") or self.settings.node_name

    def _apply_join_ticket(self, ticket: JoinTicket, kubelet_key_pem: bytes) -> dict:
        """Lock the node for the ticket's cluster, key the disk, write the files; returns the non-secret result.

        The ticket's fields were checked when it was read (``JoinTicket.from_bytes``)."""
        settings = self.settings
        granted = ticket.node_name
        if settings.node_name and granted != settings.node_name:
            raise TicketError(
                f"the join ticket names this node {granted!r}, not {settings.node_name!r}; nothing was changed"
            )
        if settings.control_plane and not (ticket.control_plane_files and ticket.cluster_secrets):
            raise TicketError(
                "a control-plane join ticket must carry the control-plane PKI files and the cluster secrets; "
                "nothing was changed"
            )
        cluster_id = cluster_id_of(ticket)
        check_cluster_version(ticket.kubernetes_version, settings.kubelet_version)
        self.lock.take(cluster_id)
        disk = key_state_disk(settings.state_disk, ticket.state_disk_key, False)
        # kubeadm writes ca.crt itself on workers (its preflight refuses an existing one); control planes get
        # it with the rest of their PKI below.
        kubelet_pem = ticket.kubelet_client_crt.encode() + kubelet_key_pem
        write_if_changed(self._path(os.path.join(KUBELET_PKI_DIR, KUBELET_CLIENT)), kubelet_pem, 0o600, False)
        for pki_file in ticket.control_plane_files:
            write_if_changed(self._path(os.path.join(PKI_DIR, pki_file.path)), pki_file.content, pki_file.mode, False)
        if settings.control_plane:
            # A control plane runs a join service of its own, which needs the root secrets.
            keep_root_secrets(settings.secrets_file, ticket.cluster_secrets, False)
            if settings.encryption_config:
                # Before kubeadm join starts this node's kube-apiserver, which the cluster's configuration points at it.
                try:
                    encryption.write_config(
                        self._path(settings.encryption_config),
                        ticket.cluster_secrets,
                        list(settings.encryption_keys),
                    )
                except encryption.EncryptionConfigError as exc:
                    raise TicketError(f"{exc} (the node is locked; before another try, {NEEDS_RESET})") from None
        write_if_changed(settings.token_file, ticket.bootstrap_token.encode(), 0o600, False)
        record = {
            "cluster_id": cluster_id.hex(),
            "api_server_endpoint": ticket.api_server_endpoint,
            "ca_cert_hashes": list(ticket.ca_cert_hashes),
            "node_name": granted,
        }
        write_if_changed(settings.join_record, (json.dumps(record, sort_keys=True) + "\n").encode(), 0o644, False)
        return dict(record, state_disk=disk)
