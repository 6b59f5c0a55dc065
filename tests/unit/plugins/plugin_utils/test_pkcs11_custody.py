# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The root secrets file wrapped by a non-extractable AES key in a real PKCS#11 token (SoftHSM2), read through the
controller's one loader. SoftHSM2 reads SOFTHSM2_CONF once per process, so every test makes its own token directory
and runs the token's side in its own Python process."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.root_secrets import RootSecrets

SOFTHSM = "/usr/lib/softhsm/libsofthsm2.so"
REPO = Path(__file__).resolve().parents[4]
SECRETS = RootSecrets(bytes(range(32)), bytes(range(32, 64)), bytes(range(64, 96)))
PIN = "4711-custody"

pytestmark = [
    pytest.mark.skipif(not os.path.exists(SOFTHSM), reason="SoftHSM2 is not installed (apt-get install -y softhsm2)"),
    pytest.mark.skipif(
        importlib.util.find_spec("pkcs11") is None,
        reason="python-pkcs11 is not installed (pip install -r requirements.txt)",
    ),
]


def _python(env: dict, code: str) -> dict:
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO / ".venv" / "collections"), **env),
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.fixture
def token(tmp_path):
    """A fresh SoftHSM2 token 'ck-custody' with a non-extractable AES key 'ck-root' and an extractable one 'ck-weak'."""
    (tmp_path / "tokens").mkdir()
    conf = tmp_path / "softhsm2.conf"
    conf.write_text(f"directories.tokendir = {tmp_path / 'tokens'}\nobjectstore.backend = file\nlog.level = ERROR\n")
    env = {"SOFTHSM2_CONF": str(conf), "CK_TEST_PIN": PIN}
    subprocess.run(
        ["softhsm2-util", "--init-token", "--free", "--label", "ck-custody", "--pin", PIN, "--so-pin", "so-" + PIN],
        env=dict(os.environ, **env),
        capture_output=True,
        check=True,
    )
    _python(
        env,
        f"""
        import json, pkcs11
        from pkcs11 import Attribute, KeyType
        token = pkcs11.lib({SOFTHSM!r}).get_token(token_label="ck-custody")
        with token.open(user_pin={PIN!r}, rw=True) as session:
            for label, extractable in (("ck-root", False), ("ck-weak", True)):
                session.generate_key(KeyType.AES, 256, label=label, store=True,
                                     template={{Attribute.EXTRACTABLE: extractable, Attribute.SENSITIVE: not extractable}})
        print(json.dumps({{}}))
        """,
    )
    return env


def _wrap(env: dict, path: Path, key_label: str = "ck-root") -> dict:
    return _python(
        env,
        f"""
        import json, os
        from ansible_collections.confidential.kubernetes.plugins.plugin_utils import _pkcs11
        from ansible_collections.confidential.kubernetes.plugins.module_utils._files import write_private_file
        custody = _pkcs11.Custody({SOFTHSM!r}, "ck-custody", {key_label!r}, pin_env="CK_TEST_PIN")
        try:
            write_private_file({str(path)!r}, _pkcs11.wrap(json.dumps({SECRETS.to_document()!r}).encode(), custody))
            print(json.dumps({{"ok": True}}))
        except _pkcs11.Pkcs11Error as exc:
            print(json.dumps({{"error": str(exc)}}))
        """,
    )


def _load(env: dict, path: Path) -> dict:
    return _python(
        env,
        f"""
        import json
        from ansible.parsing.dataloader import DataLoader
        from ansible_collections.confidential.kubernetes.plugins.plugin_utils import _secrets
        try:
            print(json.dumps({{"secrets": _secrets.load({str(path)!r}, DataLoader()).to_document()}}))
        except _secrets.ClusterSecretsError as exc:
            print(json.dumps({{"error": str(exc)}}))
        """,
    )


@pytest.fixture
def wrapped(token, tmp_path) -> Path:
    path = tmp_path / "secrets" / "cluster-secrets.json"
    assert _wrap(token, path) == {"ok": True}
    return path


def test_wrap_and_unwrap_round_trip_through_the_loader(token, wrapped):
    document = json.loads(wrapped.read_text())
    assert set(document["pkcs11_wrapped"]) == {
        "module", "token_label", "key_label", "pin_env", "pin_file", "nonce", "ciphertext"
    }  # fmt: skip
    assert SECRETS.to_document()["master_key"] not in wrapped.read_text() and PIN not in wrapped.read_text()
    assert (wrapped.stat().st_mode & 0o777) == 0o600
    assert _load(token, wrapped) == {"secrets": SECRETS.to_document()}


def test_a_pin_from_a_private_file_works(token, wrapped, tmp_path):
    pin_file = tmp_path / "pin"
    pin_file.write_text(PIN + "\n")
    pin_file.chmod(0o600)
    document = json.loads(wrapped.read_text())
    document["pkcs11_wrapped"].update(pin_env=None, pin_file=str(pin_file))
    wrapped.write_text(json.dumps(document))
    # The PIN source is in the authenticated header: changing it after wrapping is a tampered file.
    assert "fails authentication" in _load(token, wrapped)["error"]


def test_a_wrong_pin_is_named_and_changes_nothing(token, wrapped):
    before = wrapped.read_bytes()
    result = _load(dict(token, CK_TEST_PIN="0000"), wrapped)
    assert result == {"error": "the PIN of PKCS#11 token 'ck-custody' is wrong"}
    assert wrapped.read_bytes() == before


def test_an_unset_pin_variable_is_named(token, wrapped):
    env = dict(token)
    env["CK_TEST_PIN"] = ""
    assert "environment variable CK_TEST_PIN, which is unset" in _load(env, wrapped)["error"]


def test_a_missing_token_is_named(token, wrapped, tmp_path):
    (tmp_path / "empty").mkdir()
    conf = tmp_path / "empty.conf"
    conf.write_text(f"directories.tokendir = {tmp_path / 'empty'}\nobjectstore.backend = file\nlog.level = ERROR\n")
    result = _load(dict(token, SOFTHSM2_CONF=str(conf)), wrapped)
    assert result == {"error": f"no PKCS#11 token labelled 'ck-custody' in {SOFTHSM}"}


def test_an_extractable_key_is_refused_and_nothing_is_written(token, tmp_path):
    path = tmp_path / "secrets" / "cluster-secrets.json"
    result = _wrap(token, path, "ck-weak")
    assert "is extractable or not sensitive" in result["error"]
    assert not path.exists()


@pytest.mark.parametrize("field", ["ciphertext", "nonce", "key_label"])
def test_a_tampered_wrapped_file_fails_authentication(token, wrapped, field):
    document = json.loads(wrapped.read_text())
    body = document["pkcs11_wrapped"]
    if field == "key_label":
        body[field] = "ck-weak"
    else:
        raw = bytearray(__import__("base64").b64decode(body[field]))
        raw[0] ^= 1
        body[field] = __import__("base64").b64encode(bytes(raw)).decode()
    wrapped.write_text(json.dumps(document))
    before = wrapped.read_bytes()
    error = _load(token, wrapped)["error"]
    assert "fails authentication" in error or "is extractable" in error, error
    assert wrapped.read_bytes() == before


def _migrate(env: dict, call: str) -> dict:
    return _python(
        env,
        f"""
        import json
        from ansible.parsing.dataloader import DataLoader
        from ansible_collections.confidential.kubernetes.plugins.plugin_utils import _pkcs11, _secrets
        custody = _pkcs11.Custody({SOFTHSM!r}, "ck-custody", "ck-root", pin_env="CK_TEST_PIN")
        try:
            print(json.dumps({{"cluster_id": _secrets.{call}}}))
        except _secrets.ClusterSecretsError as exc:
            print(json.dumps({{"error": str(exc)}}))
        """,
    )


@pytest.fixture
def plain(tmp_path) -> Path:
    path = tmp_path / "secrets" / "cluster-secrets.json"
    path.parent.mkdir()
    path.write_text(json.dumps(SECRETS.to_document()))
    path.chmod(0o600)
    return path


def test_migration_wraps_a_plain_file_and_back_only_when_confirmed(token, plain):
    cluster_id = SECRETS.cluster_id().hex()
    assert _migrate(token, f"wrap_in_token({str(plain)!r}, custody, DataLoader())") == {"cluster_id": cluster_id}
    assert "pkcs11_wrapped" in json.loads(plain.read_text())
    assert _load(token, plain) == {"secrets": SECRETS.to_document()}
    again = _migrate(token, f"wrap_in_token({str(plain)!r}, custody, DataLoader())")
    assert "is already wrapped" in again["error"]
    wrapped = plain.read_bytes()
    refused = _migrate(token, f"unwrap_to_plain({str(plain)!r}, 'yes', DataLoader())")
    assert f"confirm with the cluster ID {cluster_id}" in refused["error"] and plain.read_bytes() == wrapped
    assert _migrate(token, f"unwrap_to_plain({str(plain)!r}, {cluster_id!r}, DataLoader())") == {
        "cluster_id": cluster_id
    }
    assert json.loads(plain.read_text()) == SECRETS.to_document() and (plain.stat().st_mode & 0o777) == 0o600


def test_migration_with_a_wrong_pin_leaves_the_plain_file(token, plain):
    before = plain.read_bytes()
    result = _migrate(dict(token, CK_TEST_PIN="0000"), f"wrap_in_token({str(plain)!r}, custody, DataLoader())")
    assert "the PIN of PKCS#11 token 'ck-custody' is wrong" in result["error"] and "left as it was" in result["error"]
    assert plain.read_bytes() == before
