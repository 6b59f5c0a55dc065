# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller's one loader of the root secrets: the secrets file, or k shares instead, or the split marker."""

from __future__ import annotations

import json
import os

import pytest
from ansible.parsing.dataloader import DataLoader

from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.root_secrets import RootSecrets
from ansible_collections.confidential.kubernetes.plugins.plugin_utils import _secrets, _shares
from ansible_collections.confidential.kubernetes.plugins.plugin_utils._secrets import ClusterSecretsError

SECRETS = RootSecrets(bytes(range(32)), bytes(range(32, 64)), bytes(range(64, 96)))


def _share_files(tmp_path, shares: list[_shares.Share]) -> list[str]:
    paths = []
    for share in shares:
        path = tmp_path / f"share-{share.index}.txt"
        path.write_text(share.file_text())
        path.chmod(0o600)
        paths.append(str(path))
    return paths


def test_k_share_files_and_typed_lines_reconstruct_without_the_secrets_file(tmp_path):
    shares = _shares.split(SECRETS, 3, 5)
    params = dict(
        secrets_file=str(tmp_path / "missing.json"),
        share_files=_share_files(tmp_path, shares[:2]),
        shares=[f"  {shares[4].line()}  "],
    )
    assert _secrets.load_from(params, DataLoader()) == SECRETS
    assert sorted(os.listdir(tmp_path)) == ["share-1.txt", "share-2.txt"]


def test_without_any_source_it_says_what_to_give():
    with pytest.raises(ClusterSecretsError, match="give secrets_file, or k share_files or shares"):
        _secrets.load_from(dict(secrets_file=None, share_files=[], shares=[]), DataLoader())


def test_a_missing_share_file_is_named(tmp_path):
    with pytest.raises(ClusterSecretsError, match=f"cannot read share file {tmp_path}/nope.txt: No such file"):
        _secrets.load_shares([str(tmp_path / "nope.txt")], [])


def test_a_typed_line_is_named_by_its_position():
    shares = _shares.split(SECRETS, 2, 3)
    with pytest.raises(ClusterSecretsError, match="share #2 entered is damaged"):
        _secrets.load_shares([], [shares[0].line(), shares[1].line()[:-1] + "0"])


def test_the_split_marker_tells_where_the_secrets_went_and_init_creates_nothing(tmp_path):
    path = tmp_path / "cluster-secrets.json"
    path.write_bytes(_secrets.split_marker(SECRETS.cluster_id().hex(), 3, 5))
    path.chmod(0o600)
    before = path.read_bytes()
    for call in (_secrets.load, _secrets.load_or_create):
        with pytest.raises(ClusterSecretsError, match="were split into 3-of-5 break-glass shares"):
            call(str(path), DataLoader())
    assert path.read_bytes() == before and "master_key" not in json.loads(before)["split_into_shares"]
