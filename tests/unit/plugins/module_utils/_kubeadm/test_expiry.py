# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Certificate expiry of a kubeadm tree made by the test: certificates that expire soon, later, or already did, in the
files and kubeconfigs kubeadm writes (the certificates are made relative to the real clock; none is touched)."""

from __future__ import annotations

import base64
import datetime
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm import expiry

NOW = datetime.datetime.now(datetime.timezone.utc)
KEY = ec.generate_private_key(ec.SECP256R1())


def _certificate(name: str, days: float) -> x509.Certificate:
    """A certificate that expires ``days`` from now (negative: expired), issued a year before."""
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(KEY.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - datetime.timedelta(days=400))
        .not_valid_after(NOW + datetime.timedelta(days=days))
        .sign(KEY, hashes.SHA256())
    )


def _pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


def _kubeconfig(certificate: x509.Certificate | None = None, certificate_file: str | None = None) -> str:
    user = {"client-key-data": "c2VjcmV0"}
    if certificate is not None:
        user["client-certificate-data"] = base64.b64encode(_pem(certificate)).decode()
    if certificate_file is not None:
        user["client-certificate"] = certificate_file
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [],
            "contexts": [],
            "users": [{"name": "kubernetes-admin", "user": user}],
        }
    )


def _tree(root: Path, days: dict[str, float], default: float = 300) -> tuple[Path, Path]:
    """A control plane's /etc/kubernetes and the kubelet's -current.pem (certificate and key, as the kubelet keeps it)."""
    kubernetes = root / "etc/kubernetes"
    for name in expiry.RENEWABLE_CERTIFICATES + expiry.AUTHORITIES:
        (kubernetes / name).parent.mkdir(parents=True, exist_ok=True)
        (kubernetes / name).write_bytes(_pem(_certificate(name, days.get(name, 3650 if "ca" in name else default))))
    for name in expiry.RENEWABLE_KUBECONFIGS:
        (kubernetes / name).write_text(_kubeconfig(_certificate(name, days.get(name, default))))
    kubelet = root / "var/lib/kubelet/pki/kubelet-client-current.pem"
    kubelet.parent.mkdir(parents=True)
    key = KEY.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    kubelet.write_bytes(_pem(_certificate("system:node:cp-1", days.get("kubelet", default))) + key)
    return kubernetes, kubelet


def _report(kubernetes: Path, kubelet: Path, control_plane: bool = True, threshold: int = 30) -> dict:
    found, missing = expiry.scan(str(kubernetes), control_plane, str(kubelet))
    return expiry.summary(found, missing, NOW, datetime.timedelta(days=threshold))


def test_a_fresh_control_plane_is_ok_and_names_its_earliest_file(tmp_path):
    kubernetes, kubelet = _tree(tmp_path, {"scheduler.conf": 200, "kubelet": 250})
    report = _report(kubernetes, kubelet)
    assert report["expiring"] == [] and report["expired"] == [] and report["missing"] == []
    assert report["control_plane"]["path"] == str(kubernetes / "scheduler.conf")
    assert 199 < report["control_plane"]["days_left"] <= 200 and report["control_plane"]["status"] == "ok"
    assert report["kubelet"]["path"] == str(kubelet) and 249 < report["kubelet"]["days_left"] <= 250
    assert len(report["certificates"]) == 14
    assert [c["days_left"] for c in report["certificates"]] == sorted(c["days_left"] for c in report["certificates"])


@pytest.mark.parametrize("name", expiry.RENEWABLE_CERTIFICATES + expiry.RENEWABLE_KUBECONFIGS)
def test_each_file_expiring_soon_is_named(tmp_path, name):
    kubernetes, kubelet = _tree(tmp_path, {name: 5})
    report = _report(kubernetes, kubelet)
    assert report["expiring"] == [str(kubernetes / name)] and report["expired"] == []
    assert report["control_plane"]["path"] == str(kubernetes / name) and report["control_plane"]["status"] == "expiring"
    assert report["control_plane_renewable"]["path"] == str(kubernetes / name)


def test_an_expired_certificate_and_kubeconfig_are_named_as_expired(tmp_path):
    kubernetes, kubelet = _tree(tmp_path, {"pki/apiserver.crt": -3, "admin.conf": -0.01, "pki/etcd/peer.crt": 10})
    report = _report(kubernetes, kubelet)
    assert report["expired"] == [str(kubernetes / "pki/apiserver.crt"), str(kubernetes / "admin.conf")]
    assert report["expiring"] == [str(kubernetes / "pki/etcd/peer.crt")]
    assert report["control_plane"]["status"] == "expired" and report["control_plane"]["days_left"] < -2.9


def test_the_threshold_decides_what_is_expiring(tmp_path):
    kubernetes, kubelet = _tree(tmp_path, {"admin.conf": 40})
    assert _report(kubernetes, kubelet, threshold=30)["expiring"] == []
    assert _report(kubernetes, kubelet, threshold=45)["expiring"] == [str(kubernetes / "admin.conf")]
    # Every file expires within 400 days: all of them are below that threshold.
    assert len(_report(kubernetes, kubelet, threshold=4000)["expiring"]) == 14


def test_a_ca_is_reported_but_not_renewable(tmp_path):
    kubernetes, kubelet = _tree(tmp_path, {"pki/front-proxy-ca.crt": 20})
    report = _report(kubernetes, kubelet)
    assert report["control_plane"]["path"] == str(kubernetes / "pki/front-proxy-ca.crt")
    assert report["control_plane"]["renewable"] is False and report["control_plane_renewable"]["days_left"] > 299


def test_a_worker_reads_only_its_kubelet_certificate(tmp_path):
    kubernetes, kubelet = _tree(tmp_path, {"kubelet": -1, "admin.conf": -1})
    report = _report(kubernetes, kubelet, control_plane=False)
    assert report["control_plane"] is None and report["expired"] == [str(kubelet)]
    assert [c["path"] for c in report["certificates"]] == [str(kubelet)]


def test_a_node_that_has_not_joined_has_nothing_and_that_is_no_error(tmp_path):
    report = _report(tmp_path / "etc/kubernetes", tmp_path / "kubelet.pem")
    assert report["certificates"] == [] and report["control_plane"] is None and report["kubelet"] is None
    assert len(report["missing"]) == 14


def test_a_kubeconfig_with_its_certificate_in_a_file_beside_it(tmp_path):
    kubernetes, kubelet = _tree(tmp_path, {})
    (kubernetes / "pki/admin.crt").write_bytes(_pem(_certificate("admin", -2)))
    (kubernetes / "admin.conf").write_text(_kubeconfig(certificate_file="pki/admin.crt"))
    assert _report(kubernetes, kubelet)["expired"] == [str(kubernetes / "admin.conf")]


@pytest.mark.parametrize(
    "content, words",
    [
        (b"not a certificate", "holds no readable PEM certificate"),
        (_kubeconfig().encode(), "its user has no client certificate"),
        (b"users: []", "is not a kubeconfig with a user"),
        (b"users: [{user: {client-certificate-data: '!!'}}]", "client-certificate-data is not base64"),
    ],
)
def test_an_unreadable_file_fails_naming_it(tmp_path, content, words):
    kubernetes, kubelet = _tree(tmp_path, {})
    name = "pki/apiserver.crt" if content == b"not a certificate" else "controller-manager.conf"
    (kubernetes / name).write_bytes(content)
    with pytest.raises(expiry.ExpiryError, match=words) as raised:
        _report(kubernetes, kubelet)
    assert str(kubernetes / name) in str(raised.value)
