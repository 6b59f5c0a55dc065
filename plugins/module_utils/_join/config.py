# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The join service's configuration file, its root secrets, and the files it re-reads on change (measurement policy, enrolment)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import threading
import time
from dataclasses import MISSING, dataclass, fields

try:
    import yaml
except ImportError:  # reported by the service at start
    pass

from .._crypto.root_secrets import RootSecrets, RootSecretsError
from .._attestation.policy import MAX_POLICY_BYTES, MeasurementPolicy, parse_policy
from .._files import FileTooLargeError, read_bounded, read_bounded_from, write_file_atomically
from .._kubeadm import ADMIN_CONF
from .log import StructuredLog

DEFAULT_LISTEN = "0.0.0.0:9290"
DEFAULT_VERIFIER_ID = "confidential.kubernetes/joinservice"
DEFAULT_PKI_DIR = "/etc/kubernetes/pki"
DEFAULT_ENROLMENT_FILE = "/etc/confidential-kubernetes/node-enrolment.json"
DEFAULT_BINDINGS_FILE = "/etc/confidential-kubernetes/disk-bindings.json"
DEFAULT_QUARANTINE_FILE = "/etc/confidential-kubernetes/attestation-quarantine.json"
_FLOATS = (
    "nonce_ttl",
    "grace_period",
    "policy_check_interval",
    "nonce_rate",
    "nonce_burst",
    "ticket_rate",
    "ticket_burst",
    "connection_idle_timeout",
    "handshake_timeout",
    "first_rpc_timeout",
    "health_rate",
    "health_burst",
    "attestation_grace",
)
FAILURE_ACTIONS = ("quarantine", "taint", "report")
_POSITIVE = ("request_message_timeout",)
_COUNTS = (
    "max_registrations",
    "max_concurrent_rpcs",
    "max_connections",
    "max_connections_per_client",
    "max_connections_per_network",
    "max_calls_per_client",
    "max_calls_per_network",
)
_POOL_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9]{0,39}[a-z0-9])?")
MAX_CONFIG_BYTES = 64 * 1024
POLICY_CHECK_INTERVAL = 1.0
_ENDPOINT = re.compile(r"(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):([0-9]{1,5})")


class ConfigError(ValueError):
    """The service configuration, its secrets file or one of the files it names is unusable; the message says which and why."""


@dataclass(frozen=True)
class ServiceConfig:
    tls_cert: str
    tls_key: str
    secrets_file: str
    policy_file: str
    api_server_endpoint: str
    # Empty: the joining node's installed kubeadm decides.
    kubernetes_version: str = ""
    listen: str = DEFAULT_LISTEN
    ek_ca_file: str | None = None
    pki_dir: str = DEFAULT_PKI_DIR
    admin_kubeconfig: str = ADMIN_CONF
    verifier_id: str = DEFAULT_VERIFIER_ID
    nonce_ttl: float = 60.0
    policy_check_interval: float = POLICY_CHECK_INTERVAL
    grace_period: float = 30.0
    max_registrations: int = 16
    # The node registry: enrolments the controller pushes, disk bindings this service keeps (mirror of the cluster's).
    enrolment_file: str = DEFAULT_ENROLMENT_FILE
    bindings_file: str = DEFAULT_BINDINGS_FILE
    # Autoscaled pools: an unenrolled TPM whose EK certificate chains to the EK CA joins as worker <prefix>-<EK digest>.
    pool_workers: bool = False
    pool_name_prefix: str = "pool"
    # Flood resistance: requests per second (and bursts) per client address, caps, idle connections closed.
    nonce_rate: float = 50.0
    nonce_burst: float = 100.0
    ticket_rate: float = 20.0
    ticket_burst: float = 50.0
    health_rate: float = 5.0
    health_burst: float = 20.0
    # Calls in progress in all, of one client and of one network (a /24, an IPv6 /48): the global cap holds four networks'
    # shares, a network's sixteen clients'; a call's request message must follow its headers within request_message_timeout.
    max_concurrent_rpcs: int = 256
    max_calls_per_client: int = 16
    max_calls_per_network: int = 64
    request_message_timeout: float = 5.0
    # At max_connections the gate closes the biggest holder's oldest idle connection; a network holds at most
    # max_connections_per_network. A connection with no call for connection_idle_timeout is closed (gRPC's GOAWAY, then
    # the gate 5 s later).
    max_connections: int = 1024
    max_connections_per_network: int = 128
    connection_idle_timeout: float = 10.0
    # Per client (an IPv4 address, an IPv6 prefix of client_ipv6_prefix bits): open connections, accepted by the service's
    # gate before gRPC; a connection that sends nothing within handshake_timeout, or makes no RPC within first_rpc_timeout,
    # is closed.
    max_connections_per_client: int = 32
    client_ipv6_prefix: int = 64
    handshake_timeout: float = 5.0
    first_rpc_timeout: float = 10.0
    # Processes for the CPU-bound steps of a join (verify, sign, seal): one per core beside the event loop's (which is busy
    # with gRPC and TLS when joins arrive faster than one core verifies them); 0 runs the steps in the event loop's thread.
    worker_processes: int = max(1, (os.cpu_count() or 1) - 1)
    # Continuous attestation (DESIGN section 8): how often nodes attest, how long a silent node is trusted (0: three
    # intervals), and what a failure costs it.
    attestation_interval: float = 60.0
    attestation_grace: float = 0.0
    attestation_failure_action: str = "quarantine"
    # The quarantined records as this service last saw them (attest_state.QuarantineMirror).
    quarantine_file: str = DEFAULT_QUARANTINE_FILE

    @classmethod
    def from_document(cls, doc: object, source: str) -> "ServiceConfig":
        if not isinstance(doc, dict):
            raise ConfigError(f"{source} must be a mapping of settings")
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(str(k) for k in doc if k not in known)
        if unknown:
            raise ConfigError(f"{source} has unknown setting(s): {', '.join(unknown)}")
        missing = [name for name, f in known.items() if f.default is MISSING and name not in doc]
        if missing:
            raise ConfigError(f"{source} lacks required setting(s): {', '.join(missing)}")
        values = {}
        for name, value in doc.items():
            if name in _FLOATS:
                ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
            elif name in _COUNTS:
                ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
            elif name in _POSITIVE:
                ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
            elif name == "client_ipv6_prefix":
                ok = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 128
            elif name == "worker_processes":
                ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
            elif name == "pool_workers":
                ok = isinstance(value, bool)
            elif name == "pool_name_prefix":
                ok = isinstance(value, str) and _POOL_PREFIX.fullmatch(value) is not None
            elif name == "ek_ca_file":
                ok = value is None or isinstance(value, str)
                value = value or None
            elif name == "kubernetes_version":
                ok = isinstance(value, str)
            elif name == "attestation_interval":
                ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
            elif name == "attestation_failure_action":
                ok = value in FAILURE_ACTIONS
            else:
                ok = isinstance(value, str) and value != ""
            if not ok:
                raise ConfigError(f"{source}: setting {name} has the unusable value {value!r}")
            values[name] = value
        config = cls(**values)
        if (
            not _ENDPOINT.fullmatch(config.api_server_endpoint)
            or not 0 < int(config.api_server_endpoint.rsplit(":", 1)[1]) < 65536
        ):
            raise ConfigError(f"{source}: api_server_endpoint {config.api_server_endpoint!r} must be host:port")
        if not _ENDPOINT.fullmatch(config.listen):
            raise ConfigError(f"{source}: listen {config.listen!r} must be address:port")
        # Each level's cap holds shares of the level below: a client's share larger than its network's (or the server's)
        # would let one address take all of it.
        for levels in (
            ("max_calls_per_client", "max_calls_per_network", "max_concurrent_rpcs"),
            ("max_connections_per_client", "max_connections_per_network", "max_connections"),
        ):
            values = [getattr(config, name) for name in levels]
            if not values[0] <= values[1] <= values[2]:
                raise ConfigError(
                    f"{source}: {levels[0]} ({values[0]}) <= {levels[1]} ({values[1]}) <= {levels[2]} ({values[2]}) "
                    "must hold: one client's or one network's share cannot exceed what it is a share of"
                )
        return config


def load_config(path: str) -> ServiceConfig:
    try:
        text = read_bounded(path, MAX_CONFIG_BYTES)
    except OSError as exc:
        raise ConfigError(f"cannot read join service configuration {path}: {exc.strerror}") from None
    except FileTooLargeError as exc:
        raise ConfigError(f"join service configuration {exc}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(
            f"join service configuration {path} is neither JSON nor YAML: {str(exc).splitlines()[0]}"
        ) from None
    return ServiceConfig.from_document(doc, f"join service configuration {path}")


def read_service_copy(path: str, what: str, limit: int) -> str | None:
    """The text of a file this service keeps for itself (a mirror of the cluster's state), None when there is none
    yet; ConfigError naming ``what`` when it cannot be read."""
    try:
        return read_bounded(path, limit)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror}") from None
    except FileTooLargeError as exc:
        raise ConfigError(f"{what} {exc}") from None


def read_private_file(path: str, what: str, limit: int = MAX_CONFIG_BYTES) -> bytes:
    """Read a file that must not be accessible to group or others (refuse it otherwise)."""
    try:
        with open(path, "rb") as handle:
            mode = stat.S_IMODE(os.fstat(handle.fileno()).st_mode)
            if mode & 0o077:
                raise ConfigError(
                    f"{what} {path} has mode {mode:04o}; it must not be accessible to group or others (chmod 600)"
                )
            return read_bounded_from(handle, path, limit)
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror}") from None
    except FileTooLargeError as exc:
        raise ConfigError(f"{what} {exc}") from None


def load_root_secrets(path: str) -> RootSecrets:
    data = read_private_file(path, "cluster secrets file")
    try:
        return RootSecrets.from_document(json.loads(data), f"cluster secrets file {path}")
    except ValueError as exc:  # RootSecretsError is a ValueError, and so is bad JSON
        message = str(exc) if isinstance(exc, RootSecretsError) else f"cluster secrets file {path} is not JSON"
        raise ConfigError(message) from None


class WatchedFile:
    """A file re-read when its inode, size or mtime changes (checked at most once per ``interval``, on request).

    A new content that does not parse is refused with one log line and the loaded one stays; the service reports
    the digest (SHA-256 hex) of what it loaded and, until a later change loads, the digest of the refused content
    and why it was refused, so whoever pushed it can tell (the joinservice role's check). Subclasses say what the
    file is (``what``, ``event``) and how it parses (``parse`` raises ``ValueError`` with a message naming the file).
    """

    what = "file"
    event = "reload"
    max_bytes = MAX_POLICY_BYTES

    def __init__(self, path: str, log: StructuredLog, clock=time.monotonic, interval: float = POLICY_CHECK_INTERVAL):
        self.path = path
        self._log = log
        self._clock = clock
        self._interval = interval
        self._lock = threading.Lock()
        self.rejected_digest = ""
        self.error = ""
        try:
            signature, text = self._read()
        except FileNotFoundError:
            signature, text = None, None
        except OSError as exc:
            raise ConfigError(f"cannot read {self.what} {path}: {exc.strerror}") from None
        if text is None:
            self._value = self.missing()
        else:
            try:
                self._value = self.parse(text)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        self._text = text
        self.digest = _digest(text)
        self._signature = signature
        self._checked = clock()

    def parse(self, text: bytes):
        raise NotImplementedError

    def missing(self):
        """The value while the file does not exist (by default the service refuses to start without it)."""
        raise ConfigError(f"cannot read {self.what} {self.path}: No such file or directory")

    def loaded(self, previous: bytes | None) -> None:
        """Called after a new content replaced ``previous``."""

    @property
    def value(self):
        return self._value

    def current(self):
        if self._clock() - self._checked < self._interval:
            return self._value
        with self._lock:
            if self._clock() - self._checked >= self._interval:
                self._checked = self._clock()
                self._reload_if_changed()
        return self._value

    def _read(self) -> tuple[tuple[int, int, int], bytes]:
        with open(self.path, "rb") as handle:
            info = os.fstat(handle.fileno())
            return (info.st_ino, info.st_size, info.st_mtime_ns), handle.read(self.max_bytes + 1)

    def _reload_if_changed(self) -> None:
        try:
            info = os.stat(self.path)
        except OSError as exc:
            self._log.warning(self.event, result="kept", reason="unreadable", path=self.path, msg=exc.strerror)
            return
        if (info.st_ino, info.st_size, info.st_mtime_ns) == self._signature:
            return
        try:
            signature, text = self._read()
        except OSError as exc:
            self._log.warning(self.event, result="kept", reason="unreadable", path=self.path, msg=exc.strerror)
            return
        # Remember what was seen, so a bad file is reported once and not re-parsed on every request.
        self._signature = signature
        try:
            value = self.parse(text)
        except ValueError as exc:
            self.rejected_digest, self.error = _digest(text), str(exc)
            self._log.error(
                self.event,
                result="rejected",
                reason="malformed",
                path=self.path,
                digest=self.rejected_digest,
                msg=str(exc),
            )
            return
        previous = self._text
        self._value, self._text, self.digest = value, text, _digest(text)
        self.rejected_digest = self.error = ""
        self.loaded(previous)


def _digest(text: bytes | None) -> str:
    return hashlib.sha256(text).hexdigest() if text is not None else ""


class PolicyWatcher(WatchedFile):
    """The current measurement policy; a new good one replaces it, and the one it replaces is kept as ``<policy_file>.previous``."""

    what = "measurement policy"
    event = "policy-reload"

    def parse(self, text: bytes) -> MeasurementPolicy:
        return parse_policy(text, f"measurement policy {self.path}")

    @property
    def policy(self) -> MeasurementPolicy:
        return self.value

    def loaded(self, previous: bytes | None) -> None:
        backup = self.path + ".previous"
        try:
            write_file_atomically(backup, previous, 0o644)
        except OSError as exc:
            self._log.warning("policy-backup", result="failed", path=backup, msg=exc.strerror)
        policy = self.value
        self._log.info(
            self.event,
            result="loaded",
            path=self.path,
            digest=self.digest,
            backup=backup,
            ak_trust=policy.ak_trust,
            pcrs=sorted(policy.rules),
        )
