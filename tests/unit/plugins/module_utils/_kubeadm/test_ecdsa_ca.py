"""The ECDSA P-256 cluster CAs kubeadm_init makes for kubeadm before 1.31, and the encryptionAlgorithm it renders from
1.31: the CAs as kubeadm makes its own, made once, never overwritten, and taken by the real kubeadm 1.20."""

from __future__ import annotations

import datetime
import os
import stat
import subprocess

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm import InitOptions, render_init_config
from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm.ca import (
    KUBEADM_CAS,
    CaError,
    make_ca,
    make_missing_cas,
    missing_cas,
)

import control_plane


def test_a_ca_is_made_as_kubeadm_makes_one():
    now = datetime.datetime(2030, 1, 1, tzinfo=datetime.timezone.utc)
    cert_pem, key_pem = make_ca("kubernetes", now)
    cert = x509.load_pem_x509_certificate(cert_pem)
    assert (
        cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "kubernetes"
        and cert.issuer == cert.subject
    )
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey) and cert.public_key().curve.name == "secp256r1"
    assert cert.signature_algorithm_oid == x509.SignatureAlgorithmOID.ECDSA_WITH_SHA256
    cert.verify_directly_issued_by(cert)
    assert cert.not_valid_before_utc == now and cert.not_valid_after_utc == now + datetime.timedelta(days=3650)
    constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage)
    assert (
        usage.critical and usage.value.key_cert_sign and usage.value.digital_signature and usage.value.key_encipherment
    )
    assert cert.serial_number > 0
    # kubeadm's own EC key format.
    assert key_pem.startswith(b"-----BEGIN EC PRIVATE KEY-----")


def test_missing_cas_are_made_once_with_private_keys(tmp_path):
    assert missing_cas(str(tmp_path)) == ["ca", "front-proxy-ca", "etcd/ca"]
    make_missing_cas(str(tmp_path), missing_cas(str(tmp_path)))
    made = {
        name: (tmp_path / f"{name}.crt").read_bytes() + (tmp_path / f"{name}.key").read_bytes()
        for name, dummy in KUBEADM_CAS
    }
    for name, common_name in KUBEADM_CAS:
        assert stat.S_IMODE(os.stat(tmp_path / f"{name}.key").st_mode) == 0o600
        assert stat.S_IMODE(os.stat(tmp_path / f"{name}.crt").st_mode) == 0o644
        cert = x509.load_pem_x509_certificate((tmp_path / f"{name}.crt").read_bytes())
        assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == common_name
    # A second run finds nothing to make and changes nothing.
    assert missing_cas(str(tmp_path)) == []
    make_missing_cas(str(tmp_path), [])
    assert made == {
        name: (tmp_path / f"{name}.crt").read_bytes() + (tmp_path / f"{name}.key").read_bytes()
        for name, dummy in KUBEADM_CAS
    }
    # Each CA has its own key.
    assert (
        len(
            {
                x509.load_pem_x509_certificate((tmp_path / f"{n}.crt").read_bytes()).public_key().public_numbers()
                for n, d in KUBEADM_CAS
            }
        )
        == 3
    )


def test_a_ca_already_there_is_kept_and_only_the_others_are_made(tmp_path):
    cert, key = make_ca("kubernetes")
    (tmp_path / "ca.crt").write_bytes(cert)
    (tmp_path / "ca.key").write_bytes(key)
    assert missing_cas(str(tmp_path)) == ["front-proxy-ca", "etcd/ca"]
    make_missing_cas(str(tmp_path), missing_cas(str(tmp_path)))
    assert (tmp_path / "ca.crt").read_bytes() == cert and (tmp_path / "ca.key").read_bytes() == key


@pytest.mark.parametrize("present", ["crt", "key"])
def test_a_half_made_ca_is_an_error_that_names_the_file(tmp_path, present):
    (tmp_path / "etcd").mkdir()
    (tmp_path / "etcd" / f"ca.{present}").write_bytes(b"kept")
    with pytest.raises(CaError, match=f"etcd/ca.{present} exists without"):
        missing_cas(str(tmp_path))
    assert (tmp_path / "etcd" / f"ca.{present}").read_bytes() == b"kept" and not (tmp_path / "ca.crt").exists()


@pytest.mark.parametrize(
    "algorithm, api_version, expected",
    [
        ("ecdsa-p256", "v1beta4", "ECDSA-P256"),
        ("rsa-2048", "v1beta4", None),
        ("ecdsa-p256", "v1beta3", None),
        ("ecdsa-p256", "v1beta2", None),
    ],
)
def test_encryption_algorithm_is_rendered_where_kubeadm_has_it(algorithm, api_version, expected):
    cluster = list(yaml.safe_load_all(render_init_config(InitOptions(ca_key_algorithm=algorithm), api_version)))[1]
    assert cluster["kind"] == "ClusterConfiguration" and cluster.get("encryptionAlgorithm") == expected


def test_real_kubeadm_1_20_signs_its_certificates_with_the_ecdsa_cas(tmp_path):
    if control_plane.missing_binaries():
        pytest.skip("the real Kubernetes binaries are not built (tests/lab/lab kubernetes)")
    pki = tmp_path / "pki"
    make_missing_cas(str(pki), missing_cas(str(pki)))
    cas = {name: (pki / f"{name}.crt").read_bytes() + (pki / f"{name}.key").read_bytes() for name, dummy in KUBEADM_CAS}
    options = InitOptions(advertise_address="192.0.2.10", kubernetes_version="v1.20.2", ca_key_algorithm="ecdsa-p256")
    documents = list(yaml.safe_load_all(render_init_config(options, "v1beta2")))
    documents[1]["certificatesDir"] = str(pki)
    config = tmp_path / "kubeadm.yaml"
    config.write_text(yaml.safe_dump_all(documents))
    done = subprocess.run(
        [str(control_plane.binaries_dir() / "kubeadm"), "init", "phase", "certs", "all", f"--config={config}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Using existing ca certificate authority" in done.stdout, done.stdout
    assert cas == {
        name: (pki / f"{name}.crt").read_bytes() + (pki / f"{name}.key").read_bytes() for name, dummy in KUBEADM_CAS
    }
    for leaf, ca in (
        ("apiserver", "ca"),
        ("apiserver-kubelet-client", "ca"),
        ("front-proxy-client", "front-proxy-ca"),
        ("etcd/server", "etcd/ca"),
        ("apiserver-etcd-client", "etcd/ca"),
    ):
        cert = x509.load_pem_x509_certificate((pki / f"{leaf}.crt").read_bytes())
        cert.verify_directly_issued_by(x509.load_pem_x509_certificate((pki / f"{ca}.crt").read_bytes()))
        assert cert.signature_algorithm_oid == x509.SignatureAlgorithmOID.ECDSA_WITH_SHA256, leaf
        assert cert.signature_hash_algorithm.name == hashes.SHA256.name
