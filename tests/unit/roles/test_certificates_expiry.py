# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The certificates role's expiry entry point and the table cell verify.yml and renew.yml show, run for real by
ansible-playbook on local hosts whose certificate trees the test makes: one expiring soon, one expired, none."""

from __future__ import annotations

import base64
import datetime
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm import expiry

REPO = Path(__file__).resolve().parents[3]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))
KEY = ec.generate_private_key(ec.SECP256R1())


def _pem(days: float) -> bytes:
    now = datetime.datetime.now(datetime.timezone.utc)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test")])
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(KEY.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=400))
        .not_valid_after(now + datetime.timedelta(days=days))
        .sign(KEY, hashes.SHA256())
        .public_bytes(serialization.Encoding.PEM)
    )


def _control_plane(root: Path, days: dict[str, float]) -> None:
    for name in expiry.RENEWABLE_CERTIFICATES + expiry.AUTHORITIES:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(_pem(days.get(name, 3650 if "ca" in name else 300)))
    for name in expiry.RENEWABLE_KUBECONFIGS:
        data = base64.b64encode(_pem(days.get(name, 300))).decode()
        (root / name).write_text(yaml.safe_dump({"users": [{"name": "u", "user": {"client-certificate-data": data}}]}))


def test_expiry_is_reported_warned_and_shown_per_node(tmp_path):
    _control_plane(tmp_path / "cp-1", {"admin.conf": 5})
    (tmp_path / "cp-1.pem").write_bytes(_pem(200))
    (tmp_path / "w-1.pem").write_bytes(_pem(-1))
    hosts = {
        name: {
            "certificates_kubernetes_dir": str(tmp_path / name),
            "certificates_kubelet_client_certificate": str(tmp_path / f"{name}.pem"),
            "certificates_joinservice_config_dir": str(tmp_path / "none"),
        }
        for name in ("cp-1", "w-1", "w-2")
    }
    inventory = {
        "all": {
            "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
            "children": {
                "control_plane": {"hosts": {"cp-1": hosts["cp-1"]}},
                "workers": {"hosts": {"w-1": hosts["w-1"], "w-2": hosts["w-2"]}},
            },
        }
    }
    plays = [
        {
            "hosts": "all",
            "gather_facts": False,
            "tasks": [
                {
                    "ansible.builtin.include_role": {
                        "name": "confidential.kubernetes.certificates",
                        "tasks_from": "expiry",
                    }
                },
                {
                    "ansible.builtin.debug": {
                        "msg": "{{ lookup('ansible.builtin.template', '%s').splitlines() }}"
                        % (REPO / "playbooks/templates/certificate_expiry.j2")
                    },
                    "run_once": True,
                },
                {
                    "ansible.builtin.debug": {
                        "msg": "EXPIRED {{ inventory_hostname }}: {{ certificates_expiry.expired | join(',') }}"
                    }
                },
            ],
        }
    ]
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "play.yml").write_text(yaml.safe_dump(plays))
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=str(REPO / ".venv" / "collections"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_STDOUT_CALLBACK="default",
    )
    run = subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", str(tmp_path / "inventory.yml"), str(tmp_path / "play.yml")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    table = [line.strip().strip('",') for line in output.splitlines() if line.strip().startswith(('"cp-1 ', '"w-'))]
    # Made to expire in 5 and 200 days, read a moment later: 4 or 5, 199 or 200 whole days left.
    assert len(table) == 3 and re.fullmatch(r"cp-1 +control-plane  admin\.conf [45]d!, kubelet (199|200)d", table[0]), (
        output
    )
    assert table[1:] == ["w-1              worker         kubelet EXPIRED", "w-2              worker         -"], output
    assert re.search(rf"WARNING\]: {tmp_path}/cp-1/admin.conf expires in [45]\.[0-9] days .*, less than 30", output)
    assert f"EXPIRED w-1: {tmp_path}/w-1.pem" in output and 'EXPIRED cp-1: "' in output
