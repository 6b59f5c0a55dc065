# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""measurements.yml with several golden nodes, run for real by ansible-playbook against two local hosts, each reading
its own swtpm: the merge mode unions the values per PCR and names the PCRs that differ; without it several golden
nodes are refused; a re-run changes nothing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from ansible_collections.confidential.kubernetes.plugins.module_utils._attestation import issuer

REPO = Path(__file__).resolve().parents[3]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))


def _inventory(tmp_path: Path, tctis: dict[str, str]) -> Path:
    hosts = {name: {"confidential_tpm_tcti": tcti} for name, tcti in tctis.items()}
    inventory = {
        "all": {
            "vars": {
                "ansible_connection": "local",
                "ansible_python_interpreter": sys.executable,
                "confidential_node_python": sys.executable,
                # Beside the inventory, as the docs' worked example writes it (inventory_dir is the inventory's own).
                "confidential_measurement_policy_file": "{{ inventory_dir }}/measurement-policy.yml",
            },
            "children": {"control_plane": {"hosts": hosts}, "cluster": {"children": {"control_plane": {}}}},
        }
    }
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(inventory, sort_keys=False))
    return path


def _measurements(inventory: Path, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO / ".venv" / "collections"), ANSIBLE_NOCOLOR="1")
    return subprocess.run(
        [
            ANSIBLE_PLAYBOOK,
            "-i",
            str(inventory),
            "confidential.kubernetes.measurements",
            "-e",
            '{"measurements_pcrs": [0, 4, 8]}',
            *extra,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def _changed(run: subprocess.CompletedProcess) -> int:
    return sum(int(n) for n in re.findall(r"changed=(\d+)", run.stdout))


def test_two_golden_nodes_are_merged_per_pcr_naming_the_pcr_that_differs(tmp_path, swtpm, other_swtpm):
    with issuer.Tpm(other_swtpm.tcti) as tpm:
        tpm.pcr_event(8, b"another kernel command line")
    with issuer.Tpm(swtpm.tcti) as tpm:
        golden = tpm.read_pcrs(indices=(0, 4, 8))
    with issuer.Tpm(other_swtpm.tcti) as tpm:
        other = tpm.read_pcrs(indices=(0, 4, 8))
    inventory = _inventory(tmp_path, {"golden-0": swtpm.tcti, "golden-1": other_swtpm.tcti})

    refused = _measurements(inventory, "-e", "measurements_golden_node=golden-0,golden-1")
    assert refused.returncode != 0
    assert "or several with -e measurements_merge=true" in refused.stdout
    assert not (tmp_path / "measurement-policy.yml").exists()

    merged = _measurements(
        inventory, "-e", "measurements_golden_node=golden-0,golden-1", "-e", "measurements_merge=true"
    )
    assert merged.returncode == 0, merged.stdout + merged.stderr
    assert "The golden nodes differ in PCR(s) 8:" in merged.stdout
    assert f"PCR 8: golden-0 = {golden[8].hex()}; golden-1 = {other[8].hex()}" in merged.stdout
    policy = yaml.safe_load((tmp_path / "measurement-policy.yml").read_text())
    assert policy["pcrs"] == {
        "0": {"allowed": [golden[0].hex()], "warn_only": False},
        "4": {"allowed": [golden[4].hex()], "warn_only": False},
        "8": {"allowed": [golden[8].hex(), other[8].hex()], "warn_only": False},
    }

    again = _measurements(
        inventory, "-e", "measurements_golden_node=golden-0,golden-1", "-e", "measurements_merge=true"
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert _changed(again) == 0

    # The merged policy is not one golden node's: enrolling golden-0 alone over it is refused without force.
    single = _measurements(inventory, "-e", "measurements_golden_node=golden-0")
    assert single.returncode != 0
    assert "exists and differs from golden-0's measurements" in single.stdout


def test_golden_nodes_that_agree_give_one_value_per_pcr(tmp_path, swtpm, start_swtpm):
    twin = start_swtpm("lab2")
    inventory = _inventory(tmp_path, {"golden-0": swtpm.tcti, "golden-1": twin.tcti})
    run = _measurements(inventory, "-e", "measurements_golden_node=golden-0,golden-1", "-e", "measurements_merge=true")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "The golden nodes golden-0, golden-1 agree on every PCR." in run.stdout
    policy = yaml.safe_load((tmp_path / "measurement-policy.yml").read_text())
    assert all(len(rule["allowed"]) == 1 for rule in policy["pcrs"].values())
