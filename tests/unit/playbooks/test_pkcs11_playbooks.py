# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""pkcs11_custody.yml wraps the secrets file by a SoftHSM2 token's key, then restore.yml reads it through the loader
(its controller steps run before its confirmation refusal, as in test_restore_refusals), all by ansible-playbook."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_restore_refusals import CLUSTER_ID, GOOD, SECRETS, _stored

REPO = Path(__file__).resolve().parents[3]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))
SOFTHSM = "/usr/lib/softhsm/libsofthsm2.so"
PIN = "4711-playbook"

pytestmark = [
    pytest.mark.skipif(not os.path.exists(SOFTHSM), reason="SoftHSM2 is not installed (apt-get install -y softhsm2)"),
    pytest.mark.skipif(
        importlib.util.find_spec("pkcs11") is None,
        reason="python-pkcs11 is not installed (pip install -r requirements.txt)",
    ),
]


@pytest.fixture
def site(local_site, tmp_path):
    site = local_site(SECRETS, {"cp-0": "192.0.2.10"}, {})
    _stored(site / "backups", GOOD)
    (tmp_path / "tokens").mkdir()
    conf = tmp_path / "softhsm2.conf"
    conf.write_text(f"directories.tokendir = {tmp_path / 'tokens'}\nobjectstore.backend = file\nlog.level = ERROR\n")
    env = dict(os.environ, SOFTHSM2_CONF=str(conf), CK_PKCS11_PIN=PIN)
    subprocess.run(
        ["softhsm2-util", "--init-token", "--free", "--label", "cluster-root", "--pin", PIN, "--so-pin", "so-" + PIN],
        env=env,
        capture_output=True,
        check=True,
    )
    code = (
        f"import pkcs11\nfrom pkcs11 import Attribute, KeyType\n"
        f"with pkcs11.lib({SOFTHSM!r}).get_token(token_label='cluster-root').open(user_pin={PIN!r}, rw=True) as s:\n"
        f"    s.generate_key(KeyType.AES, 256, label='confidential-kubernetes-root', store=True,"
        f" template={{Attribute.EXTRACTABLE: False, Attribute.SENSITIVE: True}})\n"
    )
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    return site, env


def _play(site: Path, env: dict, playbook: str, *extra: str) -> subprocess.CompletedProcess:
    env = dict(env, ANSIBLE_COLLECTIONS_PATH=str(REPO / ".venv" / "collections"), ANSIBLE_NOCOLOR="1")
    return subprocess.run(
        # Under this interpreter: a copied venv's ansible-playbook may name another one in its first line.
        [
            sys.executable,
            ANSIBLE_PLAYBOOK,
            "-i",
            str(site / "inventory.yml"),
            f"confidential.kubernetes.{playbook}",
            *extra,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def test_restore_reads_the_wrapped_secrets_and_a_wrong_pin_is_named(site):
    site, env = site
    secrets_file = site / "secrets" / "cluster-secrets.json"
    wrap = _play(
        site,
        env,
        "pkcs11_custody",
        "-e",
        f"pkcs11_module={SOFTHSM}",
        "-e",
        "pkcs11_token_label=cluster-root",
        "-e",
        "pkcs11_pin_env=CK_PKCS11_PIN",
    )
    assert wrap.returncode == 0, wrap.stdout + wrap.stderr
    assert "pkcs11_wrapped" in json.loads(secrets_file.read_text()) and PIN not in wrap.stdout + wrap.stderr
    run = _play(site, env, "restore")
    assert run.returncode != 0 and f"Confirm with -e confirm_restore={CLUSTER_ID}" in run.stdout, run.stdout
    assert "snapshot refused" not in run.stdout
    wrong = _play(site, dict(env, CK_PKCS11_PIN="0000"), "restore")
    assert wrong.returncode != 0 and "the PIN of PKCS#11 token 'cluster-root' is wrong" in wrong.stdout, wrong.stdout
