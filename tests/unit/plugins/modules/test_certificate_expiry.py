# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""certificate_expiry on a tree of certificates the test makes to expire soon or to have expired (real clock)."""

from __future__ import annotations

import base64
import datetime

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm import expiry
from ansible_collections.confidential.kubernetes.plugins.modules import certificate_expiry
from module_runner import module_outcome, run_main  # noqa: F401  # pylint: disable=unused-import

KEY = ec.generate_private_key(ec.SECP256R1())


def _pem(days: float) -> bytes:
    now = datetime.datetime.now(datetime.timezone.utc)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test")])
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(KEY.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=400))
        .not_valid_after(now + datetime.timedelta(days=days))
        .sign(KEY, hashes.SHA256())
        .public_bytes(serialization.Encoding.PEM)
    )


def test_reports_expiring_and_expired_files_and_fails_on_a_bad_one(tmp_path):
    kubernetes = tmp_path / "kubernetes"
    for name in expiry.RENEWABLE_CERTIFICATES + expiry.AUTHORITIES:
        (kubernetes / name).parent.mkdir(parents=True, exist_ok=True)
        (kubernetes / name).write_bytes(_pem(3 if name == "pki/etcd/server.crt" else 300))
    for name in expiry.RENEWABLE_KUBECONFIGS:
        (kubernetes / name).write_text(
            f"users:\n- user:\n    client-certificate-data: {base64.b64encode(_pem(200)).decode()}\n"
        )
    kubelet = tmp_path / "kubelet.pem"
    kubelet.write_bytes(_pem(100))
    joinservice = tmp_path / "joinservice.crt"
    joinservice.write_bytes(_pem(-1))
    args = {
        "control_plane": True,
        "kubernetes_dir": str(kubernetes),
        "kubelet_client_certificate": str(kubelet),
        "certificates": [str(joinservice)],
    }
    result = run_main(certificate_expiry.main, args)
    assert not result["failed"] and not result["changed"]
    assert result["expiring"] == [str(kubernetes / "pki/etcd/server.crt")] and result["expired"] == [str(joinservice)]
    assert result["control_plane"]["path"] == str(kubernetes / "pki/etcd/server.crt")
    assert result["kubelet"]["path"] == str(kubelet) and result["certificates"][0]["group"] == "other"
    (kubernetes / "scheduler.conf").write_text("kind: Config\n")
    failed = run_main(certificate_expiry.main, args)
    assert failed["failed"] and str(kubernetes / "scheduler.conf") in failed["msg"]
    negative = run_main(certificate_expiry.main, dict(args, threshold_days=-1))
    assert negative["failed"] and "threshold_days" in negative["msg"]
