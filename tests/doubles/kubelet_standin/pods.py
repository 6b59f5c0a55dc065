"""Static pods as processes: one process per container, a state file per pod, adoption after a restart.

STATE_DIR/pods/<namespace>_<name>.json records the pod's id, its manifest hash and each container's
pid and start time, so a restarted stand-in (kubelet.service has KillMode=process) adopts processes
that still run, and bin/crictl can list, stop and remove pods.
"""
from __future__ import annotations

import hashlib
import json
import os
import secrets
import signal
import subprocess
import time
from pathlib import Path

import yaml

from . import LOG_DIR, STATE_DIR, StandinError
from .images import resolve

CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BACKOFF_FIRST, BACKOFF_MAX, BACKOFF_RESET = 10.0, 300.0, 600.0


class ManifestError(StandinError):
    """A static pod manifest the stand-in cannot run."""


def pods_dir() -> Path:
    return STATE_DIR / "pods"


def read_states() -> dict[str, dict]:
    """Every recorded pod, by key."""
    found = {}
    for path in sorted(pods_dir().glob("*.json")):
        try:
            found[path.stem] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    return found


def write_state(key: str, state: dict) -> None:
    pods_dir().mkdir(parents=True, exist_ok=True)
    temporary = pods_dir() / f".{key}.tmp"
    temporary.write_text(json.dumps(state, indent=1))
    temporary.replace(pods_dir() / f"{key}.json")


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks (tells a pid from a reused one), or None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in "ZX" else fields[19]


def running(container: dict) -> bool:
    return bool(container.get("pid")) and start_time(container["pid"]) == container.get("start")


def stop_container(container: dict, grace: float) -> None:
    """SIGTERM to the container's process group, SIGKILL after the grace period."""
    if not running(container):
        return
    for signo, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(container["pid"], signo)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while running(container) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not running(container):
            return


def parse_manifest(path: Path, node_name: str) -> tuple[str, dict]:
    """(key, pod spec) of a manifest: the containers' argv (image resolved to its binary) and env."""
    text = path.read_text()
    try:
        pod = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ManifestError(f"{path}: not YAML: {exc}") from None
    if not isinstance(pod, dict) or pod.get("kind") != "Pod" or pod.get("apiVersion") != "v1":
        raise ManifestError(f"{path}: not a v1 Pod")
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    if not meta.get("name") or not spec.get("containers"):
        raise ManifestError(f"{path}: a pod needs metadata.name and spec.containers")
    namespace = meta.get("namespace") or "default"
    containers = []
    for container in spec["containers"]:
        image = resolve(str(container.get("image", "")))
        command = [str(part) for part in container.get("command") or [image.component]]
        if os.path.basename(command[0]) != image.component:
            raise ManifestError(f"{path}: container {container.get('name')} runs {command[0]!r}, "
                                f"but its image {image.reference} holds {image.component}")
        env = {"PATH": CONTAINER_PATH, "HOSTNAME": node_name}
        for variable in container.get("env") or []:
            if "value" not in variable:
                raise ManifestError(f"{path}: env {variable.get('name')}: only literal values are supported")
            env[variable["name"]] = str(variable["value"])
        containers.append({"name": container["name"], "image": image.reference, "env": env,
                           "argv": [str(image.binary), *command[1:], *map(str, container.get("args") or [])],
                           "workdir": container.get("workingDir") or "/"})
    return f"{namespace}_{meta['name']}", {
        "name": f"{meta['name']}-{node_name}", "namespace": namespace, "file": str(path),
        "hash": hashlib.sha256(text.encode()).hexdigest(), "containers": containers,
        "grace": float(spec.get("terminationGracePeriodSeconds", 30))}


class StaticPods:
    """Keeps the processes in line with the manifests of one directory (call sync() periodically)."""

    def __init__(self, manifest_dir: Path, node_name: str, log) -> None:
        self.manifest_dir, self.node_name, self.log = manifest_dir, node_name, log
        self.children: dict[int, subprocess.Popen] = {}
        self.broken: dict[str, str] = {}
        for key, state in read_states().items():
            alive = [c["name"] for c in state.get("containers", []) if running(c)]
            if alive:
                log(f"adopting pod {key}: containers {', '.join(alive)} still run")

    def wanted(self) -> dict[str, dict]:
        found = {}
        for path in sorted(self.manifest_dir.glob("*")) if self.manifest_dir.is_dir() else []:
            if path.name.startswith(".") or not path.is_file():
                continue
            try:
                key, pod = parse_manifest(path, self.node_name)
            except (StandinError, OSError) as exc:
                if self.broken.get(str(path)) != str(exc):
                    self.log(f"cannot run static pod {path}: {exc}")
                self.broken[str(path)] = str(exc)
                continue
            self.broken.pop(str(path), None)
            found[key] = pod
        return found

    def sync(self) -> None:
        for pid, child in list(self.children.items()):
            if child.poll() is not None:
                del self.children[pid]
        wanted, states = self.wanted(), read_states()
        for key, state in list(states.items()):
            if key not in wanted or wanted[key]["hash"] != state["hash"]:
                why = "its manifest is gone or cannot be run" if key not in wanted else "its manifest changed"
                self.log(f"stopping pod {key}: {why}")
                for container in state["containers"]:
                    stop_container(container, state.get("grace", 30.0))
                (pods_dir() / f"{key}.json").unlink(missing_ok=True)
                states.pop(key)
        for key, pod in wanted.items():
            state = states.get(key) or {**pod, "id": secrets.token_hex(32), "created": time.time(),
                                        "containers": [{"name": c["name"], "restarts": 0} for c in pod["containers"]]}
            changed = [self._keep_running(key, spec, container)
                       for spec, container in zip(pod["containers"], state["containers"])]
            if any(changed) or key not in states:
                write_state(key, state)

    def _keep_running(self, key: str, spec: dict, container: dict) -> bool:
        """Start or restart one container when due; True when its state changed."""
        now = time.time()
        if running(container):
            return False
        if container.get("pid"):
            ran = now - container.get("started_at", now)
            container["restarts"] += 1
            failures = 0 if ran > BACKOFF_RESET else container.get("failures", 0) + 1
            container.update(pid=None, failures=failures,
                             next_start=now + min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** (failures - 1)) if failures else now)
            self.log(f"pod {key} container {spec['name']} exited after {ran:.0f} s; "
                     f"restart {container['restarts']} in {container['next_start'] - now:.0f} s")
            return True
        if now < container.get("next_start", 0):
            return False
        log_path = LOG_DIR / key / f"{spec['name']}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as output:
            child = subprocess.Popen(spec["argv"], env=spec["env"], cwd=spec["workdir"], stdin=subprocess.DEVNULL,
                                     stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
        self.children[child.pid] = child
        container.update(pid=child.pid, start=start_time(child.pid), started_at=now)
        self.log(f"pod {key} container {spec['name']} started: pid {child.pid}, log {log_path}")
        return True
