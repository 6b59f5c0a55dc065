from __future__ import annotations

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation.policy import node_lock_mark
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto import derive

# DESIGN section 2: known-answer vectors.
VECTORS = [
    (
        bytes(32),
        bytes(32),
        "key-00000000-0000-0000-0000-000000000000",
        "2b5c829f691bfd4232f8aac464bccc07e605c7c8e82cbca09837e86d0b6d0665",
    ),
    (
        bytes(range(0x00, 0x20)),
        bytes(range(0x20, 0x40)),
        "key-clusterID",
        "128c164378fe8767f998fbdfe4b4d6463ec5ae1b664ea5999bc27417607ae9b6",
    ),
    (
        bytes(range(0x40, 0x60)),
        bytes(range(0x60, 0x80)),
        "key-measurementSecret",
        "4790578891f3fe6cc22cb661ecdc1b7e33121b1287546a52ba33a9136719c213",
    ),
    # Computed with an independent RFC 5869 HKDF (the standard library's hmac), which also gives the three above.
    (
        bytes(range(0x80, 0xA0)),
        bytes(range(0xA0, 0xC0)),
        "key-etcdSecrets",
        "60e105c00f2ee2b2b3d2f9dabeeefffcba17111b309fa42c935fa973ee30f670",
    ),
    (
        bytes(range(0x80, 0xA0)),
        bytes(range(0xA0, 0xC0)),
        "key-etcdSecrets-1",
        "df1da3f527678cd7b57803db25dbd458f20344a2181083e4d3c277e0d90dabe2",
    ),
]


@pytest.mark.parametrize(
    "secret,salt,info,expected",
    VECTORS,
    ids=[
        "disk key of the zero UUID",
        "cluster ID",
        "measurement secret",
        "etcd Secrets key",
        "etcd Secrets key after one rotation",
    ],
)
def test_known_answer_vectors(secret, salt, info, expected):
    assert derive.derive(secret, salt, info).hex() == expected


def test_named_derivations_match_the_vectors():
    assert derive.state_disk_key(bytes(32), bytes(32), "00000000-0000-0000-0000-000000000000").hex() == VECTORS[0][3]
    assert derive.cluster_id(bytes(range(0x00, 0x20)), bytes(range(0x20, 0x40))).hex() == VECTORS[1][3]
    assert derive.measurement_secret(bytes(range(0x40, 0x60)), bytes(range(0x60, 0x80))).hex() == VECTORS[2][3]
    assert derive.etcd_secrets_key(bytes(range(0x80, 0xA0)), bytes(range(0xA0, 0xC0))).hex() == VECTORS[3][3]
    assert derive.etcd_secrets_key(bytes(range(0x80, 0xA0)), bytes(range(0xA0, 0xC0)), 1).hex() == VECTORS[4][3]


@pytest.mark.parametrize("generation", [-1, True, "1", 1.0])
def test_malformed_etcd_secrets_key_generation_is_refused(generation):
    with pytest.raises(derive.DerivationError, match="generation must be an integer >= 0"):
        derive.etcd_secrets_key(bytes(32), bytes(32), generation)


def test_disk_uuid_is_lower_cased_before_derivation():
    upper = derive.state_disk_key(bytes(32), bytes(32), "ABCDEF00-0000-0000-0000-000000000000")
    lower = derive.state_disk_key(bytes(32), bytes(32), "abcdef00-0000-0000-0000-000000000000")
    assert upper == lower


@pytest.mark.parametrize("uuid", ["", "not-a-uuid", "00000000-0000-0000-0000-00000000000g"])
def test_malformed_disk_uuid_is_refused(uuid):
    with pytest.raises(derive.DerivationError, match="is not a UUID"):
        derive.state_disk_key(bytes(32), bytes(32), uuid)


def test_info_without_key_prefix_is_refused():
    with pytest.raises(derive.DerivationError, match="must start with 'key-'"):
        derive.derive(bytes(32), bytes(32), "clusterID")


def test_short_secret_is_refused():
    with pytest.raises(derive.DerivationError, match="at least 32 bytes"):
        derive.derive(bytes(16), bytes(32), "key-clusterID")


def test_pcr15_vector_of_design_section_5():
    cluster_id = bytes.fromhex(VECTORS[1][3])
    assert node_lock_mark(cluster_id).hex() == "23400370357e846478cce7cc0c76cdfe4da077cc57b36dee0f665ede2c8b3f2f"
