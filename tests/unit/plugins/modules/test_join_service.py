"""join_service against a real join service: the module runs in-process on a control plane's files in a temp directory;
its systemctl seam starts and restarts an in-process join service (the _join harness: real TLS, real swtpm policy) from
exactly the files the module wrote, so that the health check at the end asks a service that loaded them.

The rhythm of each feature: a first run sets everything up, a re-run changes nothing and restarts nothing, and each
changed input changes exactly its file - the policy and the enrolment with a backup and no restart, everything the
service reads only at start with a restart."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
from pathlib import Path

import pytest
from cryptography import x509

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.policy import dump_policy
from ansible_collections.confidential.kubernetes.plugins.module_utils._files import file_sha256
from ansible_collections.confidential.kubernetes.plugins.module_utils._join import health
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.config import ConfigError
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.daemon import Systemd
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.registry import dump_enrolment
from ansible_collections.confidential.kubernetes.plugins.modules import join_service

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "module_utils" / "_join"))

from join_harness import join_lab, policy_from_swtpm  # noqa: E402,F401  # pylint: disable=unused-import
from module_runner import module_outcome, run_main  # noqa: E402,F401  # pylint: disable=unused-import

BAD_POLICY = '{"version": 1, "hash_algorithm": "sha256", "ak_trust": "pcrs-only", "pcrs": {"4": {"allowed": ["zz"]}}}\n'


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class FakeSystemd(Systemd):
    """systemctl as systemd would answer it for one unit; start and restart run the join service from the module's files."""

    def __init__(self, node: "ControlPlane"):
        super().__init__("confidential-joinservice.service")
        self.node = node
        self.active = False
        self.enabled = False
        self.need_reload = False
        self.calls: list[list[str]] = []
        self.service = None

    def _run_command(self, argv):
        verb = argv[1]
        if verb != "show":
            self.calls.append(argv[1:])
        if verb == "show":
            return (
                0,
                (
                    f"ActiveState={'active' if self.active else 'inactive'}\nUnitFileState={'enabled' if self.enabled else 'disabled'}\n"
                    f"NeedDaemonReload={'yes' if self.need_reload else 'no'}\n"
                ),
                "",
            )
        if verb == "daemon-reload":
            self.need_reload = False
        elif verb == "enable":
            self.enabled = True
        elif verb in ("start", "restart"):
            self.stop()
            try:
                self.service = self.node.lab.start(None, port=self.node.port, **self.node.service_files())
            except ConfigError:
                # systemctl succeeds; the service exits at once (systemd would restart it, to the same end).
                return 0, "", ""
            self.active = True
        return 0, "", ""

    def stop(self):
        if self.service is not None:
            self.service.stop_now()
            self.node.lab.services.remove(self.service)
            self.service = None
        self.active = False


class ControlPlane:
    """A control plane's configuration directory (with the cluster secrets init left there) and the module run on it."""

    def __init__(self, lab, tmp_path, monkeypatch):
        self.lab = lab
        self.config_dir = tmp_path / "etc" / "confidential-kubernetes"
        self.config_dir.mkdir(parents=True, mode=0o700)
        shutil.copy(lab.secrets_file, self.config_dir / "cluster-secrets.json")
        self.unit_dir = tmp_path / "systemd"
        self.unit_dir.mkdir()
        self.port = _free_port()
        self.systemd = FakeSystemd(self)
        monkeypatch.setattr(join_service, "Systemd", lambda unit: self.systemd)
        lab.enrol(lab.swtpm.tcti, "worker-1")
        self.args = {
            "config_dir": str(self.config_dir),
            "measurement_policy": dump_policy(policy_from_swtpm(lab.swtpm.tcti, "pcrs-only")),
            "enrolment": dump_enrolment(list(lab.enrolments.values())).decode(),
            "ek_ca": lab.swtpm.ca_pem.decode(),
            "config": "listen: 127.0.0.1\n",
            "unit": "[Service]\nExecStart=/bin/true\n",
            "unit_dir": str(self.unit_dir),
            "tls_names": ["127.0.0.1", "cp-0"],
            "pki_dir": str(lab.pki_dir),
            "port": self.port,
            "health_timeout": 10,
        }

    def service_files(self) -> dict:
        path = self.config_dir
        return dict(
            tls_cert=str(path / "joinservice.crt"),
            tls_key=str(path / "joinservice.key"),
            secrets_file=str(path / "cluster-secrets.json"),
            policy_file=str(path / "measurement-policy.yml"),
            enrolment_file=str(path / "node-enrolment.json"),
            ek_ca_file=str(path / "ek-ca.pem"),
        )

    def run(self, check_mode: bool = False, diff: bool = False, **changes) -> dict:
        args = dict(self.args, **changes, _ansible_check_mode=check_mode, _ansible_diff=diff)
        self.systemd.calls.clear()
        return run_main(join_service.main, args)

    def file(self, name: str) -> Path:
        return self.config_dir / name

    def mode(self, name: str) -> int:
        return os.stat(self.file(name)).st_mode & 0o777

    def loaded(self) -> object:
        return health.health(f"127.0.0.1:{self.port}", self.lab.ca_pem, None, 5)


@pytest.fixture
def node(join_lab, tmp_path, monkeypatch):
    return ControlPlane(join_lab, tmp_path, monkeypatch)


def _changed(result: dict) -> set[str]:
    return {what for what, entry in result["files"].items() if entry["changed"]}


def test_a_first_run_sets_everything_up_and_a_re_run_changes_nothing(node):
    first = node.run()
    assert not first["failed"], first["msg"] if first["failed"] else ""
    assert first["changed"] and first["tls_certificate_changed"] and first["installed"]
    assert _changed(first) == {"policy", "enrolment", "ek_ca", "config", "unit"}
    assert first["service_actions"] == ["daemon-reload", "enable", "start"]
    assert node.systemd.calls == [
        ["daemon-reload"],
        ["enable", "confidential-joinservice.service"],
        ["start", "confidential-joinservice.service"],
    ]
    assert {
        name: node.mode(name)
        for name in ("measurement-policy.yml", "node-enrolment.json", "joinservice.yml", "joinservice.key")
    } == dict.fromkeys(("measurement-policy.yml", "node-enrolment.json", "joinservice.yml", "joinservice.key"), 0o600)
    assert (
        node.mode("ek-ca.pem") == 0o644
        and os.stat(node.unit_dir / "confidential-joinservice.service").st_mode & 0o777 == 0o644
    )
    assert node.file("measurement-policy.yml").read_text() == node.args["measurement_policy"]
    assert node.loaded().status == "SERVING"
    service = node.systemd.service
    again = node.run()
    assert not again["changed"] and not again["failed"] and _changed(again) == set() and again["service_actions"] == []
    assert node.systemd.calls == [] and node.systemd.service is service


def test_a_new_policy_is_pushed_with_a_backup_and_loaded_without_a_restart(node):
    node.run()
    service, previous = node.systemd.service, node.file("measurement-policy.yml").read_text()
    policy = json.loads(
        json.dumps(
            {"version": 1, "hash_algorithm": "sha256", "ak_trust": "pcrs-only", "pcrs": {"4": {"allowed": ["ab" * 32]}}}
        )
    )
    result = node.run(measurement_policy=json.dumps(policy) + "\n")
    assert not result["failed"], result.get("msg")
    assert result["changed"] and _changed(result) == {"policy"} and result["service_actions"] == []
    backup = result["files"]["policy"]["backup_file"]
    assert backup and Path(backup).read_text() == previous and os.stat(backup).st_mode & 0o777 == 0o600
    assert node.systemd.service is service and node.systemd.calls == []
    assert node.loaded().policy_digest == file_sha256(str(node.file("measurement-policy.yml")))


def test_a_new_enrolment_is_pushed_with_a_backup_and_loaded_without_a_restart(node, other_swtpm):
    node.run()
    service = node.systemd.service
    node.lab.enrol(other_swtpm.tcti, "worker-2")
    result = node.run(enrolment=dump_enrolment(list(node.lab.enrolments.values())).decode())
    assert not result["failed"], result.get("msg")
    assert (
        _changed(result) == {"enrolment"}
        and result["files"]["enrolment"]["backup_file"]
        and result["service_actions"] == []
    )
    assert node.systemd.service is service
    assert node.loaded().enrolment_digest == file_sha256(str(node.file("node-enrolment.json")))


@pytest.mark.parametrize(
    "change",
    [
        lambda node: {"config": "listen: 127.0.0.1\nnonce_ttl: 61\n"},
        lambda node: {"ek_ca": node.args["ek_ca"] + node.lab.ca_pem.decode()},
        lambda node: {"restart": True},
        lambda node: {"tls_names": ["127.0.0.1", "cp-0", "cp-0.example.net"]},
    ],
    ids=["configuration", "EK CA", "code (restart)", "certificate names"],
)
def test_what_the_service_reads_only_at_start_restarts_it(node, change):
    node.run()
    service = node.systemd.service
    result = node.run(**change(node))
    assert not result["failed"], result.get("msg")
    assert result["changed"] and result["service_actions"] == ["restart"] and node.systemd.service is not service
    assert not any(entry["backup_file"] for entry in result["files"].values())


def test_the_certificate_is_renewed_below_its_threshold_alone_and_the_service_restarted(node):
    """The renew playbook's call: only the certificate's names and a threshold, no files; above 365 days it renews."""
    node.run()
    service, before = node.systemd.service, x509.load_pem_x509_certificate(node.file("joinservice.crt").read_bytes())
    renewal = {
        "tls_names": node.args["tls_names"],
        "pki_dir": node.args["pki_dir"],
        "config_dir": node.args["config_dir"],
        "unit_dir": node.args["unit_dir"],
        "port": node.port,
        "health_timeout": 10,
        "only_if_installed": True,
    }
    kept = run_main(join_service.main, dict(renewal, tls_renew_before_days=364))
    assert not kept["failed"] and not kept["changed"] and node.systemd.service is service
    renewed = run_main(join_service.main, dict(renewal, tls_renew_before_days=366))
    assert not renewed["failed"], renewed.get("msg")
    assert (
        renewed["tls_certificate_changed"]
        and renewed["service_actions"] == ["restart"]
        and node.systemd.service is not service
    )
    after = x509.load_pem_x509_certificate(node.file("joinservice.crt").read_bytes())
    assert after.serial_number != before.serial_number and after.not_valid_after_utc >= before.not_valid_after_utc
    assert node.loaded().status == "SERVING"


def test_a_changed_unit_is_reloaded_before_the_restart(node):
    node.run()
    result = node.run(unit="[Service]\nExecStart=/bin/false\n")
    assert _changed(result) == {"unit"} and result["service_actions"] == ["daemon-reload", "restart"]
    assert (node.unit_dir / "confidential-joinservice.service").read_text() == "[Service]\nExecStart=/bin/false\n"


def test_a_stopped_service_is_started_and_a_unit_systemd_has_not_reloaded_is_reloaded(node):
    node.run()
    node.systemd.stop()
    assert node.run()["service_actions"] == ["start"]
    node.systemd.need_reload = True
    assert node.run()["service_actions"] == ["daemon-reload", "restart"]


def test_a_policy_the_service_refuses_fails_with_its_words_and_the_previous_file_is_put_back(node):
    node.run()
    previous = node.file("measurement-policy.yml").read_text()
    result = node.run(measurement_policy=BAD_POLICY)
    assert (
        result["failed"]
        and "refused the policy file" in result["msg"]
        and "'zz' is not a 32-byte hex digest" in result["msg"]
    )
    assert "was put back from" in result["msg"]
    assert node.file("measurement-policy.yml").read_text() == previous and node.mode("measurement-policy.yml") == 0o600
    assert node.loaded().policy_digest == file_sha256(str(node.file("measurement-policy.yml")))


def test_a_bad_policy_pushed_with_a_restart_is_put_back_and_the_service_restarted_on_the_last_good_one(node):
    """The service reads its policy at start too: one it cannot load keeps it from starting, so waiting for it to load
    the new file ends in a timeout. The last good file goes back, the service starts on it, and the task says so."""
    node.run()
    previous = node.file("measurement-policy.yml").read_text()
    result = node.run(measurement_policy=BAD_POLICY, restart=True, health_timeout=3)
    assert result["failed"] and "did not start with the files pushed with its restart" in result["msg"], result["msg"]
    assert (
        "serves again with the last good ones" in result["msg"]
        and str(node.file("measurement-policy.yml")) in result["msg"]
    )
    assert node.file("measurement-policy.yml").read_text() == previous
    assert node.loaded().policy_digest == file_sha256(str(node.file("measurement-policy.yml")))


def test_without_the_cluster_secrets_nothing_is_changed(node):
    os.unlink(node.file("cluster-secrets.json"))
    result = node.run()
    assert result["failed"] and "cluster-secrets.json is missing or not 0600" in result["msg"]
    assert os.listdir(node.config_dir) == [] and os.listdir(node.unit_dir) == [] and node.systemd.calls == []


def test_check_mode_predicts_and_changes_nothing(node):
    result = node.run(check_mode=True)
    assert (
        result["changed"]
        and result["tls_certificate_changed"]
        and _changed(result) == {"policy", "enrolment", "ek_ca", "config", "unit"}
    )
    assert result["service_actions"] == ["daemon-reload", "enable", "start"]
    assert os.listdir(node.config_dir) == ["cluster-secrets.json"] and node.systemd.calls == []
    node.run()
    assert not node.run(check_mode=True)["changed"]


def test_diff_mode_shows_the_files_that_change(node):
    node.run()
    result = node.run(diff=True, config="listen: 127.0.0.1\nnonce_ttl: 61\n")
    assert result["diff"] == [
        {
            "before_header": str(node.file("joinservice.yml")),
            "after_header": str(node.file("joinservice.yml")),
            "before": "listen: 127.0.0.1\n",
            "after": "listen: 127.0.0.1\nnonce_ttl: 61\n",
        }
    ]


def test_only_if_installed_leaves_a_control_plane_without_the_unit_alone(node):
    enrolment_only = {
        "measurement_policy": None,
        "ek_ca": None,
        "config": None,
        "unit": None,
        "tls_names": [],
        "only_if_installed": True,
    }
    result = node.run(**enrolment_only)
    assert not result["changed"] and not result["installed"] and os.listdir(node.config_dir) == ["cluster-secrets.json"]
    node.run()
    service = node.systemd.service
    node.lab.enrol(node.lab.swtpm.tcti, "worker-9")
    pushed = node.run(**dict(enrolment_only, enrolment=dump_enrolment(list(node.lab.enrolments.values())).decode()))
    assert pushed["installed"] and set(pushed["files"]) == {"enrolment"} and _changed(pushed) == {"enrolment"}
    assert node.systemd.service is service
