# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The join service on its control plane, set up in one call (the ``join_service`` module).

In this order: the node must keep the cluster secrets (0600), or nothing is changed; the configuration directory (0700);
the service's TLS certificate; its files, each written atomically and only where it differs (the policy and the
enrolment with a backup of the previous one); then systemd: a changed unit is reloaded, the service enabled and
started, and restarted when something it reads only at start changed (its certificate, EK CA, configuration, unit, or
its code - ``restart``). The policy and the enrolment are not among those: the service re-reads them on change. Last,
wait until the service serves with the pushed policy and enrolment loaded; a file it refuses is put back from its
backup, so that a restart finds a file it can load, and the failure carries the service's own load error.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import subprocess
from dataclasses import dataclass
from typing import Callable

from .._files import write_file_atomically
from . import servercert
from .health import LoadRefused, NotServing, wait_until_loaded

POLICY = "policy"
ENROLMENT = "enrolment"
# What systemd reports for a unit that runs or is about to.
RUNNING = ("active", "activating", "reloading")


class JoinServiceError(RuntimeError):
    """The join service cannot be set up or does not serve as expected; ``result`` is what was done before."""

    def __init__(self, message: str, result: dict | None = None):
        super().__init__(message)
        self.result = result or {}


@dataclass(frozen=True)
class ServiceFile:
    """One file of the service: ``what`` names it (``policy`` and ``enrolment`` are the ones the service reports)."""

    what: str
    path: str
    content: bytes
    mode: int
    backup: bool = False
    # The service re-reads it when it changes; a change to any other file restarts the service.
    watched: bool = False


@dataclass
class Deployment:
    config_dir: str
    unit_path: str
    files: list[ServiceFile]
    # The names (IP addresses or DNS names) of the service's TLS certificate; empty leaves the certificate alone.
    tls_names: list[str]
    pki_dir: str
    endpoint: str
    health_timeout: float
    restart: bool = False
    only_if_installed: bool = False
    secrets_name: str = "cluster-secrets.json"
    tls_cert_name: str = "joinservice.crt"
    tls_key_name: str = "joinservice.key"
    # Re-issue the TLS certificate when less than this is left of it.
    tls_renew_before: datetime.timedelta = servercert.RENEW_BEFORE

    def path(self, name: str) -> str:
        return os.path.join(self.config_dir, name)


class Systemd:
    """systemctl for one unit, the one place it runs; tests replace ``_run_command``."""

    def __init__(self, unit: str):
        self.unit = unit

    def _run_command(self, argv: list[str]) -> tuple[int, str, str]:
        try:
            completed = subprocess.run(argv, capture_output=True, check=False, timeout=300)
        except FileNotFoundError:
            raise JoinServiceError("systemctl is not installed on this node") from None
        except subprocess.TimeoutExpired:
            raise JoinServiceError(f"{' '.join(argv)} did not finish within 5 minutes") from None
        return (
            completed.returncode,
            completed.stdout.decode(errors="replace"),
            completed.stderr.decode(errors="replace"),
        )

    def systemctl(self, *args: str) -> str:
        rc, out, err = self._run_command(["systemctl", *args])
        if rc != 0:
            raise JoinServiceError(f"systemctl {' '.join(args)} failed (exit {rc}): {(err or out).strip()}")
        return out

    def state(self) -> dict[str, str]:
        """ActiveState, UnitFileState and NeedDaemonReload of the unit, in one call."""
        out = self.systemctl("show", "--property=ActiveState,UnitFileState,NeedDaemonReload", self.unit)
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def _text(data: bytes | None) -> str:
    return "" if data is None else data.decode("utf-8", errors="replace")


def _check_secrets(deployment: Deployment) -> None:
    path = deployment.path(deployment.secrets_name)
    try:
        mode = os.stat(path).st_mode & 0o777
    except FileNotFoundError:
        mode = None
    if mode != 0o600:
        raise JoinServiceError(
            f"{path} is missing or not 0600: this node is not an initialised or joined control plane "
            "(run init.yml or join.yml first); nothing was changed"
        )


def _ensure_directory(path: str, check_mode: bool) -> bool:
    try:
        if os.stat(path).st_mode & 0o777 == 0o700:
            return False
        if not check_mode:
            os.chmod(path, 0o700)
    except FileNotFoundError:
        if not check_mode:
            os.makedirs(path, mode=0o700)
            os.chmod(path, 0o700)
    return True


def write_file(
    service_file: ServiceFile, check_mode: bool, backup: Callable[[str], str]
) -> tuple[bool, str | None, bytes | None]:
    """Write the file atomically unless it holds the content with the mode already; returns (changed, backup, before)."""
    before = _read(service_file.path)
    same_content = (
        before is not None and hashlib.sha256(before).digest() == hashlib.sha256(service_file.content).digest()
    )
    if same_content and os.stat(service_file.path).st_mode & 0o777 == service_file.mode:
        return False, None, before
    backup_file = None
    if not check_mode:
        if same_content:
            os.chmod(service_file.path, service_file.mode)
        else:
            if service_file.backup and before is not None:
                backup_file = backup(service_file.path)
            write_file_atomically(service_file.path, service_file.content, service_file.mode)
    return True, backup_file, before


def _service_actions(state: dict[str, str], unit_changed: bool, restart: bool) -> list[str]:
    """The systemctl verbs that take the unit to enabled and running with what was just written."""
    reload = unit_changed or state.get("NeedDaemonReload") == "yes"
    actions = ["daemon-reload"] if reload else []
    if state.get("UnitFileState") != "enabled":
        actions.append("enable")
    if state.get("ActiveState") not in RUNNING:
        actions.append("start")
    elif restart or reload:
        actions.append("restart")
    return actions


def _restore(service_file: ServiceFile, backup_file: str) -> None:
    with open(backup_file, "rb") as handle:
        write_file_atomically(service_file.path, handle.read(), service_file.mode)


def apply(
    deployment: Deployment, systemd: Systemd, check_mode: bool, backup: Callable[[str], str], diff: bool = False
) -> dict:
    """Take the join service to what ``deployment`` says; returns the module result. Raises JoinServiceError."""
    result: dict = {
        "changed": False,
        "installed": True,
        "files": {},
        "tls_certificate_changed": False,
        "service_actions": [],
    }
    if deployment.only_if_installed and not os.path.exists(deployment.unit_path):
        result["installed"] = False
        return result
    _check_secrets(deployment)
    changed = _ensure_directory(deployment.config_dir, check_mode)
    if deployment.tls_names:
        try:
            result["tls_certificate_changed"] = servercert.issue(
                deployment.pki_dir,
                deployment.path(deployment.tls_cert_name),
                deployment.path(deployment.tls_key_name),
                deployment.tls_names,
                check_mode,
                deployment.tls_renew_before,
            )
        except (OSError, ValueError) as exc:
            raise JoinServiceError(f"cannot issue the join service certificate: {exc}", result) from None
    restart = deployment.restart or result["tls_certificate_changed"]
    backups = {}
    for service_file in deployment.files:
        file_changed, backup_file, before = write_file(service_file, check_mode, backup)
        result["files"][service_file.what] = {
            "path": service_file.path,
            "changed": file_changed,
            "backup_file": backup_file,
        }
        if backup_file:
            backups[service_file.what] = backup_file
        if file_changed:
            restart = restart or not service_file.watched
            if diff:
                result.setdefault("diff", []).append(
                    {
                        "before_header": service_file.path,
                        "after_header": service_file.path,
                        "before": _text(before),
                        "after": _text(service_file.content),
                    }
                )
    actions = _service_actions(systemd.state(), result["files"].get("unit", {}).get("changed", False), restart)
    result["service_actions"] = actions
    result["changed"] = (
        changed
        or result["tls_certificate_changed"]
        or bool(actions)
        or any(entry["changed"] for entry in result["files"].values())
    )
    if check_mode:
        return result
    for action in actions:
        systemd.systemctl(action, *([] if action == "daemon-reload" else [systemd.unit]))
    _wait_until_loaded(
        deployment, backups, result, systemd if actions and actions[-1] in ("start", "restart") else None
    )
    return result


def _wait_until_loaded(
    deployment: Deployment, backups: dict[str, str], result: dict, started: Systemd | None = None
) -> None:
    """Wait until the service serves what was pushed. A file it refuses is put back from its backup; when the service
    was (re)started and does not come up, the policy and enrolment pushed with the restart are put back, the service is
    restarted once more on the last good ones, and the task fails saying so."""
    # The service reports the digests of the files it re-reads (``policy`` and ``enrolment``, see health.loaded).
    watched = {f.what: f for f in deployment.files if f.watched}
    expected = {what: hashlib.sha256(f.content).hexdigest() for what, f in watched.items()}
    try:
        with open(os.path.join(deployment.pki_dir, "ca.crt"), "rb") as handle:
            ca_pem = handle.read()
        wait_until_loaded(deployment.endpoint, ca_pem, expected, deployment.health_timeout)
    except OSError as exc:
        raise JoinServiceError(f"cannot read the cluster CA to reach the join service: {exc}", result) from None
    except NotServing as exc:
        pushed = [what for what in watched if what in backups]
        if started is None or not pushed:
            raise JoinServiceError(str(exc), result) from None
        for what in pushed:
            _restore(watched[what], backups[what])
            with open(backups[what], "rb") as handle:
                expected[what] = hashlib.sha256(handle.read()).hexdigest()
        started.systemctl("restart", started.unit)
        put_back = ", ".join(f"{watched[what].path} from {backups[what]}" for what in pushed)
        try:
            wait_until_loaded(deployment.endpoint, ca_pem, expected, deployment.health_timeout)
        except (NotServing, LoadRefused) as again:
            raise JoinServiceError(
                f"join service {deployment.endpoint} did not start with the files pushed with its restart ({exc}); "
                f"put back {put_back}, and it does not serve with those either: {again}",
                result,
            ) from None
        raise JoinServiceError(
            f"join service {deployment.endpoint} did not start with the files pushed with its restart ({exc}); "
            f"put back {put_back}: it serves again with the last good ones",
            result,
        ) from None
    except LoadRefused as exc:
        message = f"join service {deployment.endpoint}: {exc}"
        if exc.what in backups:
            _restore(watched[exc.what], backups[exc.what])
            message += f" ({watched[exc.what].path} was put back from {backups[exc.what]})"
        raise JoinServiceError(message, result) from None
