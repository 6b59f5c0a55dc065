# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The join service's configuration file, its root secrets, and the measurement policy it re-reads on change."""

from __future__ import annotations

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
from .._attestation.policy import MAX_POLICY_BYTES, MeasurementPolicy, PolicyError, parse_policy
from .._files import write_file_atomically
from .._kubeadm import ADMIN_CONF
from .log import StructuredLog

DEFAULT_LISTEN = "0.0.0.0:9290"
DEFAULT_VERIFIER_ID = "confidential.kubernetes/joinservice"
DEFAULT_PKI_DIR = "/etc/kubernetes/pki"
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
    kubectl_binary: str = "kubectl"
    verifier_id: str = DEFAULT_VERIFIER_ID
    nonce_ttl: float = 60.0
    policy_check_interval: float = POLICY_CHECK_INTERVAL
    grace_period: float = 30.0
    max_registrations: int = 16

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
            if name in ("nonce_ttl", "grace_period", "policy_check_interval"):
                ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
            elif name == "max_registrations":
                ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
            elif name == "ek_ca_file":
                ok = value is None or isinstance(value, str)
                value = value or None
            elif name == "kubernetes_version":
                ok = isinstance(value, str)
            else:
                ok = isinstance(value, str) and value != ""
            if not ok:
                raise ConfigError(f"{source}: setting {name} has the unusable value {value!r}")
            values[name] = value
        config = cls(**values)
        if not _ENDPOINT.fullmatch(config.api_server_endpoint) or not 0 < int(config.api_server_endpoint.rsplit(":", 1)[1]) < 65536:
            raise ConfigError(f"{source}: api_server_endpoint {config.api_server_endpoint!r} must be host:port")
        if not _ENDPOINT.fullmatch(config.listen):
            raise ConfigError(f"{source}: listen {config.listen!r} must be address:port")
        return config


def load_config(path: str) -> ServiceConfig:
    try:
        with open(path, "rb") as handle:
            text = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read join service configuration {path}: {exc.strerror}") from None
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(f"join service configuration {path} is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"join service configuration {path} is neither JSON nor YAML: {str(exc).splitlines()[0]}") from None
    return ServiceConfig.from_document(doc, f"join service configuration {path}")


def read_private_file(path: str, what: str, limit: int = MAX_CONFIG_BYTES) -> bytes:
    """Read a file that must not be accessible to group or others (refuse it otherwise)."""
    try:
        with open(path, "rb") as handle:
            mode = stat.S_IMODE(os.fstat(handle.fileno()).st_mode)
            if mode & 0o077:
                raise ConfigError(f"{what} {path} has mode {mode:04o}; it must not be accessible to group or others (chmod 600)")
            data = handle.read(limit + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror}") from None
    if len(data) > limit:
        raise ConfigError(f"{what} {path} is larger than {limit} bytes")
    return data


def load_root_secrets(path: str) -> RootSecrets:
    data = read_private_file(path, "cluster secrets file")
    try:
        return RootSecrets.from_document(json.loads(data), f"cluster secrets file {path}")
    except ValueError as exc:  # RootSecretsError is a ValueError, and so is bad JSON
        message = str(exc) if isinstance(exc, RootSecretsError) else f"cluster secrets file {path} is not JSON"
        raise ConfigError(message) from None


class PolicyWatcher:
    """The current measurement policy, re-read when the file's inode, size or mtime changes (checked at most once a second).

    A new file that does not parse is refused with a log line and the loaded
    policy stays; a new good one replaces it, and the one it replaces is kept
    as ``<policy_file>.previous``.
    """

    def __init__(self, path: str, log: StructuredLog, clock=time.monotonic, interval: float = POLICY_CHECK_INTERVAL):
        self.path = path
        self._log = log
        self._clock = clock
        self._interval = interval
        self._lock = threading.Lock()
        try:
            signature, text = self._read()
        except OSError as exc:
            raise ConfigError(f"cannot read measurement policy {path}: {exc.strerror}") from None
        try:
            self._policy = parse_policy(text, f"measurement policy {path}")
        except PolicyError as exc:
            raise ConfigError(str(exc)) from None
        self._text = text
        self._signature = signature
        self._checked = clock()

    @property
    def policy(self) -> MeasurementPolicy:
        return self._policy

    def current(self) -> MeasurementPolicy:
        if self._clock() - self._checked < self._interval:
            return self._policy
        with self._lock:
            if self._clock() - self._checked >= self._interval:
                self._checked = self._clock()
                self._reload_if_changed()
        return self._policy

    def _read(self) -> tuple[tuple[int, int, int], bytes]:
        with open(self.path, "rb") as handle:
            info = os.fstat(handle.fileno())
            return (info.st_ino, info.st_size, info.st_mtime_ns), handle.read(MAX_POLICY_BYTES + 1)

    def _reload_if_changed(self) -> None:
        try:
            info = os.stat(self.path)
        except OSError as exc:
            self._log.warning("policy-reload", result="kept", reason="unreadable", path=self.path, msg=exc.strerror)
            return
        if (info.st_ino, info.st_size, info.st_mtime_ns) == self._signature:
            return
        try:
            signature, text = self._read()
        except OSError as exc:
            self._log.warning("policy-reload", result="kept", reason="unreadable", path=self.path, msg=exc.strerror)
            return
        # Remember what was seen, so a bad file is reported once and not re-parsed on every request.
        self._signature = signature
        try:
            policy = parse_policy(text, f"measurement policy {self.path}")
        except PolicyError as exc:
            self._log.error("policy-reload", result="rejected", reason="malformed", path=self.path, msg=str(exc))
            return
        backup = self.path + ".previous"
        try:
            write_file_atomically(backup, self._text, 0o644)
        except OSError as exc:
            self._log.warning("policy-backup", result="failed", path=backup, msg=exc.strerror)
        self._policy, self._text = policy, text
        self._log.info("policy-reload", result="loaded", path=self.path, backup=backup, ak_trust=policy.ak_trust,
                       pcrs=sorted(policy.rules))
