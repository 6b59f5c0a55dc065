"""The service configuration, the root secrets file and the measurement policy the service re-reads."""

from __future__ import annotations

import base64
import io
import json
import os

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.policy import (
    MeasurementPolicy,
    PcrRule,
    dump_policy,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.config import (
    MAX_CONFIG_BYTES,
    ConfigError,
    PolicyWatcher,
    load_config,
    load_root_secrets,
    read_private_file,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.log import StructuredLog

REQUIRED = {
    "tls_cert": "/etc/cks/tls.crt",
    "tls_key": "/etc/cks/tls.key",
    "secrets_file": "/etc/cks/secrets.json",
    "policy_file": "/etc/cks/policy.json",
    "api_server_endpoint": "10.0.0.1:6443",
    "kubernetes_version": "v1.33.4",
}


def _config_file(tmp_path, settings, suffix="yml"):
    path = tmp_path / f"joinservice.{suffix}"
    path.write_text(json.dumps(settings))
    return str(path)


def test_defaults(tmp_path):
    config = load_config(_config_file(tmp_path, REQUIRED))
    assert (config.listen, config.verifier_id, config.pki_dir, config.admin_kubeconfig, config.nonce_ttl) == (
        "0.0.0.0:9290",
        "confidential.kubernetes/joinservice",
        "/etc/kubernetes/pki",
        "/etc/kubernetes/admin.conf",
        60.0,
    )
    assert (config.enrolment_file, config.bindings_file, config.pool_workers, config.pool_name_prefix) == (
        "/etc/confidential-kubernetes/node-enrolment.json",
        "/etc/confidential-kubernetes/disk-bindings.json",
        False,
        "pool",
    )


def test_empty_ek_ca_file_and_kubernetes_version_mean_none(tmp_path):
    """What the joinservice role's template writes when there is no EK CA and no pinned version."""
    config = load_config(_config_file(tmp_path, dict(REQUIRED, ek_ca_file="", kubernetes_version="")))
    assert (config.ek_ca_file, config.kubernetes_version) == (None, "")


def test_worker_processes_default_to_one_per_core_beside_the_event_loop_and_0_is_the_loop_thread(tmp_path):
    assert load_config(_config_file(tmp_path, REQUIRED)).worker_processes == max(1, (os.cpu_count() or 1) - 1)
    assert load_config(_config_file(tmp_path, dict(REQUIRED, worker_processes=0))).worker_processes == 0


def test_yaml_is_read(tmp_path):
    path = tmp_path / "joinservice.yml"
    path.write_text("".join(f"{k}: {v}\n" for k, v in REQUIRED.items()) + "nonce_ttl: 30\nlisten: '[::]:9290'\n")
    config = load_config(str(path))
    assert (config.nonce_ttl, config.listen) == (30, "[::]:9290")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"tls_cert": None}, "lacks required setting"),
        ({"tsl_cert": "/x"}, "unknown setting"),
        ({"api_server_endpoint": "10.0.0.1"}, "must be host:port"),
        ({"api_server_endpoint": "10.0.0.1:99999"}, "must be host:port"),
        ({"nonce_ttl": "60"}, "nonce_ttl"),
        ({"nonce_ttl": True}, "nonce_ttl"),
        ({"max_registrations": 0}, "max_registrations"),
        ({"listen": "9290"}, "address:port"),
        ({"pool_workers": "yes"}, "pool_workers"),
        ({"pool_name_prefix": "Pool_"}, "pool_name_prefix"),
        ({"pool_name_prefix": "p" * 42}, "pool_name_prefix"),
        ({"nonce_rate": -1}, "nonce_rate"),
        ({"max_connections": 0}, "max_connections"),
        ({"max_connections_per_client": 0}, "max_connections_per_client"),
        ({"client_ipv6_prefix": 0}, "client_ipv6_prefix"),
        ({"client_ipv6_prefix": 129}, "client_ipv6_prefix"),
        ({"first_rpc_timeout": -1}, "first_rpc_timeout"),
        ({"request_message_timeout": 0}, "request_message_timeout"),
        ({"max_calls_per_client": 0}, "max_calls_per_client"),
        ({"max_calls_per_network": True}, "max_calls_per_network"),
        ({"max_connections_per_network": -1}, "max_connections_per_network"),
        ({"health_rate": -1}, "health_rate"),
        ({"max_calls_per_client": 65}, r"max_calls_per_client \(65\) <= max_calls_per_network \(64\)"),
        ({"max_connections_per_network": 2048}, r"max_connections_per_network \(2048\) <= max_connections \(1024\)"),
        ({"worker_processes": -1}, "worker_processes"),
        ({"worker_processes": True}, "worker_processes"),
    ],
)
def test_bad_settings_are_named(tmp_path, change, message):
    settings = dict(REQUIRED, **{k: v for k, v in change.items() if v is not None})
    for key in [k for k, v in change.items() if v is None]:
        del settings[key]
    with pytest.raises(ConfigError, match=message):
        load_config(_config_file(tmp_path, settings))


def test_config_that_is_not_a_mapping(tmp_path):
    path = tmp_path / "c.yml"
    path.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(str(path))


def _secrets(tmp_path, mode=0o600, **override):
    values = {
        name: base64.b64encode(bytes([fill]) * 32).decode()
        for name, fill in (("master_key", 1), ("master_salt", 2), ("measurement_salt", 3))
    }
    values.update(override)
    path = tmp_path / "secrets.json"
    path.write_text(json.dumps(values))
    os.chmod(path, mode)
    return str(path)


def test_root_secrets_load(tmp_path):
    secrets = load_root_secrets(_secrets(tmp_path))
    assert (secrets.master_key, secrets.master_salt, secrets.measurement_salt) == (
        b"\x01" * 32,
        b"\x02" * 32,
        b"\x03" * 32,
    )
    assert "\\x01" not in repr(secrets)


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o644])
def test_root_secrets_readable_by_others_refuse_to_start(tmp_path, mode):
    with pytest.raises(ConfigError, match=f"mode {mode:04o}.*chmod 600"):
        load_root_secrets(_secrets(tmp_path, mode))


@pytest.mark.parametrize(
    "override, message", [({"master_key": "not base64!"}, "not base64"), ({"master_salt": "AAAA"}, "32 bytes")]
)
def test_malformed_root_secrets(tmp_path, override, message):
    with pytest.raises(ConfigError, match=message):
        load_root_secrets(_secrets(tmp_path, **override))


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _policy(value: bytes) -> str:
    return dump_policy(MeasurementPolicy("sha256", {4: PcrRule(4, (value,))}, "pcrs-only"))


@pytest.fixture
def watched(tmp_path):
    path = tmp_path / "policy.json"
    path.write_text(_policy(b"\x01" * 32))
    stream = io.StringIO()
    clock = Clock()
    return path, PolicyWatcher(str(path), StructuredLog(stream), clock=clock), clock, stream


def _events(stream):
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_policy_is_rechecked_at_most_once_a_second(watched):
    path, watcher, clock, stream = watched
    path.write_text(_policy(b"\x02" * 32))
    assert watcher.current().rules[4].allowed == (b"\x01" * 32,)
    clock.now += 1.0
    assert watcher.current().rules[4].allowed == (b"\x02" * 32,)


def test_bad_policy_is_rejected_once_and_the_old_one_kept(watched):
    path, watcher, clock, stream = watched
    old = watcher.current()
    path.write_text("{]")
    for _i in range(3):
        clock.now += 2
        assert watcher.current() is old
    assert [(e["event"], e["result"], e["level"]) for e in _events(stream)] == [("policy-reload", "rejected", "error")]
    assert not os.path.exists(f"{path}.previous")


def test_good_policy_replaces_the_old_one_which_is_kept_as_backup(watched):
    path, watcher, clock, stream = watched
    original = path.read_bytes()
    replacement = path.with_name("new.json")
    replacement.write_text(_policy(b"\x03" * 32))
    os.replace(replacement, path)  # a new inode of the same size
    clock.now += 2
    assert watcher.current().rules[4].allowed == (b"\x03" * 32,)
    assert open(f"{path}.previous", "rb").read() == original
    assert [e["result"] for e in _events(stream)] == ["loaded"]


def test_unreadable_policy_at_start_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read measurement policy"):
        PolicyWatcher(str(tmp_path / "missing.json"), StructuredLog(io.StringIO()))
    (tmp_path / "bad.json").write_text("[]")
    with pytest.raises(ConfigError, match="must be a mapping"):
        PolicyWatcher(str(tmp_path / "bad.json"), StructuredLog(io.StringIO()))


def test_a_configuration_or_private_file_larger_than_its_limit_is_refused_naming_it(tmp_path):
    path = tmp_path / "joinservice.yaml"
    path.write_bytes(b"#" * (MAX_CONFIG_BYTES + 1))
    with pytest.raises(
        ConfigError, match=f"^join service configuration {path} is larger than {MAX_CONFIG_BYTES} bytes$"
    ):
        load_config(str(path))
    secret = tmp_path / "secret"
    secret.write_bytes(b"k" * 33)
    secret.chmod(0o600)
    assert read_private_file(str(secret), "token file", limit=33) == b"k" * 33
    with pytest.raises(ConfigError, match=f"^token file {secret} is larger than 32 bytes$"):
        read_private_file(str(secret), "token file", limit=32)
