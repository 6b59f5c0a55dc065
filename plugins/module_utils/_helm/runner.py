# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The helm command line: the one place the collection runs helm (Helm 3 and Helm 4 flags). Tests replace ``_run_command``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field

PENDING = ("pending-install", "pending-upgrade", "pending-rollback")
_MAJOR = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)")
_NOT_FOUND = re.compile(r"release: not found")
# The keys of kubernetes.core.helm's ``status``: its ``helm list`` entry (values aside, see release_status).
STATUS_KEYS = ("name", "namespace", "revision", "status", "chart", "app_version", "updated")


class HelmError(RuntimeError):
    """helm failed; the message carries helm's own words."""


class ReleasePendingError(HelmError):
    """The release's latest revision is pending: another operation runs, or a helm process died in the middle."""


@dataclass(frozen=True)
class DeployedRelease:
    """What ``helm status`` reports about the latest revision of a release."""

    name: str
    namespace: str
    revision: int
    status: str
    chart_name: str
    chart_version: str


@dataclass
class ReleaseRequest:
    """One release as the module is asked for it (kubernetes.core's option names)."""

    release_name: str
    release_namespace: str
    chart_ref: str
    chart_version: str | None = None
    chart_repo_url: str | None = None
    wait: bool = True
    wait_timeout: str = "5m0s"
    atomic: bool = True
    create_namespace: bool = False
    # helm's --force (Helm 4: --force-replace --server-side=false): replace resources that cannot be patched.
    force: bool = False
    extra_flags: list[str] = field(default_factory=list)


class Helm:
    """Runs helm with argument lists (never a shell), picking Helm 3 or Helm 4 flags from ``helm version``."""

    def __init__(self, binary: str = "helm", kubeconfig: str | None = None, context: str | None = None):
        self.binary = binary
        self.kubeconfig = kubeconfig
        self.context = context
        self._major: int | None = None

    def _run_command(self, argv: list[str], data: bytes | None = None) -> tuple[int, str, str]:
        try:
            completed = subprocess.run(argv, input=data, capture_output=True, check=False, timeout=3600)
        except FileNotFoundError:
            raise HelmError(f"{argv[0]} is not installed on this host (set binary_path)") from None
        except subprocess.TimeoutExpired:
            raise HelmError(f"{' '.join(argv[:2])} did not finish within an hour") from None
        return (
            completed.returncode,
            completed.stdout.decode(errors="replace"),
            completed.stderr.decode(errors="replace"),
        )

    def _global(self, namespace: str | None = None) -> list[str]:
        flags = []
        if namespace:
            flags += ["--namespace", namespace]
        if self.kubeconfig:
            flags += ["--kubeconfig", self.kubeconfig]
        if self.context:
            flags += ["--kube-context", self.context]
        return flags

    def run(self, argv: list[str], what: str) -> str:
        rc, out, err = self._run_command([self.binary, *argv])
        if rc != 0:
            raise HelmError(f"{what} failed: {_message(err or out)}")
        return out

    @property
    def major(self) -> int:
        if self._major is None:
            out = self.run(["version", "--short"], "helm version")
            match = _MAJOR.match(out.strip())
            if not match:
                raise HelmError(f"cannot read the helm version from {out.strip()!r}")
            self._major = int(match.group(1))
            if self._major < 3:
                raise HelmError(f"helm {out.strip()} is not supported: Helm 3 or 4 is needed")
        return self._major

    def status(self, name: str, namespace: str) -> DeployedRelease | None:
        """The latest revision of ``name``, or None when helm knows no such release.

        ``helm get metadata`` (Helm >= 3.13): ``helm status -o json`` carries no chart name or version.
        """
        rc, out, err = self._run_command([self.binary, "get", "metadata", name, *self._global(namespace), "-o", "json"])
        if rc != 0:
            if _NOT_FOUND.search(err):
                return None
            raise HelmError(f"helm get metadata {name} failed: {_message(err or out)}")
        try:
            release = json.loads(out)
            return DeployedRelease(
                name=release["name"],
                namespace=release.get("namespace") or namespace,
                revision=int(release["revision"]),
                status=release["status"],
                chart_name=str(release["chart"]),
                chart_version=str(release["version"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise HelmError(f"cannot read the metadata of release {name} from helm: {exc}") from None

    def release_status(self, name: str, namespace: str) -> dict | None:
        """The release as M(kubernetes.core.helm) returns it in ``status``: its ``helm list -o json`` entry (revision a
        string, chart ``<name>-<version>``), or None when helm lists no such release. Unlike kubernetes.core, without
        the values: they routinely carry credentials, and a result is logged."""
        # Every status: Helm 3 lists only deployed and failed releases without --all; Helm 4 lists all and has no --all.
        every_status = ["--all"] if self.major < 4 else []
        argv = ["list", *self._global(namespace), *every_status, "--filter", f"^{re.escape(name)}$", "-o", "json"]
        for entry in json.loads(self.run(argv, f"helm list {name}") or "[]"):
            if entry.get("name") == name:
                return {key: entry.get(key) for key in STATUS_KEYS}
        return None

    def history(self, name: str, namespace: str) -> list[dict]:
        out = self.run(["history", name, *self._global(namespace), "-o", "json"], f"helm history {name}")
        return json.loads(out or "[]")

    def last_deployed_revision(self, name: str, namespace: str) -> int | None:
        deployed = [
            int(r["revision"]) for r in self.history(name, namespace) if r.get("status") in ("deployed", "superseded")
        ]
        return max(deployed) if deployed else None

    def get_values(self, name: str, namespace: str) -> dict:
        """User-supplied values of the latest revision (``helm get values -o json``)."""
        out = self.run(["get", "values", name, *self._global(namespace), "-o", "json"], f"helm get values {name}")
        return json.loads(out or "null") or {}

    def get_manifest(self, name: str, namespace: str) -> str:
        return self.run(["get", "manifest", name, *self._global(namespace)], f"helm get manifest {name}")

    def _chart_args(self, request: ReleaseRequest) -> list[str]:
        args = []
        if request.chart_repo_url:
            args += ["--repo", request.chart_repo_url]
        # helm ignores --version for a local path; it is pinned by the archive itself (checked in chart.resolve_chart).
        if request.chart_version and request.chart_repo_url:
            args += ["--version", request.chart_version]
        return args

    def upgrade_argv(self, request: ReleaseRequest, values_path: str) -> list[str]:
        """``helm upgrade --install`` with the user values as exactly one 0600 file and --reset-values.

        Helm 3: ``--atomic`` and ``--wait``; Helm 4: ``--rollback-on-failure`` and ``--wait=watcher``. Both helms wait
        whenever they roll back on failure, so without wait the rollback flag is left out (the caller rolls back).
        """
        argv = [self.binary, "upgrade", "--install", request.release_name, request.chart_ref]
        argv += self._global(request.release_namespace)
        argv += self._chart_args(request)
        argv += ["--values", values_path, "--reset-values", "--timeout", request.wait_timeout]
        if request.create_namespace:
            argv.append("--create-namespace")
        if request.force:
            # Helm 4 refuses replacement with server-side apply, its default: replace client-side, as Helm 3 does.
            argv += ["--force-replace", "--server-side=false"] if self.major >= 4 else ["--force"]
        if request.wait:
            if self.major >= 4:
                argv += ["--wait=watcher"] + (["--rollback-on-failure"] if request.atomic else [])
            else:
                argv += ["--wait"] + (["--atomic"] if request.atomic else [])
        return argv + list(request.extra_flags)

    def upgrade(self, request: ReleaseRequest, values: dict) -> list[str]:
        """Run the upgrade; returns the argv it ran (no secrets: values travel in a removed 0600 file)."""
        with private_values_file(values) as values_path:
            argv = self.upgrade_argv(request, values_path)
            rc, out, err = self._run_command(argv)
        if rc != 0:
            raise HelmError(_message(err or out))
        return argv

    def template(self, request: ReleaseRequest, values: dict) -> str:
        with private_values_file(values) as values_path:
            argv = [
                self.binary,
                "template",
                request.release_name,
                request.chart_ref,
                *self._global(request.release_namespace),
            ]
            argv += self._chart_args(request) + ["--values", values_path]
            rc, out, err = self._run_command(argv)
        if rc != 0:
            raise HelmError(f"helm template {request.release_name} failed: {_message(err or out)}")
        return out

    def uninstall_argv(self, request: ReleaseRequest) -> list[str]:
        """``helm uninstall``, waiting as installs wait: Helm 3 ``--wait``, Helm 4 ``--wait=watcher``."""
        argv = [self.binary, "uninstall", request.release_name, *self._global(request.release_namespace)]
        argv += ["--timeout", request.wait_timeout]
        if request.wait:
            argv.append("--wait=watcher" if self.major >= 4 else "--wait")
        return argv

    def uninstall(self, request: ReleaseRequest) -> list[str]:
        argv = self.uninstall_argv(request)
        rc, out, err = self._run_command(argv)
        if rc != 0:
            raise HelmError(_message(err or out))
        return argv

    def rollback(self, name: str, namespace: str, revision: int, timeout: str) -> None:
        self.run(
            ["rollback", name, str(revision), *self._global(namespace), "--timeout", timeout], f"helm rollback {name}"
        )


class private_values_file:
    """A 0600 temporary file holding the values (JSON is YAML), removed on exit."""

    def __init__(self, values: dict):
        self.values = values
        self.path = ""

    def __enter__(self) -> str:
        fd, self.path = tempfile.mkstemp(prefix="helm-values-", suffix=".yaml")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            os.fchmod(handle.fileno(), 0o600)
            json.dump(self.values or {}, handle)
        return self.path

    def __exit__(self, *exc_info: object) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def _message(text: str) -> str:
    """helm's error without the ``Error:`` prefix, and without the log lines Helm 4 prints before it."""
    lines = text.strip().splitlines()
    for index in range(len(lines) - 1, -1, -1):
        if lines[index].startswith("Error: "):
            return "\n".join([lines[index][len("Error: ") :], *lines[index + 1 :]]).strip()
    return text.strip()
