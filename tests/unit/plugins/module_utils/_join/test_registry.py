"""The node registry without gRPC or TPM: the enrolment file, the disk-binding mirror, and what a request is granted."""

from __future__ import annotations

import base64
import datetime
import io
import json
import os

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from ansible_collections.confidential.kubernetes.plugins.module_utils._join.config import ConfigError
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.log import StructuredLog
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.registry import (
    Binding,
    BindingMirror,
    Enrolment,
    EnrolmentWatcher,
    NodeIdentity,
    NodeRegistry,
    RegistryError,
    RegistryRefusal,
    dump_enrolment,
    parse_enrolment,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.request import public_key_digest

DISK_A = "0d3b1c4e-9f2a-4e57-8a61-2f4c9b7d5e13"
DISK_B = "5a0c7e21-3b9d-4f16-9c2e-7d81a4f0b362"
DISK_C = "9e7d6c5b-4a39-4281-8f0e-1d2c3b4a5968"
NOW = datetime.datetime.now(datetime.timezone.utc)


def _name(common_name):
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _ca():
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(_name("EK CA"))
        .issuer_name(_name("EK CA"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - datetime.timedelta(days=1))
        .not_valid_after(NOW + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return certificate, key


class Tpm:
    """An EK key pair and, when a CA is given, its EK certificate."""

    def __init__(self, ca=None):
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.identity = public_key_digest(self.key.public_key()).hex()
        self.certificate = None
        if ca is not None:
            ca_cert, ca_key = ca
            self.certificate = (
                x509.CertificateBuilder()
                .subject_name(_name("ek"))
                .issuer_name(ca_cert.subject)
                .public_key(self.key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(NOW - datetime.timedelta(days=1))
                .not_valid_after(NOW + datetime.timedelta(days=30))
                .sign(ca_key, hashes.SHA256())
            ).public_bytes(serialization.Encoding.DER)

    def node(self) -> NodeIdentity:
        return NodeIdentity(self.identity, self.certificate)


class Registry:
    def __init__(self, tmp_path, pool_prefix=None, ek_cas=()):
        self.enrolment_file = tmp_path / "node-enrolment.json"
        self.log = io.StringIO()
        self.entries: list[Enrolment] = []
        self.mirror = BindingMirror(str(tmp_path / "disk-bindings.json"))
        self.watcher = EnrolmentWatcher(str(self.enrolment_file), StructuredLog(self.log), interval=0)
        self.registry = NodeRegistry(self.watcher, self.mirror, list(ek_cas), pool_prefix)

    def enrol(self, tpm: Tpm, name: str, control_plane=False, disk=None, enrolment_id=""):
        self.entries = [e for e in self.entries if e.ek != tpm.identity]
        self.entries.append(Enrolment(tpm.identity, name, control_plane, disk, enrolment_id))
        staged = self.enrolment_file.with_suffix(".new")
        staged.write_bytes(dump_enrolment(self.entries))
        os.replace(staged, self.enrolment_file)

    def grant(self, tpm: Tpm, flow="join", name="", control_plane=False, disk=DISK_A):
        granted = self.registry.grant(tpm.node(), flow, name, control_plane, disk)
        if granted.bind is not None:
            self.mirror.record(granted.bind)
        return granted


def _refused(reason, call):
    with pytest.raises(RegistryRefusal) as err:
        call()
    assert err.value.reason == reason, str(err.value)
    return str(err.value)


def test_enrolled_node_gets_its_name_and_role_and_binds_its_first_disk(tmp_path):
    registry, cp, worker = Registry(tmp_path), Tpm(), Tpm()
    registry.enrol(cp, "cp-1", control_plane=True)
    registry.enrol(worker, "worker-1")
    granted = registry.grant(cp, control_plane=True, disk=DISK_A)
    assert (granted.node_name, granted.control_plane, granted.source, granted.bind.disk_uuid) == (
        "cp-1",
        True,
        "enrolled",
        DISK_A,
    )
    assert registry.grant(worker, name="worker-1", disk=DISK_B.upper()).disk_uuid == DISK_B
    # Once bound, the same disk is granted again and nothing new is bound.
    assert registry.grant(worker, disk=DISK_B).bind is None
    # A control plane may ask for less.
    assert registry.grant(cp, disk=DISK_A).control_plane is False


def test_enrolled_worker_asking_for_the_control_plane_role_is_refused(tmp_path):
    registry, worker = Registry(tmp_path), Tpm()
    registry.enrol(worker, "worker-1")
    assert "enrolled as worker worker-1" in _refused(
        "role-not-granted", lambda: registry.grant(worker, control_plane=True)
    )


def test_a_node_asking_for_another_name_is_refused(tmp_path):
    registry, worker, other = Registry(tmp_path), Tpm(), Tpm()
    registry.enrol(worker, "worker-1")
    registry.enrol(other, "cp-1", control_plane=True)
    assert "may not join as 'cp-1'" in _refused("name-not-granted", lambda: registry.grant(worker, name="cp-1"))


def test_another_nodes_disk_is_refused_by_join_and_by_rejoin(tmp_path):
    registry, owner, thief, init = Registry(tmp_path), Tpm(), Tpm(), Tpm()
    registry.enrol(owner, "worker-1")
    registry.enrol(thief, "worker-2")
    registry.enrol(init, "cp-0", control_plane=True, disk=DISK_C)
    registry.grant(owner, disk=DISK_A)
    for disk in (DISK_A, DISK_C):
        for flow in ("join", "rejoin"):
            assert "bound to another node's TPM" in _refused(
                "disk-not-granted", lambda: registry.grant(thief, flow=flow, disk=disk)
            )
    # A fresh node with no disk bound gets no rejoin at all.
    assert "no state disk is bound" in _refused(
        "disk-not-granted", lambda: registry.grant(thief, flow="rejoin", disk=DISK_B)
    )
    # The owner may not switch disks either.
    assert f"bound to this TPM is {DISK_A}" in _refused(
        "disk-not-granted", lambda: registry.grant(owner, flow="rejoin", disk=DISK_B)
    )


def test_a_node_enrolled_afresh_binds_its_new_disk_and_keeps_the_old_one_from_others(tmp_path):
    registry, node, other = Registry(tmp_path), Tpm(), Tpm()
    registry.enrol(node, "worker-1", enrolment_id="01")
    registry.enrol(other, "worker-2")
    registry.grant(node, disk=DISK_A)
    _refused("disk-not-granted", lambda: registry.grant(node, disk=DISK_B))
    # The node was reset (its disk wiped) and the controller enrolled it again.
    registry.enrol(node, "worker-1", enrolment_id="02")
    assert registry.grant(node, disk=DISK_B).bind.enrolment_id == "02"
    assert registry.registry.owner_of(DISK_A) == node.identity and registry.registry.owner_of(DISK_B) == node.identity
    # The old disk is released by an operator only (remove_node.yml deletes the node's bindings), not by the new enrolment.
    assert "(worker-1)" in _refused("disk-not-granted", lambda: registry.grant(other, disk=DISK_A))


def test_a_binding_wins_over_an_enrolment_that_names_its_disk_for_another_node(tmp_path):
    registry, owner, newcomer = Registry(tmp_path), Tpm(), Tpm()
    registry.enrol(owner, "worker-1")
    registry.grant(owner, disk=DISK_C)
    # A new host is enrolled with the owner's disk UUID (the enrolment file says DISK_C is worker-9's).
    registry.enrol(newcomer, "worker-9", disk=DISK_C)
    assert registry.registry.owner_of(DISK_C) == owner.identity
    for flow in ("join", "rejoin"):
        message = _refused("disk-not-granted", lambda: registry.grant(newcomer, flow=flow, disk=DISK_C))
        assert "(worker-1)" in message and "remove_node.yml" in message
    # The owner still rejoins with its disk.
    assert registry.grant(owner, flow="rejoin", disk=DISK_C).disk_uuid == DISK_C


def test_unenrolling_a_node_does_not_free_its_disk(tmp_path):
    registry, owner, other = Registry(tmp_path), Tpm(), Tpm()
    registry.enrol(owner, "worker-1", enrolment_id="01")
    registry.enrol(other, "worker-2", enrolment_id="02")
    registry.grant(owner, disk=DISK_A)
    registry.entries = [e for e in registry.entries if e.ek != owner.identity]
    registry.enrol(other, "worker-2", enrolment_id="02")
    assert owner.identity not in registry.watcher.current().by_ek
    assert "(worker-1)" in _refused("disk-not-granted", lambda: registry.grant(other, disk=DISK_A))


def test_an_enrolled_disk_is_claimed_in_the_api_at_its_first_join_only(tmp_path):
    registry, member = Registry(tmp_path), Tpm()
    registry.enrol(member, "cp-1", control_plane=True, disk=DISK_C)
    first = registry.grant(member, control_plane=True, disk=DISK_C)
    assert first.bind == Binding(DISK_C, member.identity, "cp-1", "", first.bind.bound_at)
    assert registry.grant(member, control_plane=True, disk=DISK_C).bind is None
    assert registry.grant(member, flow="rejoin", disk=DISK_C).bind is None


def test_unenrolled_tpm_is_refused_without_the_pool_rule(tmp_path):
    registry, stranger = Registry(tmp_path), Tpm()
    assert "pool rule is off" in _refused("not-enrolled", lambda: registry.grant(stranger))


def test_pool_rule_names_a_worker_after_its_ek_and_never_makes_a_control_plane(tmp_path):
    ca = _ca()
    registry, member, pooled = Registry(tmp_path, "pool", [ca[0]]), Tpm(), Tpm(ca)
    assert "no node enrolment has been pushed" in _refused("not-enrolled", lambda: registry.grant(pooled))
    registry.enrol(member, "worker-1")
    granted = registry.grant(pooled, disk=DISK_B)
    assert (granted.node_name, granted.control_plane, granted.source) == (f"pool-{pooled.identity[:10]}", False, "pool")
    assert "never as a control plane" in _refused(
        "role-not-granted", lambda: registry.grant(pooled, control_plane=True, disk=DISK_B)
    )
    _refused("name-not-granted", lambda: registry.grant(pooled, name="worker-1", disk=DISK_B))
    assert registry.grant(pooled, name=granted.node_name, flow="rejoin", disk=DISK_B).bind is None


def test_pool_rule_admits_only_ek_certificates_of_the_ek_ca(tmp_path):
    ca, other_ca = _ca(), _ca()
    registry, member = Registry(tmp_path, "pool", [ca[0]]), Tpm()
    registry.enrol(member, "worker-1")
    foreign, uncertified = Tpm(other_ca), Tpm()
    assert "does not certify its EK under the configured EK CA" in _refused(
        "not-enrolled", lambda: registry.grant(foreign)
    )
    assert "carries no EK certificate" in _refused("not-enrolled", lambda: registry.grant(uncertified))
    # Another TPM's genuine certificate does not make this EK a pool member.
    borrowed = NodeIdentity(uncertified.identity, Tpm(ca).certificate)
    _refused("not-enrolled", lambda: registry.registry.grant(borrowed, "join", "", False, DISK_A))


def test_pool_name_taken_by_an_enrolled_node_is_refused(tmp_path):
    ca = _ca()
    registry, pooled, squatter = Registry(tmp_path, "pool", [ca[0]]), Tpm(ca), Tpm()
    registry.enrol(squatter, f"pool-{pooled.identity[:10]}")
    _refused("name-not-granted", lambda: registry.grant(pooled))


def test_enrolment_changes_are_picked_up_and_a_bad_one_is_refused_and_reported(tmp_path):
    registry, node = Registry(tmp_path), Tpm()
    assert registry.watcher.digest == ""
    registry.enrol(node, "worker-1")
    assert registry.grant(node).node_name == "worker-1"
    good = registry.watcher.digest
    registry.enrolment_file.write_text('{"version": 1, "nodes": [{"ek": "xyz"}]}')
    assert registry.grant(node, disk=DISK_A).node_name == "worker-1"
    assert registry.watcher.digest == good and "ek 'xyz' is not valid" in registry.watcher.error
    assert registry.watcher.rejected_digest and registry.watcher.rejected_digest != good


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d["nodes"].append(dict(d["nodes"][0], node_name="other")), "EK .* is enrolled twice"),
        (lambda d: d["nodes"].append(dict(d["nodes"][0], ek="b" * 64)), "node name worker-1 is enrolled twice"),
        (
            lambda d: d["nodes"].append({"ek": "b" * 64, "node_name": "w2", "role": "worker", "disk_uuid": DISK_B}),
            "disk UUID .* enrolled twice",
        ),
        (lambda d: d["nodes"][0].update(role="admin"), "role 'admin'"),
        (lambda d: d["nodes"][0].update(ek="A" * 64), "ek 'A+' is not valid"),
        (lambda d: d["nodes"][0].update(node_name="Worker_1"), "not a DNS-1123"),
        (lambda d: d["nodes"][0].update(node_name="n" * 60), "too long for a kubelet certificate"),
        (lambda d: d["nodes"][0].update(disk_uuid="not-a-uuid"), "not a UUID"),
        (lambda d: d["nodes"][0].update(secret="x"), "unknown field"),
        (lambda d: d.update(version=2), "version 1"),
        (lambda d: d["nodes"][0].update(ek_certificate="!!"), "not a readable DER certificate"),
    ],
    ids=[
        "EK twice",
        "name twice",
        "disk twice",
        "role",
        "EK format",
        "name format",
        "name length",
        "disk UUID",
        "unknown field",
        "version",
        "certificate",
    ],
)
def test_malformed_enrolments_are_refused_naming_the_entry(change, message):
    document = {
        "version": 1,
        "nodes": [{"ek": "a" * 64, "node_name": "worker-1", "role": "worker", "disk_uuid": DISK_B}],
    }
    change(document)
    with pytest.raises(RegistryError, match=message):
        parse_enrolment(json.dumps(document).encode(), "node enrolment test")


def test_enrolled_certificate_must_certify_the_enrolled_ek():
    ca = _ca()
    tpm, other = Tpm(ca), Tpm()
    entry = {
        "ek": other.identity,
        "node_name": "worker-1",
        "role": "worker",
        "ek_certificate": base64.b64encode(tpm.certificate).decode(),
    }
    with pytest.raises(RegistryError, match="certifies another key"):
        parse_enrolment(json.dumps({"version": 1, "nodes": [entry]}).encode(), "node enrolment test")
    entry["ek"] = tpm.identity
    assert (
        parse_enrolment(json.dumps({"version": 1, "nodes": [entry]}).encode(), "test")
        .by_ek[tpm.identity]
        .ek_certificate
        == tpm.certificate
    )


def test_binding_mirror_survives_a_restart_and_is_written_0600(tmp_path):
    path = tmp_path / "disk-bindings.json"
    mirror = BindingMirror(str(path))
    binding = Binding(DISK_A, "a" * 64, "worker-1", "", "2026-01-01T00:00:00Z")
    mirror.record(binding)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert BindingMirror(str(path)).get(DISK_A) == binding
    assert mirror.replace([]) and BindingMirror(str(path)).all() == []
    assert not mirror.replace([])


def test_binding_mirror_finds_an_eks_bindings_after_each_change(tmp_path):
    mirror = BindingMirror(str(tmp_path / "disk-bindings.json"))
    first, second, other = (
        Binding(DISK_A, "a" * 64, "worker-1"),
        Binding(DISK_B, "a" * 64, "worker-1"),
        Binding(DISK_C, "b" * 64, "worker-2"),
    )
    mirror.record(first)
    mirror.record(other)
    assert (mirror.of_ek("a" * 64), mirror.of_ek("b" * 64), mirror.of_ek("c" * 64)) == ([first], [other], [])
    mirror.record(second)
    assert sorted(mirror.of_ek("a" * 64), key=lambda b: b.disk_uuid) == sorted(
        [first, second], key=lambda b: b.disk_uuid
    )
    assert mirror.replace([other]) and (mirror.of_ek("a" * 64), mirror.of_ek("b" * 64)) == ([], [other])
    assert BindingMirror(mirror.path).of_ek("b" * 64) == [other]


def test_unreadable_binding_mirror_stops_the_service_at_start(tmp_path):
    path = tmp_path / "disk-bindings.json"
    path.write_text('{"version": 1, "bindings": [{"disk_uuid": "x"}]}')
    with pytest.raises(ConfigError, match="disk bindings .* binding 0"):
        BindingMirror(str(path))


def test_a_node_that_joined_since_its_enrolment_changes_nothing(tmp_path):
    """Enrolled before its join (no LUKS disk yet), enrolled again after it: the file stays as it was, so a re-run of
    join.yml reports no change and the disk binding made under the enrolment_id stays valid."""
    from ansible_collections.confidential.kubernetes.plugins.module_utils._join.registry import merge_enrolment

    path = str(tmp_path / "node-enrolment.json")
    before = Enrolment(ek="ab" * 32, node_name="worker-0", control_plane=False)
    changed, first = merge_enrolment(path, [before])
    assert changed
    joined = Enrolment(
        ek="ab" * 32, node_name="worker-0", control_plane=False, disk_uuid="22900c07-6ff1-4ef1-b5ed-0216ebff066d"
    )
    assert merge_enrolment(path, [joined]) == (False, first)
    # A changed role is a new enrolment all the same.
    changed, _content = merge_enrolment(
        path,
        [
            Enrolment(
                ek="ab" * 32, node_name="worker-0", control_plane=True, disk_uuid="22900c07-6ff1-4ef1-b5ed-0216ebff066d"
            )
        ],
    )
    assert changed
