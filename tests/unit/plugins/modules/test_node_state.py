"""node_state's main(): the probe and the host preparation on real files in a temporary tree.

The node's /proc is a directory of the test (swaps, modules, sys/...), and the one command seam
(NodeState._run_command) plays swapoff, modprobe and systemctl on it; everything else is real: the
fstab, modules-load.d and sysctl.d files, stamps and the files they list, tar archives, a virtualenv's python.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

from ansible_collections.confidential.kubernetes.plugins.module_utils import _files
from ansible_collections.confidential.kubernetes.plugins.module_utils._node.state import NodeState
from ansible_collections.confidential.kubernetes.plugins.modules import node_state

SYSCTLS = {"net.bridge.bridge-nf-call-iptables": 1, "net.ipv4.ip_forward": 1}
SWAPS_HEADER = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
FSTAB = "# /etc/fstab\nUUID=1234 / ext4 errors=remount-ro 0 1\n/swapfile none swap sw 0 0\n#/old none swap sw 0 0\n"


class AnsibleExitJson(Exception):
    pass


class AnsibleFailJson(Exception):
    pass


@pytest.fixture(autouse=True)
def module_exits(monkeypatch):
    def exit_json(module, **kwargs):
        raise AnsibleExitJson(kwargs)

    def fail_json(module, msg, **kwargs):
        raise AnsibleFailJson({"msg": msg, **kwargs})

    monkeypatch.setattr(basic.AnsibleModule, "exit_json", exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", fail_json)


class Node:
    """A node's /proc in a directory, and the commands the module runs, recorded and played on it."""

    def __init__(self, root: Path):
        self.root = root
        self.proc = root / "proc"
        self.commands: list[list[str]] = []
        # What systemctl only read (the swap units and zram services it lists), apart from the commands that change.
        self.queries: list[list[str]] = []
        # systemd's swap units and zram services by name, with their load state.
        self.units: dict[str, str] = {}
        self.systemctl = (
            0,
            "Id=containerd.service\nActiveState=active\nUnitFileState=enabled\n\n"
            "Id=kubelet.service\nActiveState=inactive\nUnitFileState=enabled\n",
        )
        (self.proc / "sys/net/bridge").mkdir(parents=True)
        (self.proc / "sys/net/ipv4").mkdir(parents=True)
        self.set_swap(["/swapfile"])
        (self.proc / "modules").write_text("overlay 155648 0 - Live 0x0000000000000000\n")
        self.set_sysctl("net.bridge.bridge-nf-call-iptables", "0")
        self.set_sysctl("net.ipv4.ip_forward", "0")
        (root / "etc").mkdir()
        (root / "etc/fstab").write_text(FSTAB)

    def set_swap(self, active: list[str]) -> None:
        (self.proc / "swaps").write_text(SWAPS_HEADER + "".join(f"{name}\tfile\t1024\t0\t-2\n" for name in active))

    def set_sysctl(self, key: str, value: str) -> None:
        (self.proc / "sys" / key.replace(".", "/")).write_text(value + "\n")

    def sysctl(self, key: str) -> str:
        return (self.proc / "sys" / key.replace(".", "/")).read_text().strip()

    def loaded(self) -> list[str]:
        return [line.split()[0] for line in (self.proc / "modules").read_text().splitlines()]

    def unload(self, name: str) -> None:
        (self.proc / "modules").write_text(
            "".join(f"{line}\n" for line in (self.proc / "modules").read_text().splitlines() if line.split()[0] != name)
        )

    def run(self, argv: list[str]) -> tuple[int, str, str]:
        self.commands.append(argv)
        if argv == ["swapoff", "--all"]:
            self.set_swap([])
            return 0, "", ""
        if argv[0] == "modprobe":
            with open(self.proc / "modules", "a", encoding="utf-8") as handle:
                handle.write(f"{argv[1]} 36864 0 - Live 0x0000000000000000\n")
            return 0, "", ""
        if argv[:2] == ["systemctl", "list-units"]:
            self.commands.pop()
            self.queries.append(argv)
            swaps = [name for name in self.units if name.endswith(".swap")]
            # A failed unit's line starts with a bullet, as systemctl prints it.
            return (
                0,
                "".join(
                    f"● {name} {self.units[name]} failed failed Swap\n"
                    if name == "dev-sdb.swap"
                    else f"{name} {self.units[name]} active active Swap\n"
                    for name in swaps
                ),
                "",
            )
        if argv[:3] == ["systemctl", "show", "--property=Id,LoadState"]:
            self.commands.pop()
            self.queries.append(argv)
            names = argv[4:]
            return 0, "\n".join(f"Id={name}\nLoadState={self.units.get(name, 'not-found')}\n" for name in names), ""
        if argv[:3] == ["systemctl", "mask", "--"]:
            for name in argv[3:]:
                self.units[name] = "masked"
            return 0, "", ""
        if argv[0] == "systemctl":
            return self.systemctl[0], self.systemctl[1], ""
        return NodeState._run_command(None, argv)

    def args(self, **extra) -> dict:
        return {
            "swap_off": True,
            "fstab": str(self.root / "etc/fstab"),
            "kernel_modules": ["overlay", "br_netfilter"],
            "modules_load_file": str(self.root / "etc/modules-load.d/kubernetes.conf"),
            "sysctls": SYSCTLS,
            "sysctl_file": str(self.root / "etc/sysctl.d/zz-confidential-kubernetes.conf"),
            "sysctl_dirs": [str(self.root / "etc/sysctl.d"), str(self.root / "usr/lib/sysctl.d")],
            **extra,
        }


@pytest.fixture
def node(tmp_path, monkeypatch) -> Node:
    fake = Node(tmp_path)

    class OnTheFakeNode(NodeState):
        def __init__(self, check_mode: bool = False):
            super().__init__(check_mode=check_mode, proc=str(fake.proc), root=str(fake.root))

        def _run_command(self, argv):
            return fake.run(argv)

    monkeypatch.setattr(node_state, "NodeState", OnTheFakeNode)
    return fake


def run_module(args: dict, outcome=AnsibleExitJson) -> dict:
    with patch_module_args(args), pytest.raises(outcome) as raised:
        node_state.main()
    return raised.value.args[0]


def test_check_mode_reports_every_step_and_changes_nothing(node):
    result = run_module({**node.args(), "_ansible_check_mode": True, "_ansible_diff": True})
    assert result["changed"] is True
    assert result["changes"] == [
        "swapoff --all (active: /swapfile)",
        f"comment out 1 swap line(s) in {node.root}/etc/fstab",
        f"write {node.root}/etc/modules-load.d/kubernetes.conf",
        "modprobe br_netfilter",
        f"write {node.root}/etc/sysctl.d/zz-confidential-kubernetes.conf",
        "sysctl net.bridge.bridge-nf-call-iptables = 1 (was 0)",
        "sysctl net.ipv4.ip_forward = 1 (was 0)",
    ]
    fstab_diff = next(d for d in result["diff"] if d["after_header"].endswith("fstab"))
    assert fstab_diff["before"] == FSTAB and "\n# /swapfile none swap sw 0 0\n#/old none swap" in fstab_diff["after"]
    assert node.commands == [] and (node.root / "etc/fstab").read_text() == FSTAB
    assert not (node.root / "etc/modules-load.d").exists() and not (node.root / "etc/sysctl.d").exists()
    assert node.sysctl("net.ipv4.ip_forward") == "0"


def test_prepare_then_nothing_to_do(node):
    result = run_module(node.args())
    assert result["changed"] is True and len(result["changes"]) == 7 and "diff" not in result
    assert node.commands == [["swapoff", "--all"], ["modprobe", "br_netfilter"]]
    assert (node.root / "etc/fstab").read_text() == FSTAB.replace("\n/swapfile", "\n# /swapfile")
    modules_load = node.root / "etc/modules-load.d/kubernetes.conf"
    assert modules_load.read_text() == "overlay\nbr_netfilter\n" and modules_load.stat().st_mode & 0o7777 == 0o644
    sysctl_file = node.root / "etc/sysctl.d/zz-confidential-kubernetes.conf"
    assert sysctl_file.read_text() == "net.bridge.bridge-nf-call-iptables = 1\nnet.ipv4.ip_forward = 1\n"
    assert sysctl_file.stat().st_mode & 0o7777 == 0o644
    assert node.sysctl("net.ipv4.ip_forward") == "1" and node.sysctl("net.bridge.bridge-nf-call-iptables") == "1"

    node.commands.clear()
    again = run_module(node.args())
    assert again["changed"] is False and again["changes"] == [] and node.commands == []


@pytest.mark.parametrize(
    "drift,expected",
    [
        ("swap turned back on", ["swapoff --all (active: /dev/vda2)"]),
        ("fstab swap line back", ["comment out 1 swap line(s) in {root}/etc/fstab"]),
        ("module unloaded", ["modprobe br_netfilter"]),
        ("sysctl reset", ["sysctl net.ipv4.ip_forward = 1 (was 0)"]),
        ("sysctl file edited", ["write {root}/etc/sysctl.d/zz-confidential-kubernetes.conf"]),
        ("modules file mode", ["write {root}/etc/modules-load.d/kubernetes.conf"]),
    ],
)
def test_each_drift_is_found_and_fixed_alone(node, drift, expected):
    run_module(node.args())
    if drift == "swap turned back on":
        node.set_swap(["/dev/vda2"])
    elif drift == "fstab swap line back":
        with open(node.root / "etc/fstab", "a", encoding="utf-8") as handle:
            handle.write("UUID=abcd none swap sw\n")
    elif drift == "module unloaded":
        node.unload("br_netfilter")
    elif drift == "sysctl reset":
        node.set_sysctl("net.ipv4.ip_forward", "0")
    elif drift == "sysctl file edited":
        (node.root / "etc/sysctl.d/zz-confidential-kubernetes.conf").write_text("net.ipv4.ip_forward = 0\n")
    else:
        (node.root / "etc/modules-load.d/kubernetes.conf").chmod(0o600)
    expected = [change.format(root=node.root) for change in expected]

    checked = run_module({**node.args(), "_ansible_check_mode": True})
    assert checked["changed"] is True and checked["changes"] == expected
    fixed = run_module(node.args())
    assert fixed["changed"] is True and fixed["changes"] == expected
    assert run_module(node.args())["changed"] is False
    assert "br_netfilter" in node.loaded() and node.sysctl("net.ipv4.ip_forward") == "1"


def test_sysctl_values_compare_with_whitespace_collapsed(node):
    node.set_sysctl("net.ipv4.ip_local_port_range", "32768\t60999")
    args = node.args(sysctls={"net.ipv4.ip_local_port_range": "32768 60999"}, swap_off=False, kernel_modules=[])
    (node.root / "etc/sysctl.d").mkdir(parents=True)
    (node.root / "etc/sysctl.d/zz-confidential-kubernetes.conf").write_text(
        "net.ipv4.ip_local_port_range = 32768 60999\n"
    )
    (node.root / "etc/sysctl.d/zz-confidential-kubernetes.conf").chmod(0o644)
    assert run_module(args)["changes"] == []


def test_nothing_asked_changes_nothing_and_still_reports(node):
    result = run_module({"services": ["containerd", "kubelet"], "tools": ["sh", "no-such-tool-anywhere"]})
    assert result["changed"] is False and result["changes"] == [] and result["architecture"] == os.uname().machine
    assert result["services"] == {
        "containerd": {"active": True, "enabled": True},
        "kubelet": {"active": False, "enabled": True},
    }
    assert result["tools"]["sh"].endswith("/sh") and result["tools"]["no-such-tool-anywhere"] is None
    assert node.commands == [
        ["systemctl", "show", "--property=Id,ActiveState,UnitFileState", "--", "containerd", "kubelet"]
    ]
    assert (node.root / "etc/fstab").read_text() == FSTAB and node.sysctl("net.ipv4.ip_forward") == "0"


def test_services_are_unknown_where_systemd_cannot_say(node):
    node.systemctl = (1, "", "System has not been booted with systemd")
    result = run_module({"services": ["containerd"]})
    assert result["services"] == {"containerd": {"active": False, "enabled": False}}


def _stamp(tmp_path: Path, name: str, files: dict[str, bytes]) -> Path:
    lines = []
    for file_name, content in files.items():
        path = tmp_path / file_name
        path.write_bytes(content)
        lines.append(f"{hashlib.sha256(content).hexdigest()}  {path}\n")
    stamp = tmp_path / f"installed-{name}.sha256"
    stamp.write_text("".join(lines))
    return stamp


def test_stamps_verify_until_a_listed_file_changes_or_goes(node, tmp_path):
    good = _stamp(tmp_path, "a", {"kubeadm": b"kubeadm", "kubelet": b"kubelet"})
    other = _stamp(tmp_path, "b", {"helm": b"helm"})
    pattern = str(tmp_path / "installed-*.sha256")
    assert run_module({"stamps": pattern})["stamps"] == {str(good): True, str(other): True}

    (tmp_path / "kubelet").write_bytes(b"tampered")
    (tmp_path / "helm").unlink()
    assert run_module({"stamps": pattern})["stamps"] == {str(good): False, str(other): False}

    (tmp_path / "kubelet").write_bytes(b"kubelet")
    good.write_text(good.read_text() + "not a checksum line\n")
    assert run_module({"stamps": pattern})["stamps"][str(good)] is False
    good.write_text("")
    assert run_module({"stamps": pattern})["stamps"][str(good)] is False
    assert run_module({"stamps": str(tmp_path / "none-*.sha256")})["stamps"] == {}


@pytest.fixture
def settled_soon(monkeypatch):
    """A fingerprint can be trusted 50 ms after its file's last change (a second by default; the kernel's tick is
    at most 10 ms on the filesystems the tests use), so that writing a stamp waits 50 ms, not a second."""
    monkeypatch.setattr(_files, "SETTLED_NS", 50_000_000)


def _installed(tmp_path: Path) -> tuple[dict, list[str]]:
    files = {"kubeadm": (b"kubeadm binary", 0o755), "kubelet": (b"kubelet binary", 0o755), "unit": (b"[Unit]\n", 0o644)}
    for name, (content, mode) in files.items():
        (tmp_path / name).write_bytes(content)
        (tmp_path / name).chmod(mode)
    return {
        "stamp_dest": str(tmp_path / "staging/installed-abc.sha256"),
        "stamp_files": [str(tmp_path / n) for n in files],
    }, [str(tmp_path / n) for n in files]


def test_a_written_stamp_verifies_reading_no_file_until_one_changes(node, tmp_path, settled_soon, count_file_hashes):
    args, paths = _installed(tmp_path)
    written = run_module(args)
    stamp = Path(args["stamp_dest"])
    assert written["changed"] is True and written["changes"] == [f"write {stamp}"]
    assert stamp.stat().st_mode & 0o7777 == 0o644
    lines = stamp.read_text().splitlines()
    for path in paths:
        status = os.stat(path)
        assert (
            f"#stat {status.st_mode & 0o7777:04o} {status.st_ino} {status.st_size} {status.st_mtime_ns} "
            f"{status.st_ctime_ns} {path}" in lines
        )
        assert f"{hashlib.sha256(Path(path).read_bytes()).hexdigest()}  {path}" in lines
    if shutil.which("sha256sum"):
        assert subprocess.run(["sha256sum", "--check", "--strict", "--quiet", str(stamp)], check=False).returncode == 0
    assert run_module(args)["changed"] is False

    reads = count_file_hashes()
    pattern = str(tmp_path / "staging/installed-*.sha256")
    assert run_module({"stamps": pattern})["stamps"] == {str(stamp): True}
    assert reads.count == 0

    # A chmod moves the ctime: the file is hashed again, and verifies once its mode is the recorded one again.
    os.chmod(paths[0], 0o644)
    assert run_module({"stamps": pattern})["stamps"] == {str(stamp): False}
    os.chmod(paths[0], 0o755)
    assert run_module({"stamps": pattern})["stamps"] == {str(stamp): True}
    assert reads.count == 2


def _keep_size_and_mtime(path: str, content: bytes) -> None:
    before = os.stat(path)
    with open(path, "r+b") as handle:
        handle.write(content)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(path).st_size == before.st_size and os.stat(path).st_mtime_ns == before.st_mtime_ns


def _replace_keeping_size_and_mtime(path: str, content: bytes) -> None:
    before = os.stat(path)
    Path(path + ".new").write_bytes(content)
    os.chmod(path + ".new", before.st_mode & 0o7777)
    os.utime(path + ".new", ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(path + ".new", path)


@pytest.mark.parametrize(
    "change",
    [
        lambda path: _keep_size_and_mtime(path, b"KUBEADM binary"),
        lambda path: _replace_keeping_size_and_mtime(path, b"KUBEADM binary"),
        lambda path: os.truncate(path, 3),
        os.unlink,
        lambda path: (os.unlink(path), os.mkfifo(path)),
    ],
    ids=[
        "content changed keeping size and mtime",
        "replaced keeping size and mtime",
        "truncated",
        "removed",
        "a FIFO in its place",
    ],
)
def test_a_changed_file_is_found_although_the_stamp_fingerprinted_it(node, tmp_path, settled_soon, change):
    args, paths = _installed(tmp_path)
    run_module(args)
    pattern = str(tmp_path / "staging/installed-*.sha256")
    change(paths[0])
    assert run_module({"stamps": pattern})["stamps"] == {args["stamp_dest"]: False}


def test_a_file_too_new_to_trust_is_stamped_without_a_fingerprint_and_hashed(
    node, tmp_path, monkeypatch, count_file_hashes
):
    args, paths = _installed(tmp_path)
    # The stamp waits at most SETTLED_NS for the files to settle; an hour from now they have not.
    monkeypatch.setattr(_files, "SETTLED_NS", 3600 * 10**9)
    monkeypatch.setattr(_files.time, "sleep", lambda seconds: None)
    run_module(args)
    text = Path(args["stamp_dest"]).read_text()
    assert "#stat" not in text.replace("A #stat line", "")
    reads = count_file_hashes()
    assert run_module({"stamps": str(tmp_path / "staging/installed-*.sha256")})["stamps"] == {args["stamp_dest"]: True}
    assert reads.count == len(paths)


def _installed_with_a_directory(tmp_path: Path) -> dict:
    """An install that makes a directory (0700), writes a file in it and removed a file beside it."""
    args, paths = _installed(tmp_path)
    (tmp_path / "conf").mkdir(mode=0o700)
    (tmp_path / "conf" / "join.yml").write_text("endpoints: []\n")
    return {
        **args,
        "stamp_files": [str(tmp_path / "conf"), *paths, str(tmp_path / "conf" / "join.yml")],
        "stamp_absent": [str(tmp_path / "removed.conf")],
    }


def test_a_stamp_records_a_directorys_mode_and_a_removed_file(node, tmp_path, settled_soon):
    args = _installed_with_a_directory(tmp_path)
    assert run_module(args)["changed"] is True
    lines = Path(args["stamp_dest"]).read_text().splitlines()
    assert f"#dir 0700 {tmp_path / 'conf'}" in lines and f"#absent {tmp_path / 'removed.conf'}" in lines
    if shutil.which("sha256sum"):
        check = ["sha256sum", "--check", "--strict", "--quiet", args["stamp_dest"]]
        assert subprocess.run(check, check=False).returncode == 0
    assert run_module(args)["changed"] is False
    pattern = str(tmp_path / "staging/installed-*.sha256")
    assert run_module({"stamps": pattern})["stamps"] == {args["stamp_dest"]: True}


@pytest.mark.parametrize(
    "change",
    [
        lambda root: os.chmod(root / "conf", 0o755),
        lambda root: (shutil.rmtree(root / "conf"), (root / "conf").write_text("")),
        lambda root: (root / "removed.conf").write_text("[Unit]\n"),
        lambda root: (root / "removed.conf").symlink_to(root / "nowhere"),
    ],
    ids=["directory mode changed", "a file in the directory's place", "removed file back", "dangling link there"],
)
def test_a_stamp_fails_when_a_directory_or_a_removed_file_drifts(node, tmp_path, settled_soon, change):
    args = _installed_with_a_directory(tmp_path)
    run_module(args)
    change(tmp_path)
    assert run_module({"stamps": str(tmp_path / "staging/installed-*.sha256")})["stamps"] == {args["stamp_dest"]: False}


def test_a_removed_file_that_exists_cannot_be_stamped(node, tmp_path, settled_soon):
    args = _installed_with_a_directory(tmp_path)
    (tmp_path / "removed.conf").write_text("")
    assert run_module({**args, "_ansible_check_mode": True})["changes"] == [f"write {args['stamp_dest']}"]
    failed = run_module(args, AnsibleFailJson)
    assert failed["msg"] == f"cannot stamp {tmp_path / 'removed.conf'} as absent: it exists"
    assert not Path(args["stamp_dest"]).exists()


def test_a_stamp_of_an_older_version_verifies_by_hashing_every_file(node, tmp_path, count_file_hashes):
    old = _stamp(tmp_path, "old", {"kubeadm": b"kubeadm", "kubelet": b"kubelet"})
    pattern = str(tmp_path / "installed-*.sha256")
    reads = count_file_hashes()
    assert run_module({"stamps": pattern})["stamps"] == {str(old): True} and reads.count == 2
    _keep_size_and_mtime(str(tmp_path / "kubelet"), b"KUBELET")
    assert run_module({"stamps": pattern})["stamps"] == {str(old): False}


def test_stamping_in_check_mode_writes_nothing(node, tmp_path, settled_soon):
    args, paths = _installed(tmp_path)
    checked = run_module({**args, "_ansible_check_mode": True})
    assert checked["changed"] is True and checked["changes"] == [f"write {args['stamp_dest']}"]
    assert not Path(args["stamp_dest"]).exists()
    # In check mode the install has not written its files yet: the stamp would change, nothing fails.
    os.unlink(paths[1])
    missing = run_module({**args, "_ansible_check_mode": True})
    assert missing["changed"] is True and not Path(args["stamp_dest"]).exists()


@pytest.mark.parametrize(
    "case,expected",
    [
        ("missing file", "cannot stamp {root}/kubelet: No such file or directory"),
        ("newline", "cannot stamp '{root}/a\\nb': sha256sum's format holds no newline or backslash in a file name"),
        ("no files", "a stamp of no files never verifies; name the installed files"),
        ("files alone", "parameters are required together: stamp_dest, stamp_files"),
    ],
)
def test_a_stamp_that_cannot_be_written_fails_naming_why(node, tmp_path, case, expected):
    args, paths = _installed(tmp_path)
    if case == "missing file":
        os.unlink(paths[1])
    args = {
        "missing file": args,
        "newline": {**args, "stamp_files": [str(tmp_path / "a\nb")]},
        "no files": {**args, "stamp_files": []},
        "files alone": {"stamp_files": paths},
    }[case]
    for check_mode in (True, False) if case != "missing file" else (False,):
        failed = run_module({**args, "_ansible_check_mode": check_mode}, AnsibleFailJson)
        assert failed["msg"] == expected.format(root=tmp_path)
    assert not (tmp_path / "staging").exists()


def _archive(path: Path, members: dict[str, tuple[bytes, int]]) -> str:
    with tarfile.open(path, "w") as archive:
        for name, (content, mode) in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(content), mode
            archive.addfile(info, io.BytesIO(content))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_archive_is_current_and_unpacked_until_its_tree_or_copy_changes(node, tmp_path):
    archive, dest = tmp_path / "lib.tar", tmp_path / "lib"
    digest = _archive(archive, {"pkg/__init__.py": (b"", 0o644), "pkg/run.py": (b"print('run')\n", 0o755)})
    args = {"archive": str(archive), "archive_dest": str(dest), "archive_sha256": digest}
    assert run_module(args)["archive"] == {"sha256": digest, "current": True, "unpacked": False}

    with tarfile.open(archive) as unpack:
        unpack.extractall(dest)
    assert run_module(args)["archive"] == {"sha256": digest, "current": True, "unpacked": True}
    assert run_module({**args, "archive_sha256": "0" * 64})["archive"]["current"] is False

    (dest / "pkg/run.py").write_bytes(b"print('RUN')\n")
    assert run_module(args)["archive"]["unpacked"] is False
    (dest / "pkg/run.py").write_bytes(b"print('run')\n")
    (dest / "pkg/run.py").chmod(0o644)
    assert run_module(args)["archive"]["unpacked"] is False
    (dest / "pkg/run.py").chmod(0o755)
    (dest / "pkg/__init__.py").unlink()
    assert run_module(args)["archive"]["unpacked"] is False
    archive.unlink()
    assert run_module(args)["archive"] == {"sha256": None, "current": False, "unpacked": False}


def test_venv_is_complete_when_its_python_imports_everything(node, tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin/python").symlink_to(sys.executable)
    complete = run_module({"venv": str(venv), "venv_imports": ["json", "email.mime.text"]})
    assert complete["venv"] == {"path": str(venv), "complete": True, "error": None}

    incomplete = run_module({"venv": str(venv), "venv_imports": ["json", "no_such_module_here"]})
    assert incomplete["venv"]["complete"] is False
    assert incomplete["venv"]["error"] == "ModuleNotFoundError: No module named 'no_such_module_here'"

    missing = run_module({"venv": str(tmp_path / "absent"), "venv_imports": ["json"]})
    assert missing["venv"]["complete"] is False and missing["venv"]["error"].endswith("/absent/bin/python: not found")


@pytest.mark.parametrize(
    "case,expected",
    [
        ("module name", "kernel module name 'br netfilter' is not a module name"),
        ("sysctl key", "sysctl key 'net.ipv4.ip_forward=1' is not a sysctl name"),
        ("sysctl value", "sysctl net.ipv4.ip_forward has no value"),
        ("archive digest", "archive_sha256 must be 64 lower-case hexadecimal digits, not 'ABC'"),
        ("archive alone", "parameters are required together: archive, archive_dest, archive_sha256"),
    ],
)
def test_bad_input_is_a_clear_error_and_changes_nothing(node, tmp_path, case, expected):
    args = {
        "module name": node.args(kernel_modules=["br netfilter"]),
        "sysctl key": node.args(sysctls={"net.ipv4.ip_forward=1": 1}),
        "sysctl value": node.args(sysctls={"net.ipv4.ip_forward": " "}),
        "archive digest": {
            **node.args(),
            "archive": str(tmp_path / "a.tar"),
            "archive_dest": str(tmp_path),
            "archive_sha256": "ABC",
        },
        "archive alone": {**node.args(), "archive": str(tmp_path / "a.tar")},
    }[case]
    failed = run_module(args, AnsibleFailJson)
    assert expected in failed["msg"]
    assert (
        node.commands == []
        and (node.root / "etc/fstab").read_text() == FSTAB
        and node.sysctl("net.ipv4.ip_forward") == "0"
    )
    assert not (node.root / "etc/modules-load.d").exists() and not (node.root / "etc/sysctl.d").exists()


def test_a_host_without_proc_modules_fails_naming_the_switch(node):
    (node.proc / "modules").unlink()
    failed = run_module(node.args(swap_off=False), AnsibleFailJson)
    assert failed["msg"] == (
        f"this host has no {node.proc}/modules (a container?), so the kernel modules cannot be "
        "checked; switch that step off for it"
    )


def test_a_sysctl_the_host_lacks_fails_naming_it(node):
    failed = run_module(
        node.args(swap_off=False, kernel_modules=[], sysctls={"net.netfilter.nf_conntrack_max": 131072}),
        AnsibleFailJson,
    )
    assert failed["msg"] == (
        "sysctl net.netfilter.nf_conntrack_max: this host has no such key "
        "(is the kernel module that provides it loaded?)"
    )


def test_a_failing_modprobe_still_reports_what_changed_before_it(node, monkeypatch):
    played = node.run

    def modprobe_fails(argv):
        if argv[0] == "modprobe":
            node.commands.append(argv)
            return 1, "", "modprobe: FATAL: Module br_netfilter not found in directory /lib/modules/6.1.0"
        return played(argv)

    monkeypatch.setattr(node, "run", modprobe_fails)
    failed = run_module(node.args(), AnsibleFailJson)
    assert failed["msg"] == (
        "modprobe br_netfilter failed (exit 1): "
        "modprobe: FATAL: Module br_netfilter not found in directory /lib/modules/6.1.0"
    )
    assert failed["changed"] is True
    assert failed["changes"] == [
        "swapoff --all (active: /swapfile)",
        f"comment out 1 swap line(s) in {node.root}/etc/fstab",
        f"write {node.root}/etc/modules-load.d/kubernetes.conf",
        "modprobe br_netfilter",
    ]
    assert node.sysctl("net.ipv4.ip_forward") == "0"


def test_packages_are_read_from_the_real_dpkg_and_nothing_is_installed(node):
    """This machine's dpkg: coreutils is installed, a made-up package is not; the probe only reads."""
    if shutil.which("dpkg-query") is None:
        pytest.skip("no dpkg on this machine")
    result = run_module(
        {"packages": ["coreutils", "confidential-kubernetes-no-such-package"], "_ansible_check_mode": True}
    )
    assert result["packages"] == {"coreutils": True, "confidential-kubernetes-no-such-package": False}
    assert result["changed"] is False
    assert node.commands[0][:2] == ["dpkg-query", "--show"] and len(node.commands) == 1


def test_no_packages_asked_runs_no_dpkg(node):
    assert run_module({})["packages"] == {}
    assert node.commands == []


def test_a_package_name_that_is_not_one_is_refused(node):
    result = run_module({"packages": ["iptables", "--admindir=/tmp"]}, AnsibleFailJson)
    assert result["msg"] == "not Debian package names: --admindir=/tmp"
    assert node.commands == []


def test_swap_units_and_zram_are_masked_so_that_swap_stays_off_after_a_reboot(node):
    """fstab's swap unit, a zram service and systemd's zram-generator would turn swap on again at the next boot."""
    node.units = {
        "dev-vda2.swap": "loaded",
        "swapfile.swap": "masked",
        "dev-sdb.swap": "not-found",
        "zramswap.service": "loaded",
    }
    generator = node.root / "usr/lib/systemd/system-generators/zram-generator"
    generator.parent.mkdir(parents=True)
    generator.write_text("")
    mask = node.root / "etc/systemd/system-generators/zram-generator"
    args = node.args(kernel_modules=[], sysctls={})
    expected = [
        "swapoff --all (active: /swapfile)",
        f"comment out 1 swap line(s) in {node.root}/etc/fstab",
        "systemctl mask dev-vda2.swap zramswap.service",
        f"mask the zram generator ({mask} -> /dev/null)",
    ]

    checked = run_module({**args, "_ansible_check_mode": True})
    assert checked["changes"] == expected and node.commands == [] and not os.path.lexists(mask)
    done = run_module(args)
    assert done["changes"] == expected
    assert node.commands == [["swapoff", "--all"], ["systemctl", "mask", "--", "dev-vda2.swap", "zramswap.service"]]
    assert os.readlink(mask) == "/dev/null"
    assert set(node.units.values()) == {"masked", "not-found"}
    node.commands.clear()
    assert run_module(args)["changed"] is False and node.commands == []

    # Swap on again from a unit nobody masked (a zram device set up by hand): the probe sees it, the fix turns it off.
    node.units["dev-zram0.swap"] = "loaded"
    node.set_swap(["/dev/zram0"])
    again = ["swapoff --all (active: /dev/zram0)", "systemctl mask dev-zram0.swap"]
    assert run_module({**args, "_ansible_check_mode": True})["changes"] == again
    assert run_module(args)["changes"] == again and node.units["dev-zram0.swap"] == "masked"


@pytest.mark.parametrize(
    "systemctl", [(127, "systemctl: not found"), (1, "System has not been booted with systemd as init system (PID 1).")]
)
def test_a_host_where_systemd_cannot_say_has_no_swap_units_to_mask(node, monkeypatch, systemctl):
    played = node.run

    def no_systemctl(argv):
        if argv[0] == "systemctl":
            return systemctl[0], "", systemctl[1]
        return played(argv)

    monkeypatch.setattr(node, "run", no_systemctl)
    done = run_module(node.args(kernel_modules=[], sysctls={}))
    assert done["changes"] == [
        "swapoff --all (active: /swapfile)",
        f"comment out 1 swap line(s) in {node.root}/etc/fstab",
    ]


def test_the_sysctl_file_replaces_the_earlier_one_and_sorts_after_sysctl_conf(node):
    sysctl_d = node.root / "etc/sysctl.d"
    sysctl_d.mkdir(parents=True)
    earlier = sysctl_d / "99-kubernetes.conf"
    earlier.write_text("net.ipv4.ip_forward = 1\n")
    # Debian's link to /etc/sysctl.conf: sorts before the collection's file, so it no longer wins at boot.
    (node.root / "etc/sysctl.conf").write_text("net.ipv4.ip_forward = 0\n")
    (sysctl_d / "99-sysctl.conf").symlink_to("../sysctl.conf")
    args = node.args(swap_off=False, kernel_modules=[], sysctl_files_replaced=[str(earlier)])

    done = run_module(args)
    assert f"remove {earlier}" in done["changes"] and not earlier.exists()
    assert node.sysctl("net.ipv4.ip_forward") == "1"
    assert run_module(args)["changed"] is False


@pytest.mark.parametrize(
    "where,line",
    [
        ("usr/lib/sysctl.d/zzz-local.conf", "net.ipv4.ip_forward = 0"),
        ("etc/sysctl.d/zzzz-tuning.conf", "-net/ipv4/ip_forward=0"),
    ],
)
def test_a_sysctl_a_later_file_overrides_fails_naming_the_key_the_value_and_the_file(node, where, line):
    override = node.root / where
    override.parent.mkdir(parents=True, exist_ok=True)
    override.write_text(f"# local tuning\n{line}\n")
    failed = run_module(node.args(swap_off=False, kernel_modules=[]), AnsibleFailJson)
    assert f"net.ipv4.ip_forward = 0 in {override}, which the boot applies after" in failed["msg"]
    assert "net.bridge.bridge-nf-call-iptables" not in failed["msg"]


def test_a_file_of_the_same_name_in_etc_hides_the_one_in_usr_lib(node):
    for directory, value in (("usr/lib/sysctl.d", "0"), ("etc/sysctl.d", "1")):
        (node.root / directory).mkdir(parents=True, exist_ok=True)
        (node.root / directory / "zzz-local.conf").write_text(f"net.ipv4.ip_forward = {value}\n")
    assert run_module(node.args(swap_off=False, kernel_modules=[]))["changed"] is True


def test_a_sysctl_the_kernel_does_not_take_fails_naming_its_value_there(node, monkeypatch):
    monkeypatch.setattr(NodeState, "sysctl", lambda self, key: "0" if key == "net.ipv4.ip_forward" else "1")
    failed = run_module(node.args(swap_off=False, kernel_modules=[]), AnsibleFailJson)
    assert failed["msg"].startswith(
        "sysctls that do not take the value kubeadm's preflight needs: net.ipv4.ip_forward is 0 in "
        f"{node.proc}/sys/net/ipv4/ip_forward, not 1 (the kernel did not keep it, or something set it at run time: no other sysctl.d file sets it)"
    )
