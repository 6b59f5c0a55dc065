# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read a node's state in one pass, and bring its host preparation to what kubeadm's preflight expects."""

from __future__ import annotations

import glob
import os
import platform
import re
import stat
import subprocess
import tarfile
from dataclasses import dataclass, field

from . import NodeStateError, stamp
from .._disk import find_binary
from .._files import file_digest, write_file_atomically

# An fstab line that mounts swap and is not commented out: device, mount point, type swap, options.
FSTAB_SWAP = re.compile(r"^[^#\s]\S*\s+\S+\s+swap(\s|$)")
MODULE_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
SYSCTL_KEY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_./-]*$")
# A Debian package name (Debian policy 5.6.7).
PACKAGE_NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")
# Where systemd-sysctl reads its files at boot, in its order of precedence for files of the same name; across
# directories the files apply in the order of their names, so the last name sets a key.
SYSCTL_DIRS = ("/etc/sysctl.d", "/run/sysctl.d", "/usr/local/lib/sysctl.d", "/usr/lib/sysctl.d", "/lib/sysctl.d")
# zram swap comes back at boot from systemd's zram-generator (masked in /etc) or from a service that sets it up.
ZRAM_GENERATOR = "zram-generator"
GENERATOR_DIRS = ("/usr/lib/systemd/system-generators", "/lib/systemd/system-generators")
ZRAM_SERVICES = ("zramswap.service", "zram-config.service")
IMPORT_PROGRAM = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class HostPreparation:
    """The host preparation kubeadm's preflight expects; an empty field asks for nothing."""

    swap_off: bool = False
    fstab: str = "/etc/fstab"
    kernel_modules: tuple[str, ...] = ()
    modules_load_file: str = "/etc/modules-load.d/kubernetes.conf"
    # (key, value) in the order they are written.
    sysctls: tuple[tuple[str, str], ...] = ()
    sysctl_file: str = "/etc/sysctl.d/zz-confidential-kubernetes.conf"
    # Files of earlier versions that held the same sysctls: removed, so that they set nothing behind sysctl_file's back.
    sysctl_files_replaced: tuple[str, ...] = ()
    sysctl_dirs: tuple[str, ...] = SYSCTL_DIRS

    def problems(self) -> list[str]:
        """Every malformed name or value, so that bad input fails before anything changes."""
        found = [
            f"kernel module name {name!r} is not a module name"
            for name in self.kernel_modules
            if not MODULE_NAME.match(name)
        ]
        found += [
            f"sysctl key {key!r} is not a sysctl name" for key, dummy in self.sysctls if not SYSCTL_KEY.match(key)
        ]
        found += [f"sysctl {key} has no value" for key, value in self.sysctls if not value.strip() or "\n" in value]
        return found


@dataclass
class Outcome:
    """What the host preparation changed (or, in check mode, would change), and the files' diffs."""

    changes: list[str] = field(default_factory=list)
    diff: list[dict] = field(default_factory=list)


def unpacked(archive_path: str, dest: str) -> bool:
    """Whether ``dest`` holds every directory and regular file of the tar archive, with the same content and mode."""
    if not os.path.isdir(dest):
        return False
    try:
        with tarfile.open(archive_path) as archive:
            for member in archive:
                if os.path.isabs(member.name) or ".." in member.name.split("/"):
                    return False
                target = os.path.join(dest, member.name)
                if member.isdir() and not os.path.isdir(target):
                    return False
                if member.isfile() and not _same_file(archive, member, target):
                    return False
    except (OSError, tarfile.TarError):
        return False
    return True


def _same_file(archive: tarfile.TarFile, member: tarfile.TarInfo, target: str) -> bool:
    try:
        found = os.lstat(target)
    except OSError:
        return False
    if (
        not stat.S_ISREG(found.st_mode)
        or found.st_size != member.size
        or stat.S_IMODE(found.st_mode) != member.mode & 0o7777
    ):
        return False
    source = archive.extractfile(member)
    with source, open(target, "rb") as installed:
        for chunk in iter(lambda: source.read(_CHUNK), b""):
            if installed.read(len(chunk)) != chunk:
                return False
    return True


def _sysctl_name(key: str) -> str:
    """A key in its dotted form, as sysctl.d(5) reads one whose first separator is a slash (dots and slashes swap)."""
    first = min((i for i in (key.find("."), key.find("/")) if i >= 0), default=-1)
    if first >= 0 and key[first] == "/":
        return key.translate(str.maketrans("./", "/."))
    return key


def sysctl_settings(directories: tuple[str, ...]) -> dict[str, tuple[str, str]]:
    """What the boot's systemd-sysctl sets: each key's (file, value) from the last file that sets it.

    Files apply in the order of their names; of files with the same name only the one in the first directory counts.
    """
    files: dict[str, str] = {}
    for directory in directories:
        for path in sorted(glob.glob(os.path.join(directory, "*.conf"))):
            files.setdefault(os.path.basename(path), path)
    settings: dict[str, tuple[str, str]] = {}
    for name in sorted(files):
        try:
            with open(files[name], encoding="utf-8", errors="replace") as handle:
                lines = handle.read().splitlines()
        except OSError:
            continue
        for line in lines:
            line = line.strip()
            if not line or line[0] in "#;" or "=" not in line:
                continue
            key, value = (part.strip() for part in line.split("=", 1))
            settings[_sysctl_name(key.lstrip("-"))] = (files[name], value)
    return settings


def _read(path: str) -> tuple[str | None, int | None]:
    """A file's text (bytes kept as they are) and mode; (None, None) when it does not exist."""
    try:
        with open(path, "rb") as handle:
            return handle.read().decode("utf-8", "surrogateescape"), stat.S_IMODE(os.fstat(handle.fileno()).st_mode)
    except FileNotFoundError:
        return None, None


def _shown(text: str | None) -> str:
    return (text or "").encode("utf-8", "surrogateescape").decode("utf-8", "replace")


class NodeState:
    """One node's state; ``prepare`` changes the host preparation, everything else only reads."""

    def __init__(self, check_mode: bool = False, proc: str = "/proc", root: str = "/"):
        self.check_mode = check_mode
        self.proc = proc
        # Where systemd's own directories are looked up (a test's tree).
        self.root = root

    def _path(self, absolute: str) -> str:
        return os.path.join(self.root, absolute.lstrip("/"))

    def _run_command(self, argv: list[str]) -> tuple[int, str, str]:
        """The one place a command runs (argument lists only): return code, stdout, stderr; 127 when it is missing."""
        binary = argv[0] if os.path.isabs(argv[0]) else find_binary(argv[0])
        if binary is None or not os.access(binary, os.X_OK):
            return 127, "", f"{argv[0]}: not found"
        completed = subprocess.run([binary, *argv[1:]], capture_output=True, check=False, timeout=600)
        return (
            completed.returncode,
            completed.stdout.decode(errors="replace"),
            completed.stderr.decode(errors="replace"),
        )

    def _must_run(self, argv: list[str]) -> None:
        code, dummy, err = self._run_command(argv)
        if code != 0:
            raise NodeStateError(f"{' '.join(argv)} failed (exit {code}): {err.strip()}")

    @staticmethod
    def architecture() -> str:
        """The machine as Ansible's facts name it (x86_64, aarch64)."""
        return platform.machine()

    def venv(self, path: str, imports: list[str]) -> dict:
        """Whether the virtualenv's python imports every module of ``imports``; the last error line when it does not."""
        code, dummy, err = self._run_command([os.path.join(path, "bin", "python"), "-c", IMPORT_PROGRAM, *imports])
        lines = err.strip().splitlines()
        return {
            "path": path,
            "complete": code == 0,
            "error": None if code == 0 else (lines[-1] if lines else f"exit {code}"),
        }

    @staticmethod
    def tools(names: list[str]) -> dict[str, str | None]:
        """Each tool's path, None for a missing one."""
        return {name: find_binary(name) for name in names}

    def packages(self, names: list[str]) -> dict[str, bool]:
        """Whether each Debian package is installed (dpkg status "ii"); every one False where dpkg cannot say."""
        if not names:
            return {}
        wrong = [name for name in names if not PACKAGE_NAME.match(name)]
        if wrong:
            raise NodeStateError(f"not Debian package names: {', '.join(wrong)}")
        # Exit 1 when a package is unknown to dpkg; the others are listed all the same.
        dummy, out, dummy = self._run_command(
            ["dpkg-query", "--show", "--showformat=${Package} ${db:Status-Abbrev}\n", "--", *names]
        )
        installed = {
            fields[0]
            for fields in (line.split() for line in out.splitlines())
            if len(fields) >= 2 and fields[1] == "ii"
        }
        return {name: name in installed for name in names}

    @staticmethod
    def stamps(pattern: str) -> dict[str, bool]:
        """Every stamp matching the glob ``pattern``, and whether it verifies."""
        return {path: stamp.verifies(path) for path in sorted(glob.glob(pattern))}

    def services(self, names: list[str]) -> dict[str, dict[str, bool]]:
        """Each systemd unit's state: active (running) and enabled; both false where systemd cannot say."""
        states = {name: {"active": False, "enabled": False} for name in names}
        if not names:
            return states
        code, out, dummy = self._run_command(
            ["systemctl", "show", "--property=Id,ActiveState,UnitFileState", "--", *names]
        )
        blocks = [
            dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
            for block in out.strip().split("\n\n")
        ]
        if code != 0 or len(blocks) != len(names):
            return states
        return {
            name: {"active": block.get("ActiveState") == "active", "enabled": block.get("UnitFileState") == "enabled"}
            for name, block in zip(names, blocks)
        }

    @staticmethod
    def archive(path: str, dest: str, expected_sha256: str) -> dict:
        """The archive's sha256 on the node, whether it is the expected one, and whether ``dest`` holds its content."""
        try:
            digest = file_digest(path).sha256
        except OSError:
            digest = None
        return {
            "sha256": digest,
            "current": digest == expected_sha256,
            "unpacked": digest is not None and unpacked(path, dest),
        }

    def _proc_lines(self, name: str, what: str) -> list[str]:
        try:
            with open(os.path.join(self.proc, name), encoding="utf-8") as handle:
                return [line for line in handle.read().splitlines() if line.strip()]
        except FileNotFoundError:
            raise NodeStateError(
                f"this host has no {os.path.join(self.proc, name)} (a container?), so {what} cannot "
                "be checked; switch that step off for it"
            ) from None

    def active_swap(self) -> list[str]:
        """The swap devices and files in use (/proc/swaps after its header)."""
        return [line.split()[0] for line in self._proc_lines("swaps", "swap")[1:]]

    def loaded_modules(self) -> set[str]:
        """The names of the loaded kernel modules."""
        return {line.split(" ", 1)[0] for line in self._proc_lines("modules", "the kernel modules")}

    def _sysctl_path(self, key: str) -> str:
        # sysctl's rule: a key with a slash uses slashes as separators and keeps its dots (interface names).
        return os.path.join(self.proc, "sys", *(key.split("/") if "/" in key else key.split(".")))

    def sysctl(self, key: str) -> str | None:
        """A sysctl's current value, whitespace as /proc shows it; None when the host has no such key (yet)."""
        try:
            with open(self._sysctl_path(key), encoding="utf-8") as handle:
                return handle.read().strip()
        except FileNotFoundError:
            return None

    def prepare(self, preparation: HostPreparation, outcome: Outcome) -> None:
        """Bring the host to ``preparation``: swap, then kernel modules (the bridge sysctls need br_netfilter), then
        sysctls. ``outcome`` collects each change as it is made, so that a failure still says what changed before it."""
        problems = preparation.problems()
        if problems:
            raise NodeStateError("; ".join(problems))
        if preparation.swap_off:
            self._swap_off(preparation.fstab, outcome)
        if preparation.kernel_modules:
            self._kernel_modules(preparation, outcome)
        if preparation.sysctls:
            self._sysctls(preparation, outcome)

    def _swap_off(self, fstab: str, outcome: Outcome) -> None:
        active = self.active_swap()
        if active:
            outcome.changes.append(f"swapoff --all (active: {', '.join(active)})")
            if not self.check_mode:
                self._must_run(["swapoff", "--all"])
        before, mode = _read(fstab)
        if before is not None:
            lines = before.splitlines(keepends=True)
            after = "".join("# " + line if FSTAB_SWAP.match(line) else line for line in lines)
            if after != before:
                count = sum(1 for line in lines if FSTAB_SWAP.match(line))
                self._write(fstab, before, after, mode, outcome, f"comment out {count} swap line(s) in {fstab}")
        self._mask_swap_units(outcome)
        self._mask_zram_generator(outcome)

    def swap_units(self) -> list[str]:
        """The swap units systemd knows (fstab's, a generator's, a unit file's) and the zram services it has, that are
        neither masked nor missing: any of them would turn swap on again at the next boot. None where systemd cannot
        say (no systemctl, or a system not booted with systemd, such as an image build's chroot)."""
        code, out, dummy = self._run_command(
            ["systemctl", "list-units", "--type=swap", "--all", "--plain", "--no-legend", "--full"]
        )
        if code != 0:
            return []
        # UNIT LOAD ACTIVE SUB DESCRIPTION, a failed unit's line after a bullet.
        rows = ([field for field in line.split() if field not in ("●", "*")] for line in out.splitlines())
        units = [fields[0] for fields in rows if len(fields) >= 2 and fields[1] not in ("masked", "not-found")]
        code, out, dummy = self._run_command(["systemctl", "show", "--property=Id,LoadState", "--", *ZRAM_SERVICES])
        if code == 0:
            for block in out.strip().split("\n\n"):
                properties = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
                if properties.get("LoadState") not in (None, "not-found", "masked"):
                    units.append(properties["Id"])
        return units

    def _mask_swap_units(self, outcome: Outcome) -> None:
        units = self.swap_units()
        if not units:
            return
        outcome.changes.append(f"systemctl mask {' '.join(units)}")
        if not self.check_mode:
            self._must_run(["systemctl", "mask", "--", *units])

    def _mask_zram_generator(self, outcome: Outcome) -> None:
        """systemd's zram-generator makes a zram swap device at every boot from its configuration: masked by a link to
        /dev/null of its name in /etc/systemd/system-generators, as systemd masks a generator."""
        if not any(os.path.exists(self._path(os.path.join(d, ZRAM_GENERATOR))) for d in GENERATOR_DIRS):
            return
        mask = self._path(os.path.join("/etc/systemd/system-generators", ZRAM_GENERATOR))
        if os.path.islink(mask) and os.readlink(mask) == os.devnull:
            return
        outcome.changes.append(f"mask the zram generator ({mask} -> {os.devnull})")
        if self.check_mode:
            return
        os.makedirs(os.path.dirname(mask), mode=0o755, exist_ok=True)
        if os.path.lexists(mask):
            os.unlink(mask)
        os.symlink(os.devnull, mask)

    def _kernel_modules(self, preparation: HostPreparation, outcome: Outcome) -> None:
        self._ensure_file(
            preparation.modules_load_file, "".join(f"{name}\n" for name in preparation.kernel_modules), outcome
        )
        loaded = self.loaded_modules()
        for name in preparation.kernel_modules:
            # /proc/modules names a module with underscores whichever way it was asked for.
            if name.replace("-", "_") not in loaded:
                outcome.changes.append(f"modprobe {name}")
                if not self.check_mode:
                    self._must_run(["modprobe", name])

    def _sysctls(self, preparation: HostPreparation, outcome: Outcome) -> None:
        self._ensure_file(
            preparation.sysctl_file, "".join(f"{key} = {value}\n" for key, value in preparation.sysctls), outcome
        )
        for replaced in preparation.sysctl_files_replaced:
            if replaced != preparation.sysctl_file and os.path.lexists(replaced):
                outcome.changes.append(f"remove {replaced}")
                if not self.check_mode:
                    os.unlink(replaced)
        self._set_sysctls(preparation, outcome)
        if not self.check_mode:
            self._check_sysctls(preparation)

    def _check_sysctls(self, preparation: HostPreparation) -> None:
        """Each sysctl as the kernel has it now, and as the boot will set it: a value another file sets after ours,
        or one the kernel did not take, fails naming the key, the value and where it is set."""
        settings = sysctl_settings(preparation.sysctl_dirs)
        problems = []
        for key, value in preparation.sysctls:
            source, set_value = settings.get(_sysctl_name(key), (None, None))
            if source is not None and source != preparation.sysctl_file and set_value.split() != value.split():
                problems.append(
                    f"{key} = {set_value} in {source}, which the boot applies after {preparation.sysctl_file}"
                )
                continue
            current = self.sysctl(key)
            if current is not None and current.split() != value.split():
                where = (
                    f"set in {source}"
                    if source and source != preparation.sysctl_file
                    else "the kernel did not keep it, or something set it at run time: no other sysctl.d file sets it"
                )
                problems.append(f"{key} is {current} in {self._sysctl_path(key)}, not {value} ({where})")
        if problems:
            raise NodeStateError(
                "sysctls that do not take the value kubeadm's preflight needs: "
                + "; ".join(problems)
                + ". Remove or change those settings (or set node_stack_sysctls to what they need)"
            )

    def _set_sysctls(self, preparation: HostPreparation, outcome: Outcome) -> None:
        for key, value in preparation.sysctls:
            current = self.sysctl(key)
            if current is not None and current.split() == value.split():
                continue
            outcome.changes.append(f"sysctl {key} = {value} (was {current if current is not None else 'unset'})")
            if self.check_mode:
                continue
            try:
                with open(self._sysctl_path(key), "w", encoding="utf-8") as handle:
                    handle.write(value)
            except FileNotFoundError:
                raise NodeStateError(
                    f"sysctl {key}: this host has no such key (is the kernel module that provides it loaded?)"
                ) from None
            except OSError as exc:
                raise NodeStateError(f"sysctl {key} = {value}: {exc.strerror}") from None

    def write_stamp(self, path: str, files: list[str], outcome: Outcome, absent: list[str] | None = None) -> None:
        """The stamp of ``files`` and of the ``absent`` paths at ``path`` (mode 0644), written when it differs. In
        check mode a file the install would write may be missing yet, or one it would remove still there: the stamp
        would change."""
        try:
            content = stamp.text(files, settle=not self.check_mode, absent=tuple(absent or ()))
        except stamp.UnreadableFile:
            if not self.check_mode:
                raise
            outcome.changes.append(f"write {path}")
            return
        before, mode = _read(path)
        if before != content or mode != 0o644:
            outcome.changes.append(f"write {path}")
            if self.check_mode:
                return
            try:
                os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
                write_file_atomically(path, content.encode("utf-8", "surrogateescape"), 0o644)
            except OSError as exc:
                raise NodeStateError(f"writing the stamp {path}: {exc}") from None

    def _ensure_file(self, path: str, content: str, outcome: Outcome) -> None:
        """A configuration file with exactly ``content``, mode 0644."""
        before, mode = _read(path)
        if before != content or mode != 0o644:
            self._write(path, before, content, 0o644, outcome, f"write {path}")

    def _write(self, path: str, before: str | None, after: str, mode: int, outcome: Outcome, change: str) -> None:
        outcome.changes.append(change)
        outcome.diff.append(
            {"before_header": path, "after_header": path, "before": _shown(before), "after": _shown(after)}
        )
        if self.check_mode:
            return
        os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
        write_file_atomically(path, after.encode("utf-8", "surrogateescape"), mode)
