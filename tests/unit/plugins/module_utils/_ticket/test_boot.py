"""The node side of a join (NodeJoin) and the boot-time join CLI, against an in-process join service (real TLS, real swtpm,
real cryptsetup on a file); kubeadm is a recording stand-in behind the Kubeadm runner seam."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess

import pytest
import yaml


from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.issuer import Tpm
from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.policy import node_lock_mark
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto import derive
from ansible_collections.confidential.kubernetes.plugins.module_utils._disk import luks
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.log import StructuredLog
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.tokens import TOKEN_PATTERN
from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm import Kubeadm
from ansible_collections.confidential.kubernetes.plugins.module_utils._nodelock import NodeLock, NodeLockError
from ansible_collections.confidential.kubernetes.plugins.module_utils._ticket import TicketError, boot
from ansible_collections.confidential.kubernetes.plugins.module_utils._ticket.join import (
    FRESH,
    MEMBER,
    PENDING,
    REBOOTED,
    JoinSettings,
    NodeJoin,
)

FAST_PBKDF = {"pbkdf_memory": 32768, "pbkdf_iterations": 4}


class RecordingKubeadm(Kubeadm):
    """kubeadm behind the runner seam: version, config validate and join (which writes kubelet.conf, as kubeadm does)."""

    def __init__(self, root: str):
        super().__init__("kubeadm", root)
        self.calls: list[list[str]] = []
        self.configs: list[str] = []

    def _run_command(self, argv, stdin=None):
        self.calls.append(argv)
        if argv[1:] == ["version", "-o", "short"]:
            return 0, "v1.31.4\n", ""
        if argv[1:3] == ["config", "validate"]:
            return 0, "ok\n", ""
        if argv[1] == "join":
            with open(argv[argv.index("--config") + 1], encoding="utf-8") as handle:
                self.configs.append(handle.read())
            os.makedirs(self.path("/etc/kubernetes"), exist_ok=True)
            with open(self.path("/etc/kubernetes/kubelet.conf"), "w", encoding="utf-8") as handle:
                handle.write("kubelet\n")
            return 0, "This node has joined the cluster\n", ""
        return 1, "", f"unexpected {argv}"


class Node:
    """A node's disk, lock record, files and TPM; ``reboot`` swaps in a fresh instance of the same TPM and a new boot ID."""

    def __init__(self, tmp_path, join_lab, service):
        self.dir = tmp_path / "node"
        self.root = self.dir / "root"
        self.root.mkdir(parents=True)
        self.device = self.dir / "state-disk.img"
        with open(self.device, "wb") as handle:
            handle.truncate(32 * 1024 * 1024)
        self.lab = join_lab
        self.tcti = join_lab.swtpm.tcti
        self.boot_id = "boot-1"
        self.settings = JoinSettings(
            endpoints=[service.endpoint],
            cluster_ca=join_lab.ca_pem.decode(),
            node_name="worker-1",
            state_disk=dict(
                device=str(self.device),
                state="formatted",
                name="ck-test",
                mount_path=str(self.dir / "mnt"),
                **FAST_PBKDF,
            ),
            tcti=self.tcti,
            attempts=2,
            timeout=10,
            total_timeout=30,
            token_file=str(self.dir / "run" / "join-token"),
            lock_record=str(self.dir / "lib" / "nodelock.json"),
            join_record=str(self.dir / "etc" / "join.json"),
            secrets_file=str(self.dir / "etc" / "cluster-secrets.json"),
        )
        self.kubeadm = RecordingKubeadm(str(self.root))
        self.log_stream = io.StringIO()
        # Each unit the join starts, with the status file, whether the disk has its key and kubeadm's calls by then.
        self.started: list[tuple[str, str, bool, int]] = []

    def joining(self) -> NodeJoin:
        tcti, boot_id = self.tcti, self.boot_id
        return NodeJoin(
            self.settings,
            NodeLock(lambda: Tpm(tcti), self.settings.lock_record, boot_id=lambda: boot_id),
            str(self.root),
        )

    def config(self) -> boot.BootConfig:
        kubeadm = {
            "binary_path": "kubeadm",
            "ignore_preflight_errors": [],
            "config_api_version": "auto",
            "cri_socket": None,
            "kubelet_extra_args": {},
            "skip_phases": [],
        }
        status_file = str(self.dir / "run" / "boot-status.json")
        return boot.BootConfig(self.settings, kubeadm, None, 6443, status_file=status_file, wait_interval=0.01)

    def status(self) -> dict:
        with open(self.config().status_file, encoding="utf-8") as handle:
            return json.load(handle)

    def start(self, unit: str) -> None:
        joins = sum(1 for call in self.kubeadm.calls if call[1] == "join")
        self.started.append((unit, self.status()["state"], self.key_opens(self.disk_key()), joins))

    def run(self, sleep=None) -> str:
        return boot.run(
            self.config(),
            StructuredLog(self.log_stream),
            self.joining(),
            self.kubeadm,
            start=self.start,
            **({"sleep": sleep} if sleep else {}),
        )

    def reboot(self, start_swtpm) -> None:
        self.settings.tcti = self.tcti = start_swtpm("lab").tcti
        self.boot_id = "boot-2"

    def pcr15(self) -> str:
        with Tpm(self.tcti) as tpm:
            return tpm.read_pcrs("sha256", (15,))[15].hex()

    def disk_key(self) -> bytes:
        uuid = subprocess.run(
            ["cryptsetup", "luksUUID", str(self.device)], capture_output=True, text=True, check=True
        ).stdout.strip()
        return derive.state_disk_key(self.lab.secrets["master_key"], self.lab.secrets["master_salt"], uuid)

    def key_opens(self, key: bytes) -> bool:
        return (
            subprocess.run(
                ["cryptsetup", "open", "--test-passphrase", "--key-file=-", str(self.device)],
                input=key,
                capture_output=True,
                check=False,
            ).returncode
            == 0
        )

    def logs(self) -> list[dict]:
        return [json.loads(line) for line in self.log_stream.getvalue().splitlines()]


@pytest.fixture
def node(tmp_path, join_lab, monkeypatch):
    # The throw-away initial disk key lives on /run on a node; here in the test's own directory.
    monkeypatch.setattr(luks, "INITIAL_KEY_DIR", str(tmp_path / "initial-keys"))
    service = join_lab.start("pcrs-only")
    created = Node(tmp_path, join_lab, service)
    created.service = service
    return created


def _cluster_id(join_lab) -> bytes:
    secret = derive.measurement_secret(join_lab.secrets["master_key"], join_lab.secrets["master_salt"])
    return derive.cluster_id(secret, join_lab.secrets["measurement_salt"])


def test_fresh_node_joins_once_and_is_then_a_member(node, join_lab):
    assert node.joining().state() == FRESH
    assert node.run() == FRESH
    cluster_id = _cluster_id(join_lab)
    assert node.pcr15() == node_lock_mark(cluster_id).hex()
    assert node.key_opens(node.disk_key()) and (node.root / "etc/kubernetes/kubelet.conf").exists()
    assert not os.path.exists(node.settings.token_file), "the token file is deleted after kubeadm join"
    [(name, token)] = node.service.minter.tokens
    assert name == "worker-1" and f"token: {token}" in node.kubeadm.configs[0]
    assert all(token not in " ".join(argv) for argv in node.kubeadm.calls), "the token never reaches kubeadm's argv"
    kubelet_pem = node.root / "var/lib/kubelet/pki/kubelet-client-current.pem"
    assert kubelet_pem.stat().st_mode & 0o777 == 0o600
    assert json.loads(open(node.settings.join_record, encoding="utf-8").read())["cluster_id"] == cluster_id.hex()
    # The next boot (same boot here: PCR 15 still marked) changes nothing and asks for nothing.
    calls = len(node.kubeadm.calls)
    assert node.run() == MEMBER
    assert len(node.service.minter.tokens) == 1 and len(node.kubeadm.calls) == calls
    logs = node.logs()
    assert [entry["event"] for entry in logs] == ["state", "ticket", "kubeadm-join", "state", "done"]
    text = node.log_stream.getvalue()
    assert not TOKEN_PATTERN.search(text) and node.disk_key().hex() not in text


def test_rebooted_member_rejoins_with_no_token_and_no_second_kubeadm_join(node, join_lab, start_swtpm):
    node.run()
    disk_key, calls = node.disk_key(), len(node.kubeadm.calls)
    node.reboot(start_swtpm)
    assert node.pcr15() == "00" * 32
    assert node.joining().state() == REBOOTED
    assert node.run() == REBOOTED
    assert node.pcr15() == node_lock_mark(_cluster_id(join_lab)).hex()
    assert len(node.service.minter.tokens) == 1, "a rejoin mints no bootstrap token"
    assert len(node.kubeadm.calls) == calls, "a rejoin runs no kubeadm"
    assert node.key_opens(disk_key)
    rejoin = node.logs()[-1]
    assert (rejoin["event"], rejoin["result"], rejoin["pcr15_state"], rejoin["state_disk"]["keyed"]) == (
        "rejoin",
        "rejoined",
        "marked",
        True,
    )
    served = [entry for entry in join_lab.logs() if entry["event"] == "rejoin"]
    assert [(entry["result"], entry["node_name"]) for entry in served] == [
        ("challenged", "worker-1"),
        ("issued", "worker-1"),
    ]
    assert node.run() == MEMBER


def test_rebooted_member_whose_kubelet_conf_is_on_the_locked_disk_rejoins(node, join_lab, start_swtpm):
    """After a reboot kubelet.conf is on the state disk, still locked: the root disk's lock and join records decide."""
    node.run()
    kubelet_conf = node.root / "etc/kubernetes/kubelet.conf"
    kept = kubelet_conf.read_bytes()
    kubelet_conf.unlink()
    node.reboot(start_swtpm)
    assert node.joining().state() == REBOOTED
    assert node.run() == REBOOTED
    assert node.pcr15() == node_lock_mark(_cluster_id(join_lab)).hex() and node.status()["state"] == MEMBER
    kubelet_conf.write_bytes(kept)  # the opened disk shows the cluster state again
    assert node.joining().state() == MEMBER


def test_marked_member_whose_mounted_disk_is_not_open_is_judged_before_kubelet_conf(node):
    """A node marked in this boot whose state disk is not mounted (here: no device-mapper at all) is not taken for a
    member because a kubelet.conf is in sight: it rejoins, which opens and mounts the disk, before kubelet.conf
    counts."""
    node.run()
    assert node.joining().state() == MEMBER and (node.root / "etc/kubernetes/kubelet.conf").exists()
    node.settings.state_disk = dict(node.settings.state_disk, state="mounted")
    assert node.joining().state() == REBOOTED


def test_member_with_no_join_service_waits_for_keys_until_recover_makes_it_a_member(node, join_lab, start_swtpm):
    node.run()
    node.reboot(start_swtpm)
    node.service.stop_now()
    seen = []

    def recover_hand_over(_seconds):
        """What recover.yml does while the node waits: the node lock taken again (the disk is formatted only)."""
        seen.append(node.status())
        if len(seen) == 2:
            node.joining().lock.take(_cluster_id(join_lab))

    node.settings.total_timeout = 2
    assert node.run(sleep=recover_hand_over) == REBOOTED
    assert [entry["state"] for entry in seen] == ["waiting-for-keys", "waiting-for-keys"]
    assert seen[0]["since"] == seen[1]["since"] and "no rejoin ticket" in seen[0]["reason"]
    assert node.status()["state"] == MEMBER and node.pcr15() == node_lock_mark(_cluster_id(join_lab)).hex()
    events = [(entry["event"], entry.get("result")) for entry in node.logs()]
    assert events[-3:] == [("state", None), ("wait", "waiting-for-keys"), ("done", "recovered")]
    # The times are the ones waited: the round's (of the budget it had) and the whole wait's.
    wait = next(entry for entry in node.logs() if entry["event"] == "wait")
    assert re.search(r"after 1 attempt\(s\) in \d+\.\d s \(of 2 s allowed\)", wait["msg"]), wait["msg"]
    assert "within" not in wait["msg"] and 0 <= seen[0]["waited_seconds"] <= seen[1]["waited_seconds"]
    assert f"after {wait['waited_seconds']:g} s of waiting (since {seen[0]['since']})" in wait["msg"]


def test_gate_lets_the_kubelet_start_only_for_a_member_or_a_join_under_way(node, start_swtpm, tmp_path, capsys):
    status_file = node.config().status_file
    assert boot.gate(status_file) == boot.EXIT_FAILED and "no status yet" in capsys.readouterr().err
    node.run()
    assert boot.main(["--gate", status_file]) == 0
    node.reboot(start_swtpm)
    node.service.stop_now()
    node.settings.total_timeout = 1

    def check_gate_and_give_up(_seconds):
        assert boot.gate(status_file) == boot.EXIT_FAILED
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        node.run(sleep=check_gate_and_give_up)
    assert "waiting-for-keys" in capsys.readouterr().err


def test_refused_rejoin_does_not_wait(node, join_lab, start_swtpm):
    """Waiting is for a cluster with no join service; a service refusing the node ends the boot-time join at once."""
    node.run()
    node.reboot(start_swtpm)
    with Tpm(node.tcti) as tpm:
        tpm.pcr_event(8, b"another kernel command line")

    def no_wait(_seconds):
        raise AssertionError("a refused node must not wait")

    with pytest.raises(TicketError, match="no rejoin ticket: .*PCR 8|no rejoin ticket: .*pcr-policy"):
        node.run(sleep=no_wait)
    assert node.pcr15() == "00" * 32


def test_tampered_node_gets_no_ticket_and_nothing_changes(node, join_lab):
    with Tpm(node.tcti) as tpm:
        tpm.pcr_event(8, b"another kernel command line")
    with pytest.raises(TicketError, match="no join ticket: .*pcr-policy|no join ticket: .*PCR 8"):
        node.run()
    assert node.service.minter.tokens == []
    assert not os.path.exists(node.settings.lock_record) and not os.path.exists(node.settings.token_file)
    assert node.pcr15() == "00" * 32 and not (node.root / "etc/kubernetes/kubelet.conf").exists()


def test_join_and_rejoin_without_the_cluster_ca_are_refused_and_nothing_changes(node, start_swtpm):
    """The join role asks a node where it stands without the CA; a join or rejoin must not start without it."""
    node.settings.cluster_ca = " \n"
    assert node.joining().state() == FRESH
    with pytest.raises(TicketError, match="cluster_ca is empty: a join needs the cluster CA"):
        node.joining().join()
    assert node.service.minter.tokens == [] and not os.path.exists(node.settings.lock_record)
    assert (
        not node.key_opens(b"")
        and subprocess.run(["cryptsetup", "isLuks", str(node.device)], check=False).returncode != 0
    )
    node.settings.cluster_ca = node.lab.ca_pem.decode()
    node.run()
    node.reboot(start_swtpm)
    node.settings.cluster_ca = ""
    assert node.joining().state() == REBOOTED
    with pytest.raises(TicketError, match="cluster_ca is empty: a rejoin needs the cluster CA"):
        node.joining().rejoin()
    assert node.pcr15() == "00" * 32 and len(node.service.minter.tokens) == 1


def test_ticket_applied_but_kubeadm_join_pending_is_resumed_without_a_new_ticket(node):
    node.joining().join()
    assert node.joining().state() == PENDING
    assert node.run() == PENDING
    assert len(node.service.minter.tokens) == 1 and (node.root / "etc/kubernetes/kubelet.conf").exists()


@pytest.mark.parametrize("left_behind", ["etc/kubernetes/bootstrap-kubelet.conf", "etc/kubernetes/pki/ca.crt"])
def test_kubeadm_join_cut_short_needs_a_reset_and_nothing_runs_again(node, left_behind):
    node.joining().join()
    leftover = node.root / left_behind
    leftover.parent.mkdir(parents=True, exist_ok=True)
    leftover.write_text("written by an interrupted kubeadm join\n")
    calls = len(node.kubeadm.calls)
    with pytest.raises(TicketError, match=f"kubeadm join was interrupted on this node .*{left_behind}.*needs a reset"):
        node.run()
    assert len(node.kubeadm.calls) == calls and len(node.service.minter.tokens) == 1
    assert not (node.root / "etc/kubernetes/kubelet.conf").exists()


def test_member_whose_pcr15_was_reset_without_a_reboot_is_refused(node, start_swtpm):
    node.run()
    node.settings.tcti = node.tcti = start_swtpm("lab").tcti  # a TPM reset while the boot ID stays the same
    with pytest.raises(NodeLockError, match="reset within the same boot; the TPM was tampered with"):
        node.run()


def test_rejoin_ticket_of_another_cluster_is_refused_before_anything_changes(node, join_lab, start_swtpm):
    node.run()
    record = json.loads(open(node.settings.join_record, encoding="utf-8").read())
    record["cluster_id"] = "ab" * 32
    with open(node.settings.join_record, "w", encoding="utf-8") as handle:
        json.dump(record, handle)
    lock = json.loads(open(node.settings.lock_record, encoding="utf-8").read())
    lock["cluster_id"] = "ab" * 32
    with open(node.settings.lock_record, "w", encoding="utf-8") as handle:
        json.dump(lock, handle)
    node.reboot(start_swtpm)
    with pytest.raises(TicketError, match="rejoin ticket is for cluster"):
        node.run()
    assert node.pcr15() == "00" * 32


# ---- the CLI: configuration file and exit codes


def _config_file(tmp_path, node, **changes) -> str:
    ca = tmp_path / "cluster-ca.crt"
    ca.write_bytes(node.lab.ca_pem)
    document = {
        "endpoints": node.settings.endpoints,
        "cluster_ca_file": str(ca),
        "node_name": "worker-1",
        "tcti": node.tcti,
        "state_disk": node.settings.state_disk,
        "attempts": 1,
        "total_timeout": 20,
        "token_file": node.settings.token_file,
        "lock_record": node.settings.lock_record,
        "join_record": node.settings.join_record,
        "kubeadm": {"binary_path": "/nonexistent/kubeadm"},
    }
    document.update(changes)
    path = tmp_path / "join.yml"
    path.write_text(yaml.safe_dump(document))
    path.chmod(0o600)
    return str(path)


def test_config_file_gives_the_join_settings(tmp_path, node):
    config = boot.load_config(_config_file(tmp_path, node))
    assert config.settings.node_name == "worker-1" and config.settings.cluster_ca == node.lab.ca_pem.decode()
    assert config.settings.state_disk["device"] == str(node.device) and config.kubeadm["config_api_version"] == "auto"
    # No name: the node asks the join service's registry for the one it grants.
    assert boot.load_config(_config_file(tmp_path, node, node_name=None)).settings.node_name == ""


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"endpoint": ["x:1"]}, "unknown setting"),
        ({"endpoints": []}, "endpoints must list"),
        ({"state_disk": {"state": "formatted"}}, "state_disk.device"),
        ({"state_disk": {"device": "/dev/vdb", "state": "gone"}}, "state_disk.state must be one of"),
        ({"attempts": "eight"}, "attempts"),
        ({"control_plane": True}, "advertise_address"),
        ({"kubeadm": {"binary": "kubeadm"}}, "kubeadm.binary"),
        ({"cluster_ca_file": "/nonexistent/ca.crt"}, "cluster_ca_file"),
    ],
)
def test_unusable_config_is_refused_naming_the_setting(tmp_path, node, changes, message):
    with pytest.raises(boot.BootConfigError, match=message):
        boot.load_config(_config_file(tmp_path, node, **changes))


def test_config_readable_by_others_is_refused_and_exit_2(tmp_path, node, capsys):
    path = _config_file(tmp_path, node)
    os.chmod(path, 0o644)
    assert boot.main(["--config", path]) == boot.EXIT_CONFIG
    line = json.loads(capsys.readouterr().err.splitlines()[-1])
    assert (line["event"], line["result"]) == ("config", "failed") and "0644" in line["msg"]


def test_tampered_node_exits_1_with_the_reason_on_the_last_line(tmp_path, node, capsys):
    with Tpm(node.tcti) as tpm:
        tpm.pcr_event(8, b"another kernel command line")
    assert boot.main(["--config", _config_file(tmp_path, node)]) == boot.EXIT_FAILED
    line = json.loads(capsys.readouterr().err.splitlines()[-1])
    assert (line["event"], line["result"], line["node_name"]) == ("join", "failed", "worker-1")
    assert "no join ticket" in line["msg"] and "8" in line["msg"]
    assert node.service.minter.tokens == []


def test_kubelet_newer_than_the_tickets_cluster_version_is_refused_before_the_lock(node):
    """The join service's ticket names v1.33.4: a kubelet of 1.34 may not join, and the node stays unlocked."""
    node.settings.kubelet_version = "Kubernetes v1.34.0"
    with pytest.raises(
        TicketError, match=r"kubelet is v1\.34\.0, newer than the cluster's API server \(v1\.33\.4\).*not locked"
    ):
        node.joining().join()
    assert node.pcr15() == "00" * 32 and not os.path.exists(node.settings.lock_record)
    assert not os.path.exists(node.settings.token_file) and not os.path.exists(node.settings.join_record)
    node.settings.kubelet_version = "Kubernetes v1.31.2"
    node.joining().join()
    assert os.path.exists(node.settings.lock_record) and node.pcr15() != "00" * 32


def test_pool_node_without_a_name_joins_under_the_name_derived_from_its_ek(
    tmp_path, join_lab, other_swtpm, monkeypatch
):
    """The boot-time join of an autoscaled node: no name configured; the registry's pool rule names it, kubeadm uses that name."""
    from ansible_collections.confidential.kubernetes.plugins.module_utils._join.request import ek_identity

    monkeypatch.setattr(luks, "INITIAL_KEY_DIR", str(tmp_path / "initial-keys"))
    join_lab.enrol(other_swtpm.tcti, "worker-2")
    service = join_lab.start("pcrs-only", pool_workers=True, pool_name_prefix="pool")
    node = Node(tmp_path, join_lab, service)
    node.service = service
    node.settings.node_name = ""
    with Tpm(node.tcti) as tpm:
        ek_public = tpm.endorsement_key()[2]
    name = f"pool-{ek_identity(ek_public)[:10]}"
    assert node.run() == FRESH
    assert node.joining().node_name() == name
    assert yaml.safe_load(node.kubeadm.configs[0])["nodeRegistration"]["name"] == name
    [(minted_for, _token)] = service.minter.tokens
    assert minted_for == name
    assert [entry["node_name"] for entry in node.logs() if entry["event"] == "kubeadm-join"] == [name]


def test_a_fresh_node_says_the_disk_is_open_and_starts_the_runtime_before_kubeadm_join(node):
    """containerd and the kubelet wait for the state disk (confidential-state-disk.service waits for this status);
    kubeadm join's preflight needs the runtime, so the join starts it once the disk is open, before kubeadm runs."""
    assert node.run() == FRESH
    assert node.started == [("containerd.service", "joining", True, 0)]
    assert node.status()["state"] == MEMBER


def test_a_member_or_a_rebooted_node_starts_nothing_itself(node, start_swtpm):
    node.run()
    node.started.clear()
    assert node.run() == MEMBER
    node.reboot(start_swtpm)
    assert node.run() == REBOOTED
    assert node.started == [] and node.status()["state"] == MEMBER


def test_wait_returns_once_the_state_disk_is_open(node, capsys):
    status_file = node.config().status_file
    written = []

    def sleep(seconds):
        assert seconds == boot.WAIT_POLL_SECONDS
        # The join waits for keys first, then its ticket opens the disk.
        boot.write_status(status_file, "waiting-for-keys" if not written else "joining")
        written.append(seconds)

    assert boot.wait(status_file, sleep=sleep) == 0
    assert len(written) == 2
    assert capsys.readouterr().err.count("waiting for the boot-time join to open the state disk (no status yet") == 1
    assert boot.main(["--wait", status_file]) == 0


def test_starting_the_runtime_leaves_a_node_without_it_alone_and_fails_otherwise(tmp_path, monkeypatch):
    systemctl = tmp_path / "systemctl"
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    systemctl.write_text('#!/bin/sh\necho "Unit $3 not found." >&2\nexit 5\n')
    systemctl.chmod(0o755)
    boot.start_unit("containerd.service")
    systemctl.write_text('#!/bin/sh\necho "Job for $3 failed." >&2\nexit 1\n')
    with pytest.raises(
        OSError, match=r"systemctl start containerd.service failed \(exit 1\): Job for containerd.service"
    ):
        boot.start_unit("containerd.service")
