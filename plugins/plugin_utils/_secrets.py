# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The cluster's root secrets on the controller: generated once, 0600, ansible-vault aware, never overwritten; or
reconstructed in memory from k break-glass shares (``_shares``)."""

from __future__ import annotations

import json
import os

from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.root_secrets import (
    FIELDS,
    SECRET_BYTES,
    RootSecrets,
    RootSecretsError,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._files import (
    FileTooLargeError,
    create_file_exclusively,
    read_bounded,
    write_private_file,
)
from ansible_collections.confidential.kubernetes.plugins.plugin_utils import _pkcs11, _shares


# What split_secrets.yml leaves at the secrets file's path once the plain file is removed: no secret, but the file
# still exists, so init never creates new secrets there and every loader says where the secrets went.
SPLIT_MARKER = "split_into_shares"


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
    if _pkcs11.is_wrapped(payload):
        try:
            payload = json.loads(_pkcs11.unwrap(payload, f"cluster secrets file {path}"))
        except _pkcs11.Pkcs11Error as exc:
            raise ClusterSecretsError(str(exc)) from None
        except ValueError:
            raise ClusterSecretsError(f"cluster secrets file {path}: its unwrapped content is not JSON") from None
    if isinstance(payload, dict) and SPLIT_MARKER in payload:
        split = payload[SPLIT_MARKER] if isinstance(payload[SPLIT_MARKER], dict) else {}
        raise ClusterSecretsError(
            f"cluster secrets file {path} holds no secrets: they were split into {split.get('threshold', 'k')}-of-"
            f"{split.get('count', 'n')} break-glass shares of cluster {str(split.get('cluster_id', ''))[:16]}... and "
            "removed from the controller; give k of them (share_files, or the playbook's share prompt)"
        )
    try:
        return RootSecrets.from_document(payload, f"cluster secrets file {path}")
    except RootSecretsError as exc:
        raise ClusterSecretsError(str(exc)) from None


# The options of every controller action that reads the root secrets: the secrets file, or k shares instead of it.
SOURCE_OPTIONS = dict(
    secrets_file=dict(type="path"),
    share_files=dict(type="list", elements="path", default=[]),
    # Share lines typed at a prompt; a share alone reveals nothing, but k of them are the secrets.
    shares=dict(type="list", elements="str", default=[], no_log=True),
)
MAX_SHARE_BYTES = 64 * 1024


def load_from(params: dict, loader) -> RootSecrets:
    """The root secrets from the task's ``SOURCE_OPTIONS``: reconstructed in memory from the shares when any are given
    (nothing is written), else loaded from the secrets file."""
    if params.get("share_files") or params.get("shares"):
        return load_shares(params.get("share_files") or [], params.get("shares") or [])
    if not params.get("secrets_file"):
        raise ClusterSecretsError("the root secrets are needed: give secrets_file, or k share_files or shares")
    return load(params["secrets_file"], loader)


def load_shares(share_files: list[str], shares: list[str], cluster_id: str | None = None) -> RootSecrets:
    """Reconstruct the root secrets from share files (0600, as the split wrote them) and typed share lines."""
    parsed = []
    for path in share_files:
        path = os.path.expanduser(path)
        try:
            mode = os.stat(path).st_mode & 0o777
            if mode & 0o077:
                raise ClusterSecretsError(
                    f"share file {path} has mode {mode:04o}; it must not be readable by group or others (chmod 600)"
                )
            text = read_bounded(path, MAX_SHARE_BYTES).decode("utf-8", "replace")
        except OSError as exc:
            raise ClusterSecretsError(f"cannot read share file {path}: {exc.strerror}") from None
        except FileTooLargeError as exc:
            raise ClusterSecretsError(f"share file {exc}") from None
        parsed.append(_parse(text, f"share file {path}"))
    for number, line in enumerate(shares, start=1):
        parsed.append(_parse(line, f"share #{number} entered"))
    try:
        return _shares.combine(parsed, cluster_id)
    except _shares.ShareError as exc:
        raise ClusterSecretsError(f"cannot reconstruct the root secrets from shares: {exc}") from None


def _parse(text: str, source: str) -> _shares.Share:
    try:
        return _shares.Share.parse(text, source)
    except _shares.ShareError as exc:
        raise ClusterSecretsError(str(exc)) from None


def split_marker(cluster_id: str, threshold: int, count: int) -> bytes:
    """The document that replaces the secrets file once its secrets live only in shares (nothing secret in it)."""
    return (
        json.dumps({SPLIT_MARKER: dict(cluster_id=cluster_id, threshold=threshold, count=count)}, indent=2) + "\n"
    ).encode()


def wrap_in_token(path: str, custody: _pkcs11.Custody, loader) -> str:
    """Replace the plain secrets file by its PKCS#11-wrapped form, checked by unwrapping before it is written; returns
    the cluster ID. A wrapped or split file, a wrong PIN, a missing token or an extractable key change nothing."""
    path = os.path.expanduser(path)
    secrets = load(path, loader)
    with open(path, "rb") as handle:
        if _pkcs11.is_wrapped(_json_or_none(handle.read())):
            raise ClusterSecretsError(f"cluster secrets file {path} is already wrapped by a PKCS#11 key")
    plain = json.dumps(secrets.to_document(), indent=2).encode()
    try:
        wrapped = _pkcs11.wrap(plain, custody)
        if _pkcs11.unwrap(json.loads(wrapped), path) != plain:
            raise ClusterSecretsError(f"the token did not give back what it wrapped: {path} left as it was")
    except _pkcs11.Pkcs11Error as exc:
        raise ClusterSecretsError(f"{exc}: {path} left as it was") from None
    write_private_file(path, wrapped)
    return secrets.cluster_id().hex()


def unwrap_to_plain(path: str, confirm: str, loader) -> str:
    """Replace a PKCS#11-wrapped secrets file by the plain one (0600), only when ``confirm`` is the cluster ID."""
    path = os.path.expanduser(path)
    with open(path, "rb") as handle:
        if not _pkcs11.is_wrapped(_json_or_none(handle.read())):
            raise ClusterSecretsError(f"cluster secrets file {path} is not wrapped by a PKCS#11 key")
    secrets = load(path, loader)
    cluster_id = secrets.cluster_id().hex()
    if confirm != cluster_id:
        raise ClusterSecretsError(f"refusing to write {path} in plain: confirm with the cluster ID {cluster_id}")
    write_private_file(path, (json.dumps(secrets.to_document(), indent=2) + "\n").encode())
    return cluster_id


def _json_or_none(data: bytes) -> object:
    try:
        return json.loads(data)
    except ValueError:
        return None  # ansible-vault text, or not JSON at all
