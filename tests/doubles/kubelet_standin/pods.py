"""Static pods as processes, one per container; STATE_DIR/pods/<ns>_<name>.json: pod id, manifest hash, pids, starts."""

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

from . import LOG_DIR, STATE_DIR, StandinError, resolve_image, write_private

CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BACKOFF_FIRST, BACKOFF_MAX, BACKOFF_RESET = 10.0, 300.0, 600.0
PODS = STATE_DIR / "pods"


def read_states() -> dict[str, dict]:
    """Every recorded pod, by key."""
    found = {}
    for path in sorted(PODS.glob("*.json")):
        try:
            found[path.stem] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    return found


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
    for signo, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        if not running(container):
            return
        try:
            os.killpg(container["pid"], signo)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while running(container) and time.monotonic() < deadline:
            time.sleep(0.1)


def parse_manifest(path: Path, node_name: str) -> tuple[str, dict]:
    """(key, pod) of a manifest: each container's argv (its image resolved to a local binary) and env."""
    text = path.read_text()
    try:
        pod = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise StandinError(f"not YAML: {exc}") from None
    if not isinstance(pod, dict) or (pod.get("apiVersion"), pod.get("kind")) != ("v1", "Pod"):
        raise StandinError("not a v1 Pod")
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    if not meta.get("name") or not spec.get("containers"):
        raise StandinError("a pod needs metadata.name and spec.containers")
    containers = []
    for container in spec["containers"]:
        component, binary, _version = resolve_image(str(container.get("image", "")))
        command = [str(part) for part in container.get("command") or [component]]
        if os.path.basename(command[0]) != component:
            raise StandinError(f"container {container.get('name')} runs {command[0]!r}, its image holds {component}")
        env = {"PATH": CONTAINER_PATH, "HOSTNAME": node_name}
        for variable in container.get("env") or []:
            if "value" not in variable:
                raise StandinError(f"env {variable.get('name')}: only literal values are supported")
            env[variable["name"]] = str(variable["value"])
        containers.append(
            {
                "name": container["name"],
                "env": env,
                "workdir": container.get("workingDir") or "/",
                "argv": [str(binary), *command[1:], *map(str, container.get("args") or [])],
            }
        )
    namespace = meta.get("namespace") or "default"
    return f"{namespace}_{meta['name']}", {
        "name": f"{meta['name']}-{node_name}",
        "namespace": namespace,
        "containers": containers,
        "manifest": pod,
        "hash": hashlib.sha256(text.encode()).hexdigest(),
        "grace": float(spec.get("terminationGracePeriodSeconds", 30)),
    }


class StaticPods:
    """Keeps the processes in line with the manifests of one directory (call sync() periodically)."""

    def __init__(self, manifest_dir: Path, node_name: str, log) -> None:
        self.manifest_dir, self.node_name, self.log = manifest_dir, node_name, log
        self.children: dict[int, subprocess.Popen] = {}
        self.broken: dict[Path, str] = {}
        for key, state in read_states().items():
            alive = [c["name"] for c in state["containers"] if running(c)]
            if alive:
                log(f"adopting pod {key}: containers {', '.join(alive)} still run")

    def wanted(self) -> dict[str, dict]:
        found = {}
        for path in sorted(self.manifest_dir.glob("[!.]*")):
            try:
                found.update([parse_manifest(path, self.node_name)])
                self.broken.pop(path, None)
            except (StandinError, OSError) as exc:
                if self.broken.get(path) != str(exc):
                    self.log(f"cannot run static pod {path}: {exc}")
                self.broken[path] = str(exc)
        return found

    def sync(self) -> None:
        self.children = {pid: child for pid, child in self.children.items() if child.poll() is None}
        wanted, states = self.wanted(), read_states()
        for key, state in list(states.items()):
            if wanted.get(key, {}).get("hash") != state["hash"]:
                self.log(
                    f"stopping pod {key}: its manifest " + ("changed" if key in wanted else "is gone or cannot run")
                )
                for container in state["containers"]:
                    stop_container(container, state["grace"])
                (PODS / f"{key}.json").unlink(missing_ok=True)
                del states[key]
        for key, pod in wanted.items():
            state = states.get(key) or {
                **pod,
                "id": secrets.token_hex(32),
                "created": time.time(),
                "containers": [{"name": c["name"], "restarts": 0} for c in pod["containers"]],
            }
            changed = [
                self._keep_running(key, spec, container)
                for spec, container in zip(pod["containers"], state["containers"])
            ]
            if any(changed) or key not in states:
                write_private(PODS / f"{key}.json", json.dumps(state, indent=1).encode())

    def _keep_running(self, key: str, spec: dict, container: dict) -> bool:
        """Start or restart one container when due; True when its state changed."""
        now = time.time()
        if running(container):
            return False
        if container.get("pid"):
            ran = now - container["started_at"]
            failures = 0 if ran > BACKOFF_RESET else container.get("failures", 0) + 1
            delay = min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** (failures - 1)) if failures else 0.0
            container.update(pid=None, failures=failures, next_start=now + delay, restarts=container["restarts"] + 1)
            self.log(f"pod {key} container {spec['name']} exited after {ran:.0f} s; restart in {delay:.0f} s")
            return True
        if now < container.get("next_start", 0):
            return False
        log_path = LOG_DIR / key / f"{spec['name']}.log"
        try:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(log_path, "ab") as output:
                child = subprocess.Popen(
                    spec["argv"],
                    env=spec["env"],
                    cwd=spec["workdir"],
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        except OSError as exc:
            self.log(f"pod {key} container {spec['name']} cannot start: {exc}; next try in {BACKOFF_MAX:.0f} s")
            container["next_start"] = now + BACKOFF_MAX
            return True
        self.children[child.pid] = child
        container.update(pid=child.pid, start=start_time(child.pid), started_at=now)
        self.log(f"pod {key} container {spec['name']} started: pid {child.pid}, log {log_path}")
        return True
