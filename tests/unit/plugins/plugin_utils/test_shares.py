# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""k-of-n shares of the root secrets: pycryptodome's Shamir over GF(2^128) as the oracle, and every refusal by name."""

from __future__ import annotations

import itertools
import json

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.root_secrets import RootSecrets
from ansible_collections.confidential.kubernetes.plugins.plugin_utils import _shares
from ansible_collections.confidential.kubernetes.plugins.plugin_utils._shares import Share, ShareError

SECRETS = RootSecrets(bytes(range(32)), bytes(range(32, 64)), bytes(range(64, 96)))
OTHER = RootSecrets(bytes(32), bytes(32), bytes(32))

# Made by pycryptodome 3.x/4.x's Crypto.Protocol.SecretSharing.Shamir.split(k, n, secret) with its random source
# replaced by the listed coefficients (highest degree first); Shamir.combine also recombined shares of our split_block.
PYCRYPTODOME_VECTORS = json.loads(
    """[{"k": 2, "n": 3, "secret": "5b11618c2e44027877d0cd0921ed166b", "coefficients": ["79cc42d3cdcec4b0a1ab44f9eb43220b"],
 "shares": [[1, "22dd235fe38ac6c8d67b89f0caae3460"], [2, "a889e42bb5d98b19348644faf76b527d"],
 [3, "d145a6f878174fa9952d00031c287076"]]},
 {"k": 3, "n": 5, "secret": "35224d0d3465d74e855f8d69a136e79c",
 "coefficients": ["415b911dce87f20860ef02313a9bd147", "2cda33b29d7cfeeb8b521c522765c09a"],
 "shares": [[1, "58a3efa2679edbad6ee2930abcc8f641"], [2, "69f86e1f3483e2b81047bd0905922333"],
 [3, "0479ccb06778ee5bfbfaa36a186c32ee"], [4, "93f3921ba9e90c66a6e7df32951cf398"],
 [5, "fe7230b4fa1200854d5ac15188e2e245"]]},
 {"k": 5, "n": 8, "secret": "e0d9ac7d3719d04d3d68bc463498b088",
 "coefficients": ["6eae87a654a263e95bf1029078b66511", "c5663a26f7ef24939af96235e87217de",
 "57ad96a9aedce3c6e1fcd2e4cffd2ac8", "1be497e2c80dc176cff542b9d6618f42"],
 "shares": [[1, "075810b6f285b587d2694cbebdc067cd"], [2, "487f724ce92ec7b24daa4a0e6f59ea4b"],
 [3, "30aa52511cd07911fcbcf64a972d4cc4"], [4, "029bb685a34a2445522a85ef382ceb06"],
 [5, "a6e140bac7989af87958de9e979d1976"], [6, "50998e05fe6be8f0d2521644ea8e3d89"],
 [7, "6bb7e4ecaadb8d24a73701893413be33"], [8, "f09691a5383898c9df1b7ce0faa37a53"]]}]"""
)


@pytest.mark.parametrize("vector", PYCRYPTODOME_VECTORS, ids=lambda v: f"{v['k']}-of-{v['n']}")
def test_split_block_matches_pycryptodome(vector):
    coefficients = iter(bytes.fromhex(c) for c in vector["coefficients"])
    shares = _shares.split_block(
        bytes.fromhex(vector["secret"]), vector["k"], vector["n"], lambda size: next(coefficients)
    )
    assert [[index, value.hex()] for index, value in shares] == vector["shares"]


@pytest.mark.parametrize("vector", PYCRYPTODOME_VECTORS, ids=lambda v: f"{v['k']}-of-{v['n']}")
def test_any_k_of_pycryptodomes_shares_combine_to_its_secret(vector):
    shares = [(index, bytes.fromhex(value)) for index, value in vector["shares"]]
    for subset in itertools.combinations(shares, vector["k"]):
        assert _shares.combine_block(list(subset)).hex() == vector["secret"]


def _parsed(shares: list[Share]) -> list[Share]:
    return [Share.parse(share.file_text(), f"share file {share.index}") for share in shares]


@pytest.mark.parametrize("k, n", [(2, 2), (2, 3), (3, 5)])
def test_any_k_of_n_reconstruct_the_root_secrets(k, n):
    shares = _parsed(_shares.split(SECRETS, k, n))
    for subset in itertools.combinations(reversed(shares), k):
        assert _shares.combine(list(subset)) == SECRETS
    assert _shares.combine(shares) == SECRETS


def test_two_splits_of_the_same_secrets_differ_in_every_share():
    first, second = _shares.split(SECRETS, 3, 5), _shares.split(SECRETS, 3, 5)
    assert all(a.value != b.value for a, b in zip(first, second))


def test_k_minus_one_shares_are_refused_and_nothing_is_combined(monkeypatch):
    shares = _parsed(_shares.split(SECRETS, 3, 5))

    def never(_shares):
        raise AssertionError("combined with fewer than k shares")

    monkeypatch.setattr(_shares, "combine_block", never)
    with pytest.raises(ShareError, match=r"2 share\(s\) given, 3 of 5 needed: nothing was reconstructed"):
        _shares.combine(shares[:2])


def test_k_minus_one_shares_fit_every_secret_equally():
    """Perfect secrecy, made concrete: through k-1 shares of a block and any candidate secret at 0 passes exactly one
    polynomial of degree k-1, so the k-th share it implies exists for every candidate."""
    shares = _shares.split_block(bytes(16), 3, 3)
    for candidate in (bytes(16), b"\xff" * 16, bytes(range(16))):
        # Interpolate through (0, candidate) and the first two shares; evaluated back at 0 it is the candidate.
        points = [(0, candidate), *shares[:2]]
        implied = _lagrange_at(points, 3)
        assert _shares.combine_block([*shares[:2], (3, implied)]) == candidate


def _lagrange_at(points: list[tuple[int, bytes]], x: int) -> bytes:
    result = 0
    for j, (x_j, y_j) in enumerate(points):
        term = int.from_bytes(y_j, "big")
        for m, (x_m, _y) in enumerate(points):
            if m != j:
                term = _shares._multiply(term, _shares._multiply(x ^ x_m, _shares._inverse(x_j ^ x_m)))
        result ^= term
    return result.to_bytes(16, "big")


def test_a_share_of_another_cluster_is_named():
    ours, theirs = _parsed(_shares.split(SECRETS, 2, 3)), _shares.split(OTHER, 2, 3)
    stranger = Share.parse(theirs[1].line(), "the share typed second")
    with pytest.raises(ShareError, match="the share typed second is a share of another cluster"):
        _shares.combine([ours[0], stranger])


def test_a_share_of_another_cluster_is_named_against_the_expected_cluster_id():
    theirs = _parsed(_shares.split(OTHER, 2, 3))
    with pytest.raises(ShareError, match="share file 1 is a share of another cluster"):
        _shares.combine(theirs, cluster_id=SECRETS.cluster_id().hex())


@pytest.mark.parametrize("position", [20, 70, 150, 200, -12, -3])
def test_a_corrupted_share_is_named_before_anything_is_combined(position):
    line = _shares.split(SECRETS, 2, 3)[0].line()
    flipped = "A" if line[position] != "A" else "B"
    damaged = line[:position] + flipped + line[position + 1 :]
    with pytest.raises(ShareError, match="share of alice is damaged: its checksum does not match"):
        Share.parse(damaged, "share of alice")


def test_a_forged_share_with_a_recomputed_checksum_fails_reconstruction():
    shares = _shares.split(SECRETS, 2, 3)
    value = bytearray(shares[1].value)
    value[0] ^= 1
    forged = Share(shares[1].cluster_id, 2, 3, 2, bytes(value), shares[1].mac)
    parsed = Share.parse(forged.line(), "share of bob")
    with pytest.raises(ShareError, match="do not reconstruct cluster .*forged"):
        _shares.combine([Share.parse(shares[0].line(), "share of alice"), parsed])


def test_a_forged_extra_share_is_named_by_its_mac():
    shares = _shares.split(SECRETS, 2, 3)
    value = bytearray(shares[2].value)
    value[5] ^= 1
    forged = Share.parse(Share(shares[2].cluster_id, 2, 3, 3, bytes(value), shares[2].mac).line(), "share of carol")
    with pytest.raises(ShareError, match="share of carol fails its MAC"):
        _shares.combine([*_parsed(shares[:2]), forged])


def test_the_same_share_twice_is_refused():
    share = _shares.split(SECRETS, 2, 3)[0]
    with pytest.raises(ShareError, match="are both share 1"):
        _shares.combine([Share.parse(share.line(), "a"), Share.parse(share.line(), "b")])


def test_shares_of_different_splits_are_refused_by_name():
    first, second = _shares.split(SECRETS, 2, 3), _shares.split(SECRETS, 3, 5)
    with pytest.raises(ShareError, match="b is of a 3-of-5 split, a of a 2-of-3 one"):
        _shares.combine([Share.parse(first[0].line(), "a"), Share.parse(second[1].line(), "b")])


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "is not a share"),
        ("# only a comment\n", "is not a share"),
        ("hello.world", "is not a share"),
        ("a\nb\n", "is not a share"),
    ],
)
def test_text_that_is_no_share_is_refused(text, message):
    with pytest.raises(ShareError, match=f"share file {message}"):
        Share.parse(text, "share file")


@pytest.mark.parametrize("k, n", [(1, 3), (4, 3), (2, 256)])
def test_impossible_thresholds_are_refused(k, n):
    with pytest.raises(ShareError, match="2 <= k <= n <= 255"):
        _shares.split(SECRETS, k, n)


def test_no_share_text_holds_the_secrets():
    text = "".join(share.file_text() for share in _shares.split(SECRETS, 2, 3))
    for value in (SECRETS.master_key, SECRETS.master_salt, SECRETS.measurement_salt):
        assert value.hex() not in text and _shares._b64(value) not in text
