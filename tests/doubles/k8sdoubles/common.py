"""Paths, durations, timestamps and file helpers shared by every double."""

from __future__ import annotations

import datetime as _dt
import os
import re
import sys
import tempfile
from pathlib import Path

from . import BUILD_DATE, GIT_COMMIT, GO_VERSION, KUBERNETES_VERSION

DOUBLES_DIR = Path(__file__).resolve().parent.parent

KUBERNETES_DIR = "/etc/kubernetes"
MANIFESTS_DIR = "/etc/kubernetes/manifests"
DEFAULT_PKI_DIR = "/etc/kubernetes/pki"
KUBELET_DIR = "/var/lib/kubelet"
APISERVER_STATE_DIR = "/etc/kubernetes/double-apiserver"
APISERVER_STATE_FILE = APISERVER_STATE_DIR + "/state.json"
APISERVER_PID_FILE = "/run/kube-apiserver-double.pid"
APISERVER_LOG_FILE = "/var/log/kube-apiserver-double.log"
APISERVER_UNIT = "kube-apiserver-double"
APISERVER_UNIT_FILE = f"/etc/systemd/system/{APISERVER_UNIT}.service"


class DoubleError(Exception):
    """A failure the double reports to its caller like the real tool would."""


def root() -> Path:
    return Path(os.environ.get("K8S_DOUBLES_ROOT", "/") or "/")


def host_path(logical: str | os.PathLike[str]) -> Path:
    """Map a logical absolute path (/etc/kubernetes/...) under K8S_DOUBLES_ROOT."""
    text = os.fspath(logical)
    if not os.path.isabs(text):
        return Path(text)
    return root() / text.lstrip("/")


def atomic_write(path: Path, data: bytes | str, mode: int = 0o600) -> None:
    """Write via a temp file in the same directory, fsync, rename."""
    if isinstance(data, str):
        data = data.encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix="." + path.name + ".")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0)


def rfc3339(moment: _dt.datetime) -> str:
    return moment.astimezone(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str) -> _dt.datetime:
    return _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Parse a Go time.Duration string ("24h0m0s", "15m", "1.5s") into seconds."""
    original = text
    sign = 1.0
    if text[:1] in "+-":
        sign = -1.0 if text[0] == "-" else 1.0
        text = text[1:]
    if text == "0":
        return 0.0
    if not text:
        raise ValueError(f'time: invalid duration "{original}"')
    total = 0.0
    pos = 0
    while pos < len(text):
        match = _DURATION_PART.match(text, pos)
        if not match:
            if re.match(r"(\d+(?:\.\d*)?|\.\d+)$", text[pos:]):
                raise ValueError(f'time: missing unit in duration "{original}"')
            raise ValueError(f'time: invalid duration "{original}"')
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        pos = match.end()
    return sign * total


def format_duration(seconds: float) -> str:
    """Format whole seconds like Go's time.Duration.String()."""
    whole = int(seconds)
    if whole == 0:
        return "0s"
    hours, rest = divmod(abs(whole), 3600)
    minutes, secs = divmod(rest, 60)
    sign = "-" if whole < 0 else ""
    if hours:
        return f"{sign}{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{sign}{minutes}m{secs}s"
    return f"{sign}{secs}s"


def short_human_duration(seconds: float) -> str:
    """k8s.io/apimachinery duration.ShortHumanDuration."""
    secs = int(seconds)
    if secs < -1:
        return "<invalid>"
    if secs < 0:
        return "0s"
    if secs < 60:
        return f"{secs}s"
    if secs // 60 < 60:
        return f"{secs // 60}m"
    hours = secs // 3600
    if hours < 24:
        return f"{hours}h"
    if hours < 24 * 365:
        return f"{hours // 24}d"
    return f"{hours // 24 // 365}y"


def human_duration(seconds: float) -> str:
    """k8s.io/apimachinery duration.HumanDuration (kubectl AGE column)."""
    secs = int(seconds)
    if secs < -1:
        return "<invalid>"
    if secs < 0:
        return "0s"
    if secs < 120:
        return f"{secs}s"
    minutes = secs // 60
    if minutes < 10:
        rest = secs % 60
        return f"{minutes}m" if rest == 0 else f"{minutes}m{rest}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = secs // 3600
    if hours < 8:
        rest = minutes % 60
        return f"{hours}h" if rest == 0 else f"{hours}h{rest}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        rest = hours % 24
        return f"{hours // 24}d" if rest == 0 else f"{hours // 24}d{rest}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        rest = (hours // 24) % 365
        return f"{hours // 24 // 365}y" if rest == 0 else f"{hours // 24 // 365}y{rest}d"
    return f"{hours // 24 // 365}y"


def tabulate(rows: list[list[str]], minwidth: int = 6, padding: int = 3) -> str:
    """Go text/tabwriter with the settings kubectl and kubeadm use."""
    if not rows:
        return ""
    columns = max(len(row) for row in rows)
    widths = [0] * columns
    for row in rows:
        for index, cell in enumerate(row[:-1]):
            widths[index] = max(widths[index], len(cell) + padding, minwidth)
    lines = []
    for row in rows:
        parts = [cell.ljust(widths[index]) for index, cell in enumerate(row[:-1])]
        parts.append(row[-1])
        lines.append("".join(parts))
    return "\n".join(lines) + "\n"


def version_info() -> dict[str, str]:
    """The version.Info object every Kubernetes binary reports."""
    major, minor = KUBERNETES_VERSION.lstrip("v").split(".")[:2]
    return {
        "major": major,
        "minor": minor,
        "gitVersion": KUBERNETES_VERSION,
        "gitCommit": GIT_COMMIT,
        "gitTreeState": "clean",
        "buildDate": BUILD_DATE,
        "goVersion": GO_VERSION,
        "compiler": "gc",
        "platform": "linux/amd64",
    }


def eprint(*args: object) -> None:
    print(*args, file=sys.stderr)
