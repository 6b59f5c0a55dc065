# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The cluster's root secrets on the controller: generated once, 0600, ansible-vault aware, never overwritten."""

from __future__ import annotations

import json
import os

from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.root_secrets import (
    FIELDS,
    SECRET_BYTES,
    RootSecrets,
    RootSecretsError,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._files import create_file_exclusively


class ClusterSecretsError(RuntimeError):
    """The secrets file cannot be read, is malformed, or is readable by others."""


def load_or_create(path: str, loader) -> tuple[RootSecrets, bool]:
    """Load the secrets (decrypting an ansible-vault file through ``loader``) or create them once.

    Returns (secrets, created). A new file is created exclusively, complete and with mode 0600, so two concurrent plays
    can never both create (and one overwrite) the secrets, and a crash never leaves a half-written file.
    """
    path = os.path.expanduser(path)
    if not os.path.exists(path):
        secrets = RootSecrets(*(os.urandom(SECRET_BYTES) for _name in FIELDS))
        try:
            create_file_exclusively(path, (json.dumps(secrets.to_document(), indent=2) + "\n").encode(), 0o600)
        except FileExistsError:
            return _load(path, loader), False
        return secrets, True
    return _load(path, loader), False


def load(path: str, loader) -> RootSecrets:
    """Load existing secrets; a missing file is an error (only the init flow creates it)."""
    path = os.path.expanduser(path)
    if not os.path.exists(path):
        raise ClusterSecretsError(
            f"cluster secrets file {path} does not exist: initialise the cluster first (playbook init.yml)"
        )
    return _load(path, loader)


def _load(path: str, loader) -> RootSecrets:
    mode = os.stat(path).st_mode & 0o777
    if mode & 0o077:
        raise ClusterSecretsError(
            f"cluster secrets file {path} has mode {mode:04o}; it must not be readable by group or others (chmod 600)"
        )
    try:
        payload = loader.load_from_file(path)
    except Exception as exc:  # noqa: BLE001 - the loader raises AnsibleError, vault errors and OSError alike
        raise ClusterSecretsError(f"cannot read cluster secrets file {path}: {type(exc).__name__}") from None
    try:
        return RootSecrets.from_document(payload, f"cluster secrets file {path}")
    except RootSecretsError as exc:
        raise ClusterSecretsError(str(exc)) from None
