# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The boot-time join: what the join_ticket and kubeadm_join modules do, run by systemd at every boot, without Ansible.

Run: python -m ansible_collections.confidential.kubernetes.plugins.module_utils._ticket.boot --config FILE
(the ``confidential-join.service`` unit the join role's ``boot_unit`` entry point installs).

At each boot, from where the node stands (``NodeJoin.state()``): a fresh node joins
(nonce, evidence, ticket, node lock, state disk re-key, kubeadm join); a member whose
PCR 15 the reboot reset rejoins (rejoin ticket, PCR 15 marked again, state disk
key checked or the disk opened) and nothing else; a member is left alone. The
configuration holds nothing secret: a node needs no secret to join. One JSON
line per step on stderr (journald), never a secret. Exit 0 when the node is a
member, 1 when it could not join (the last line says why), 2 when the
configuration is unusable.

The status file also says when the state disk is open: ``joining`` once a fresh node's
ticket opened (and mounted) it, ``member`` once a rebooted node's rejoin did. Until then
``--wait`` waits, the ExecStart of ``confidential-state-disk.service``, which containerd
and the kubelet are ordered after (``After=``, ``Requires=``): they start on the node's
cluster state, never on the empty directories beneath its mount. The join unit itself is
ordered after nothing of theirs, so kubeadm join may restart the kubelet; before it runs,
a fresh node starts containerd (ordered after the disk) for kubeadm's preflight.

A rebooted member that reaches no join service (every control plane rebooted too)
waits for keys: it writes ``{"state": "waiting-for-keys", ...}`` to its status file
(``/run/confidential-kubernetes/boot-status.json``), where ``recover.yml`` finds it,
and tries again every ``wait_interval`` seconds until a join service serves its rejoin
or the recover hand-over has made it a member; only then does it exit, and the units
ordered after it (the kubelet, the join service) start.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable

from .._attestation.issuer import TpmError
from .._disk import StateDiskError
from .._join.log import StructuredLog
from .._kubeadm import KUBEADM_OPTIONS, JoinOptions, Kubeadm, KubeadmError, join_with_token_file
from .._files import write_file_atomically
from .._nodelock import NodeLockError
from . import STATE_DISK_OPTIONS, NoJoinService, TicketError
from .join import FRESH, MEMBER, REBOOTED, JoinSettings, NodeJoin

# Defined beside the recover hand-over, which serves a node in this state.
from .recover import WAITING_FOR_KEYS

try:
    import yaml
except ImportError:  # reported by load_config()
    yaml = None

DEFAULT_CONFIG = "/etc/confidential-kubernetes/join.yml"
DEFAULT_STATUS_FILE = "/run/confidential-kubernetes/boot-status.json"
JOINING = "joining"
# The states in which the kubelet and the join service may start (``--gate``): a member, or a node whose kubeadm join
# (which starts the kubelet itself) is under way. Not before: a rebooted node's cluster state is on its locked disk.
READY_STATES = (MEMBER, JOINING)
# While waiting, one log line per this many seconds (the status file has the rest).
WAIT_LOG_SECONDS = 60.0
# The container runtime kubeadm join's preflight needs, started by the join once the state disk is open.
RUNTIME_UNIT = "containerd.service"
# systemctl's exit status for a unit that does not exist (a node without containerd, such as the lab's).
SYSTEMCTL_NO_SUCH_UNIT = 5
# How often --wait reads the status file.
WAIT_POLL_SECONDS = 1.0
MAX_CONFIG_BYTES = 256 * 1024
EXIT_FAILED = 1
EXIT_CONFIG = 2
_KUBEADM_SETTINGS = dict(KUBEADM_OPTIONS, skip_phases=dict(type="list", default=[]))
_TYPES = {"str": str, "path": str, "int": int, "bool": bool, "list": list, "dict": dict, "float": (int, float)}


class BootConfigError(ValueError):
    """The boot-time join's configuration is unusable; the message names the file and the setting."""


class BootConfig:
    """The configuration file: join settings, kubeadm options, and the node's API server address for control planes."""

    def __init__(
        self,
        settings: JoinSettings,
        kubeadm: dict,
        advertise_address: str | None,
        bind_port: int,
        status_file: str = DEFAULT_STATUS_FILE,
        wait_interval: float = 5.0,
    ):
        self.settings = settings
        self.kubeadm = kubeadm
        self.advertise_address = advertise_address
        self.bind_port = bind_port
        self.status_file = status_file
        self.wait_interval = wait_interval

    def join_options(self, record: dict) -> JoinOptions:
        return JoinOptions(
            api_server_endpoint=record["api_server_endpoint"],
            ca_cert_hashes=record["ca_cert_hashes"],
            node_name=record.get("node_name") or self.settings.node_name,
            control_plane=self.settings.control_plane,
            advertise_address=self.advertise_address,
            bind_port=self.bind_port,
            cri_socket=self.kubeadm["cri_socket"],
            kubelet_extra_args=self.kubeadm["kubelet_extra_args"],
            skip_phases=self.kubeadm["skip_phases"],
        )


def _check(source: str, name: str, value: object, kind: object) -> None:
    if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
        raise BootConfigError(f"{source}: setting {name} has the unusable value {value!r}")


def _options(source: str, prefix: str, document: object, spec: dict) -> dict:
    """Check a mapping against an Ansible-style argument spec (type, required, default, choices); unknown keys are errors."""
    if not isinstance(document, dict):
        raise BootConfigError(f"{source}: {prefix or 'the file'} must be a mapping of settings")
    unknown = sorted(str(k) for k in document if k not in spec)
    if unknown:
        raise BootConfigError(f"{source} has unknown setting(s): {', '.join(prefix + k for k in unknown)}")
    values = {}
    for name, option in spec.items():
        value = document.get(name)
        value = option.get("default") if value is None else value
        if value is None:
            if option.get("required"):
                raise BootConfigError(f"{source} lacks the required setting {prefix}{name}")
            values[name] = None
            continue
        _check(source, prefix + name, value, _TYPES[option.get("type", "str")])
        if option.get("choices") and value not in option["choices"]:
            raise BootConfigError(
                f"{source}: setting {prefix}{name} must be one of {', '.join(option['choices'])}, got {value!r}"
            )
        values[name] = value
    return values


def parse_config(document: object, source: str) -> BootConfig:
    # JoinSettings' annotations are strings (postponed evaluation): the type names of an argument spec.
    spec = {name: dict(type=kind) for name, kind in JoinSettings.__annotations__.items() if name != "cluster_ca"}
    # No node name: the join service's registry grants it (the enrolled name, or the pool name derived from the EK).
    spec.update(
        endpoints=dict(type="list", required=True),
        node_name=dict(type="str", default=""),
        cluster_ca_file=dict(type="path", required=True),
        state_disk=dict(type="dict", required=True),
        advertise_address=dict(type="str"),
        bind_port=dict(type="int", default=6443),
        kubeadm=dict(type="dict", default={}),
        status_file=dict(type="path", default=DEFAULT_STATUS_FILE),
        wait_interval=dict(type="float", default=5.0),
        event_log=dict(type="str", default="auto", choices=["auto", "none"]),
    )
    values = _options(source, "", document, spec)
    values["state_disk"] = _options(source, "state_disk.", values["state_disk"], STATE_DISK_OPTIONS)
    kubeadm = _options(source, "kubeadm.", values.pop("kubeadm"), _KUBEADM_SETTINGS)
    if not values["endpoints"] or not all(isinstance(endpoint, str) and endpoint for endpoint in values["endpoints"]):
        raise BootConfigError(f"{source}: endpoints must list the join services (host:port)")
    if values["control_plane"] and not values["advertise_address"]:
        raise BootConfigError(
            f"{source}: a control plane needs advertise_address (the address its API server advertises)"
        )
    try:
        with open(values.pop("cluster_ca_file"), encoding="ascii") as handle:
            values["cluster_ca"] = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise BootConfigError(f"{source}: cannot read cluster_ca_file: {exc}") from None
    if "-----BEGIN CERTIFICATE-----" not in values["cluster_ca"]:
        raise BootConfigError(f"{source}: cluster_ca_file does not hold a PEM certificate")
    if values["wait_interval"] <= 0:
        raise BootConfigError(f"{source}: wait_interval must be a positive number of seconds")
    advertise_address, bind_port = values.pop("advertise_address"), values.pop("bind_port")
    status_file, wait_interval = values.pop("status_file"), float(values.pop("wait_interval"))
    return BootConfig(JoinSettings.of(values), kubeadm, advertise_address, bind_port, status_file, wait_interval)


def load_config(path: str) -> BootConfig:
    if yaml is None:
        raise BootConfigError("PyYAML is required on the node")
    try:
        info = os.stat(path)
        with open(path, "rb") as handle:
            text = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise BootConfigError(f"cannot read the join configuration {path}: {exc.strerror}") from None
    if info.st_mode & 0o077:
        raise BootConfigError(
            f"the join configuration {path} is mode {info.st_mode & 0o777:04o}: it must not be accessible to "
            "group or others (0600), because whoever can change it chooses the cluster this node joins"
        )
    if len(text) > MAX_CONFIG_BYTES:
        raise BootConfigError(f"the join configuration {path} is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise BootConfigError(
            f"the join configuration {path} is neither JSON nor YAML: {str(exc).splitlines()[0]}"
        ) from None
    return parse_config(document, f"join configuration {path}")


def write_status(path: str, state: str, **fields: object) -> None:
    """Where the boot-time join stands, for recover.yml (nothing secret; 0644 under the 0700 runtime directory)."""
    document = dict(fields, state=state, time=_now())
    os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
    write_file_atomically(path, (json.dumps(document, sort_keys=True) + "\n").encode(), 0o644)


def _rejoin_or_wait(config: BootConfig, log: StructuredLog, joining: NodeJoin, fields: dict, sleep) -> dict | None:
    """Rejoin; while no join service answers, wait for keys (status file), trying again each wait_interval.

    Returns the rejoin's result, or None when the node became a member meanwhile (recover.yml's hand-over)."""
    since, logged, started = None, 0.0, time.monotonic()
    while True:
        try:
            # One try over every endpoint per round: a node that waits must notice a recover hand-over soon.
            return joining.rejoin(attempts=1)
        except NoJoinService as exc:
            now = time.monotonic()
            if since is None:
                since = _now()
            # The whole wait, every round of it (the exception gives the last round's time only).
            waited = round(now - started, 1)
            write_status(
                config.status_file,
                WAITING_FOR_KEYS,
                since=since,
                waited_seconds=waited,
                reason=str(exc),
                control_plane=config.settings.control_plane,
            )
            if now - logged >= WAIT_LOG_SECONDS:
                log.warning(
                    "wait",
                    result=WAITING_FOR_KEYS,
                    waited_seconds=waited,
                    msg=f"no join service answers after {waited:g} s of waiting (since {since}); waiting for a "
                    f"control plane or recover.yml: {exc}",
                    **fields,
                )
                logged = now
        sleep(config.wait_interval)
        if joining.state() == MEMBER:
            return None


def start_unit(name: str) -> None:
    """Start a systemd unit and wait until it runs; a unit the node does not have is left alone."""
    completed = subprocess.run(["systemctl", "start", "--", name], capture_output=True, check=False, timeout=900)
    if completed.returncode not in (0, SYSTEMCTL_NO_SUCH_UNIT):
        raise OSError(
            f"systemctl start {name} failed (exit {completed.returncode}): "
            f"{completed.stderr.decode(errors='replace').strip()}"
        )


def run(
    config: BootConfig,
    log: StructuredLog,
    joining: NodeJoin | None = None,
    kubeadm: Kubeadm | None = None,
    sleep=time.sleep,
    start: Callable[[str], None] = start_unit,
) -> str:
    """Take the node to member; returns the state it started in. Raises the failure of the step that failed."""
    joining = joining or NodeJoin(config.settings)
    started = time.monotonic()
    state = joining.state()
    fields = dict(node_name=joining.node_name(), control_plane=config.settings.control_plane)
    log.info("state", state=state, **fields)
    if state == MEMBER:
        log.info(
            "done",
            result="member",
            msg="the node is a member and PCR 15 carries the cluster's mark: nothing to do",
            **fields,
        )
        write_status(config.status_file, MEMBER)
        return state
    if state == REBOOTED:
        result = _rejoin_or_wait(config, log, joining, fields, sleep)
        if result is None:
            log.info(
                "done",
                result="recovered",
                msg="the recover hand-over made the node a member again while it waited for keys",
                duration_ms=_elapsed_ms(started),
                **fields,
            )
        else:
            _log_warnings(log, joining, fields)
            lock = joining.lock.state()
            log.info(
                "rejoin",
                result="rejoined",
                cluster_id=result["cluster_id"],
                pcr15_state=lock.pcr15_state,
                state_disk=_disk_fields(result["state_disk"]),
                duration_ms=_elapsed_ms(started),
                **fields,
            )
        write_status(config.status_file, MEMBER)
        return state
    if state == FRESH:
        result = joining.join()
        fields["node_name"] = result["node_name"]
        _log_warnings(log, joining, fields)
        log.info(
            "ticket",
            result="applied",
            cluster_id=result["cluster_id"],
            api_server_endpoint=result["api_server_endpoint"],
            state_disk=_disk_fields(result["state_disk"]),
            duration_ms=_elapsed_ms(started),
            **fields,
        )
    # The state disk is open (and mounted): containerd and the kubelet, ordered after it, may start now, and kubeadm
    # join (which restarts the kubelet) may run. Its preflight needs the container runtime running.
    write_status(config.status_file, JOINING)
    start(RUNTIME_UNIT)
    record = joining.record()
    kubeadm = kubeadm or Kubeadm(config.kubeadm["binary_path"], joining.root)
    joined = join_with_token_file(
        kubeadm,
        config.join_options(record),
        config.settings.token_file,
        config.kubeadm["ignore_preflight_errors"],
        config.kubeadm["config_api_version"],
    )
    log.info(
        "kubeadm-join",
        result="joined" if joined["changed"] else "already-joined",
        api_server_endpoint=record["api_server_endpoint"],
        config_api_version=joined.get("config_api_version"),
        duration_ms=_elapsed_ms(started),
        **fields,
    )
    write_status(config.status_file, MEMBER)
    return state


def _log_warnings(log: StructuredLog, joining: NodeJoin, fields: dict) -> None:
    """What the node's evidence went without (an event log it could not use), once each."""
    for warning in joining.warnings:
        log.warning("evidence", result="event-log-left-out", msg=warning, **fields)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _disk_fields(disk: dict) -> dict:
    return {k: disk.get(k) for k in ("uuid", "keyed", "changed", "mapped", "mapping_available", "mount_path")}


def _elapsed_ms(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 1)


def _status(status_file: str) -> str | None:
    try:
        with open(status_file, encoding="utf-8") as handle:
            return json.load(handle).get("state")
    except (OSError, ValueError, AttributeError):
        return None


def wait(status_file: str, sleep=time.sleep, stream=None) -> int:
    """The ExecStart of confidential-state-disk.service: returns 0 once the boot-time join has opened the state disk
    (the node is a member, or its kubeadm join is under way); until then waits, saying once why."""
    said = False
    while (state := _status(status_file)) not in READY_STATES:
        if not said:
            (stream or sys.stderr).write(
                "confidential-join: waiting for the boot-time join to open the state disk "
                f"({state or 'no status yet'}; journalctl -u confidential-join.service)\n"
            )
            said = True
        sleep(WAIT_POLL_SECONDS)
    return 0


def gate(status_file: str, stream=None) -> int:
    """Exit status for a unit's ExecStartPre: 0 once the boot-time join made the node a member (or runs kubeadm
    join)."""
    state = _status(status_file)
    if state in READY_STATES:
        return 0
    (stream or sys.stderr).write(
        "confidential-join: not starting yet: the boot-time join has not made this node a "
        f"member ({state or 'no status yet'}; journalctl -u confidential-join.service)\n"
    )
    return EXIT_FAILED


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="confidential-join", description="confidential.kubernetes: join or rejoin the cluster at boot"
    )
    parser.add_argument(
        "--config",
        default=DEFAULT_CONFIG,
        help=f"the join configuration (YAML or JSON, 0600; default {DEFAULT_CONFIG})",
    )
    parser.add_argument(
        "--gate",
        metavar="STATUS_FILE",
        help="only check the status file: exit 0 when the node is a member "
        "(the ExecStartPre of the kubelet and the join service)",
    )
    parser.add_argument(
        "--wait",
        metavar="STATUS_FILE",
        help="only wait until the status file says the state disk is open "
        "(the ExecStart of confidential-state-disk.service, which containerd and the kubelet are ordered after)",
    )
    args = parser.parse_args(argv)
    if args.gate:
        return gate(args.gate)
    if args.wait:
        return wait(args.wait)
    log = StructuredLog()
    try:
        config = load_config(args.config)
    except BootConfigError as exc:
        log.error("config", result="failed", msg=str(exc))
        return EXIT_CONFIG
    try:
        run(config, log)
    except (TicketError, NodeLockError, TpmError, StateDiskError, KubeadmError, OSError) as exc:
        log.error("join", result="failed", node_name=config.settings.node_name, error=type(exc).__name__, msg=str(exc))
        return EXIT_FAILED
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
