"""Join request checks and the kubelet client certificate, table-driven."""

from __future__ import annotations

import datetime

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import NameOID

from ansible_collections.confidential.kubernetes.plugins.module_utils._join.pki import (
    ClusterPki,
    PkiError,
    RequestError,
    check_disk_uuid,
    check_node_name,
    load_kubelet_csr,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm.ca import make_missing_cas, missing_cas

from join_harness import make_cluster_pki, make_csr


@pytest.mark.parametrize("name", ["worker-1", "cp.example.com", "a", "0node", "x" * 253])
def test_dns1123_node_names_are_accepted(name):
    assert check_node_name(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "Worker-1",
        "worker_1",
        "-worker",
        "worker-",
        "worker..1",
        "worker/1",
        "x" * 254,
        "wörker",
        "worker 1",
        "worker-1\n",
    ],
)
def test_other_node_names_are_refused(name):
    with pytest.raises(RequestError) as err:
        check_node_name(name)
    assert err.value.reason == "node-name"


def test_disk_uuid_is_normalised_to_lower_case():
    assert check_disk_uuid("0D3B1C4E-9F2A-4E57-8A61-2F4C9B7D5E13") == "0d3b1c4e-9f2a-4e57-8a61-2f4c9b7d5e13"


@pytest.mark.parametrize(
    "value",
    [
        "",
        "0d3b1c4e9f2a4e578a612f4c9b7d5e13",
        "0d3b1c4e-9f2a-4e57-8a61-2f4c9b7d5e1",
        "{0d3b1c4e-9f2a-4e57-8a61-2f4c9b7d5e13}",
        "0d3b1c4e-9f2a-4e57-8a61-2f4c9b7d5e13\n",
        "../../etc/passwd",
    ],
)
def test_malformed_disk_uuids_are_refused(value):
    with pytest.raises(RequestError) as err:
        check_disk_uuid(value)
    assert err.value.reason == "disk-uuid"


def _subject(*attributes):
    return x509.Name([x509.NameAttribute(oid, value) for oid, value in attributes])


@pytest.mark.parametrize(
    "key",
    [
        rsa.generate_private_key(65537, 2048),
        ec.generate_private_key(ec.SECP256R1()),
        ec.generate_private_key(ec.SECP384R1()),
    ],
    ids=["RSA-2048", "P-256", "P-384"],
)
def test_strong_keys_are_accepted(key):
    assert (
        load_kubelet_csr(make_csr("worker-1", key), "worker-1").subject.rfc4514_string()
        == "CN=system:node:worker-1,O=system:nodes"
    )


def test_subject_attribute_order_does_not_matter():
    subject = _subject((NameOID.COMMON_NAME, "system:node:worker-1"), (NameOID.ORGANIZATION_NAME, "system:nodes"))
    load_kubelet_csr(make_csr("worker-1", subject=subject), "worker-1")


def _tampered_csr() -> bytes:
    der = bytearray(x509.load_pem_x509_csr(make_csr("worker-1")).public_bytes(serialization.Encoding.DER))
    der[-3] ^= 0x01  # inside the signature
    return x509.load_der_x509_csr(bytes(der)).public_bytes(serialization.Encoding.PEM)


@pytest.mark.parametrize(
    "case, csr, reason",
    [
        ("RSA-1024", lambda: make_csr("worker-1", rsa.generate_private_key(65537, 1024)), "csr-key"),
        ("P-521", lambda: make_csr("worker-1", ec.generate_private_key(ec.SECP521R1())), "csr-key"),
        (
            "Ed25519",
            lambda: (
                x509.CertificateSigningRequestBuilder()
                .subject_name(
                    _subject((NameOID.ORGANIZATION_NAME, "system:nodes"), (NameOID.COMMON_NAME, "system:node:worker-1"))
                )
                .sign(ed25519.Ed25519PrivateKey.generate(), None)
                .public_bytes(serialization.Encoding.PEM)
            ),
            "csr-key",
        ),
        ("another node", lambda: make_csr("worker-2"), "csr-subject"),
        (
            "no group",
            lambda: make_csr("worker-1", subject=_subject((NameOID.COMMON_NAME, "system:node:worker-1"))),
            "csr-subject",
        ),
        (
            "masters group",
            lambda: make_csr(
                "worker-1",
                subject=_subject(
                    (NameOID.ORGANIZATION_NAME, "system:masters"), (NameOID.COMMON_NAME, "system:node:worker-1")
                ),
            ),
            "csr-subject",
        ),
        (
            "extra group",
            lambda: make_csr(
                "worker-1",
                subject=_subject(
                    (NameOID.ORGANIZATION_NAME, "system:nodes"),
                    (NameOID.ORGANIZATION_NAME, "system:masters"),
                    (NameOID.COMMON_NAME, "system:node:worker-1"),
                ),
            ),
            "csr-subject",
        ),
        (
            "extra OU",
            lambda: make_csr(
                "worker-1",
                subject=_subject(
                    (NameOID.ORGANIZATION_NAME, "system:nodes"),
                    (NameOID.ORGANIZATIONAL_UNIT_NAME, "x"),
                    (NameOID.COMMON_NAME, "system:node:worker-1"),
                ),
            ),
            "csr-subject",
        ),
        ("tampered signature", _tampered_csr, "csr-signature"),
        ("not PEM", lambda: b"hello", "csr-malformed"),
        ("too large", lambda: b"A" * 20000, "csr-malformed"),
    ],
)
def test_bad_csrs_are_refused_with_their_reason(case, csr, reason):
    with pytest.raises(RequestError) as err:
        load_kubelet_csr(csr(), "worker-1")
    assert err.value.reason == reason, case


def _rsa_cluster_pki(pki_dir) -> x509.Certificate:
    return make_cluster_pki(pki_dir)["ca_cert"]


def _ecdsa_cluster_pki(pki_dir) -> x509.Certificate:
    """The CAs kubeadm_init makes for kubeadm before 1.31 with ca_key_algorithm=ecdsa-p256."""
    make_missing_cas(str(pki_dir), missing_cas(str(pki_dir)))
    return x509.load_pem_x509_certificate((pki_dir / "ca.crt").read_bytes())


@pytest.mark.parametrize(
    "make_pki, signature_oid",
    [
        (_rsa_cluster_pki, x509.SignatureAlgorithmOID.RSA_WITH_SHA256),
        (_ecdsa_cluster_pki, x509.SignatureAlgorithmOID.ECDSA_WITH_SHA256),
    ],
    ids=["RSA-2048 CA", "ECDSA-P256 CA"],
)
def test_kubelet_client_certificate(tmp_path, make_pki, signature_oid):
    ca_cert = make_pki(tmp_path)
    pki = ClusterPki.load(str(tmp_path))
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime(2030, 1, 1, tzinfo=datetime.timezone.utc)
    kubelet_key = load_kubelet_csr(make_csr("worker-1", key), "worker-1").public_key()
    cert = x509.load_pem_x509_certificate(pki.sign_kubelet_client(kubelet_key, "worker-1", now))
    cert.verify_directly_issued_by(ca_cert)
    assert cert.signature_algorithm_oid == signature_oid
    assert cert.not_valid_after_utc == now + datetime.timedelta(days=365)
    assert cert.not_valid_before_utc <= now
    assert cert.signature_hash_algorithm.name == hashes.SHA256.name
    other = x509.load_pem_x509_certificate(pki.sign_kubelet_client(kubelet_key, "worker-1", now))
    assert cert.serial_number != other.serial_number and cert.serial_number.bit_length() > 64


def test_cluster_pki_refuses_a_key_that_is_not_the_cas(tmp_path):
    make_cluster_pki(tmp_path)
    (tmp_path / "ca.key").write_bytes((tmp_path / "front-proxy-ca.key").read_bytes())
    with pytest.raises(PkiError, match="not the key of"):
        ClusterPki.load(str(tmp_path))


def test_missing_control_plane_file_is_an_operator_error(tmp_path):
    make_cluster_pki(tmp_path)
    (tmp_path / "etcd" / "ca.key").unlink()
    with pytest.raises(PkiError, match="etcd/ca.key.*control-plane node"):
        ClusterPki.load(str(tmp_path)).control_plane_files()


def test_node_name_too_long_for_the_kubelet_certificate_is_refused():
    """Found by the fuzzer (tests/security): a valid DNS name of 53+ characters crashed the join with INTERNAL."""
    name = "n" * 53
    assert check_node_name(name) == name
    with pytest.raises(RequestError) as err:
        load_kubelet_csr(make_csr("worker-1"), name)
    assert err.value.reason == "node-name" and "at most 64 characters" in str(err.value)
    assert load_kubelet_csr(make_csr("n" * 52), "n" * 52)
