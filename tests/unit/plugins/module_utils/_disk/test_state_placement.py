"""The node's cluster state bound from the mounted state disk: real bind mounts, on temporary directories (needs root)."""

from __future__ import annotations

import os
import subprocess

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._disk import StateDiskError
from ansible_collections.confidential.kubernetes.plugins.module_utils._disk.placement import (
    CLUSTER_STATE_PATHS,
    disk_side,
    is_placed,
    place_cluster_state,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="bind mounts need root")


def mounted_under(root: str) -> list[str]:
    """Mount points below ``root``, deepest first, read from the kernel (independent of the code under test)."""
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        points = [line.split()[4] for line in handle]
    return sorted((p for p in points if p.startswith(root + os.sep)), key=len, reverse=True)


@pytest.fixture
def host(tmp_path):
    """A disk mount point and a root with the four directories' parents; every bind is undone afterwards."""
    root = tmp_path / "root"
    disk = tmp_path / "disk"
    root.mkdir()
    disk.mkdir()
    yield str(root), str(disk)
    for point in mounted_under(str(tmp_path)):
        subprocess.run(["umount", point], check=True)


def paths_in(root: str) -> tuple[str, ...]:
    return tuple(root + path for path in CLUSTER_STATE_PATHS)


def test_first_use_copies_what_is_there_binds_it_and_a_rerun_changes_nothing(host):
    root, disk = host
    etc = root + "/etc/kubernetes"
    os.makedirs(etc + "/pki")
    with open(etc + "/pki/ca.crt", "w") as handle:
        handle.write("ca")
    os.chmod(etc + "/pki", 0o700)
    os.symlink("pki/ca.crt", etc + "/ca-link")

    placed = place_cluster_state(disk, paths_in(root), services=())

    assert placed == list(paths_in(root))
    assert sorted(mounted_under(root)) == sorted(paths_in(root))
    on_disk = disk_side(disk, etc)
    with open(on_disk + "/pki/ca.crt") as handle:
        assert handle.read() == "ca"
    assert os.readlink(on_disk + "/ca-link") == "pki/ca.crt"
    assert os.stat(on_disk + "/pki").st_mode & 0o777 == 0o700
    # What the node writes from now on lands on the disk.
    with open(root + "/var/lib/etcd/member", "w") as handle:
        handle.write("data")
    assert os.path.exists(disk_side(disk, root + "/var/lib/etcd") + "/member")
    assert os.stat(root + "/var/lib/etcd").st_mode & 0o777 == 0o700
    assert all(is_placed(disk, path) for path in paths_in(root))

    assert place_cluster_state(disk, paths_in(root), services=()) == []
    assert sorted(mounted_under(root)) == sorted(paths_in(root))


def test_after_a_reboot_the_disk_side_wins_over_what_the_root_filesystem_holds(host):
    root, disk = host
    etc = root + "/etc/kubernetes"
    os.makedirs(disk_side(disk, etc))
    with open(disk_side(disk, etc) + "/admin.conf", "w") as handle:
        handle.write("from the disk")
    os.makedirs(etc)
    with open(etc + "/stray", "w") as handle:
        handle.write("written before the disk was mounted")

    assert place_cluster_state(disk, (etc,), services=()) == [etc]

    assert sorted(os.listdir(etc)) == ["admin.conf"]


def test_an_interrupted_copy_is_never_taken_for_a_placed_directory(host):
    root, disk = host
    kubelet = root + "/var/lib/kubelet"
    os.makedirs(kubelet)
    with open(kubelet + "/config.yaml", "w") as handle:
        handle.write("kind: KubeletConfiguration")
    os.makedirs(disk_side(disk, kubelet) + ".partial/half")

    place_cluster_state(disk, (kubelet,), services=())

    assert os.listdir(kubelet) == ["config.yaml"]
    assert not os.path.exists(disk_side(disk, kubelet) + ".partial")


def test_another_filesystem_on_a_path_is_refused_and_nothing_is_bound(host, tmp_path):
    root, disk = host
    paths = paths_in(root)
    other = tmp_path / "other"
    other.mkdir()
    os.makedirs(paths[1])
    subprocess.run(["mount", "--bind", str(other), paths[1]], check=True)

    with pytest.raises(StateDiskError, match=f"{paths[1]} has another filesystem mounted on it, not the state disk's"):
        place_cluster_state(disk, paths, services=())

    assert mounted_under(root) == [paths[1]]
    assert os.listdir(disk) == []


def test_a_file_where_a_directory_belongs_is_refused(host):
    root, disk = host
    os.makedirs(root + "/var/lib")
    open(root + "/var/lib/etcd", "w").close()
    with pytest.raises(StateDiskError, match="/var/lib/etcd is not a directory"):
        place_cluster_state(disk, paths_in(root), services=())
    assert mounted_under(root) == []


def test_check_mode_reports_what_would_be_bound_and_binds_nothing(host):
    root, disk = host
    assert place_cluster_state(disk, paths_in(root), services=(), check_mode=True) == list(paths_in(root))
    assert mounted_under(root) == [] and os.listdir(disk) == []
