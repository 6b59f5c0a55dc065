# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    # Where a controller action takes the root secrets from (plugin_utils._secrets.SOURCE_OPTIONS).
    DOCUMENTATION = r"""
options:
  secrets_file:
    description:
      - The cluster's root secrets file on the controller (0600; ansible-vault encrypted files are read too), as
        M(confidential.kubernetes.seal_init_secrets) wrote it. Never created here. A path, not a secret.
      - Needed unless O(share_files) or O(shares) are given.
    type: path
  share_files:
    description:
      - Break-glass shares (files 0600, as C(split_secrets.yml) wrote them), used instead of O(secrets_file). Any k of
        the n shares of a split reconstruct the root secrets in memory, nothing is written. A share of another
        cluster or of another split, a damaged share, or fewer than k shares are refused by name.
    type: list
    elements: path
    default: []
  shares:
    description:
      - Share lines (C(ck-share-v1....), as typed at C(recover.yml)'s or C(restore.yml)'s prompt), added to
        O(share_files).
    type: list
    elements: str
    default: []
"""
