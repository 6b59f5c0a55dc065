# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The drills' bring-up: the README's quick start, on the docs' worked example inventory.

The inventory is the worked example of docs/inventory.md with the lab's hosts in its groups. The lab overrides only
what it cannot give as the example says (LAB_OVERRIDES, each with its reason) and adds what only the lab needs (its
SSH keys, the mirror, the stand-ins), taken from the inventory `lab up` wrote; everything else the example sets is
used as written. Then, as an operator would: prepare, enrol two golden nodes merged into one policy, the pre-flight
verify before anything is locked, site, and a re-run that must report changed=0.
"""

from __future__ import annotations

import copy
import re
import shutil
from pathlib import Path

import yaml

from drilllab import REPO, DrillLab, collection_root

WORKED_EXAMPLE = REPO / "docs" / "inventory.md"
# Variables of the worked example the lab must set otherwise, and why.
LAB_OVERRIDES = {
    "kubernetes_version": "no server binaries newer than the lab's own 1.20.2 build are reachable here",
    "confidential_state_disk": "the lab's nodes are containers: the state disk is a file on the root filesystem, "
    "formatted but never mapped (the host kernel has no device-mapper)",
}
# Variables of the lab's own inventory the quick start leaves out: the worked example says not to set it.
NOT_FROM_LAB = {"ansible_python_interpreter"}


def worked_example(path: Path = WORKED_EXAMPLE) -> dict:
    """The first YAML block under the page's "Worked example" heading, parsed."""
    text = path.read_text()
    section = re.search(r"^## Worked example\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    block = section and re.search(r"^```yaml\n(.*?)^```", section.group(1), re.MULTILINE | re.DOTALL)
    if not block:
        raise AssertionError(f"{path}: no YAML block under '## Worked example'")
    return yaml.safe_load(block.group(1))


def docs_inventory(example: dict, lab_inventory: dict) -> dict:
    """The worked example with the lab's hosts, overrides and lab-only variables."""
    example = copy.deepcopy(example)
    variables = example["all"]["vars"]
    lab_variables = lab_inventory["all"]["vars"]
    unknown = set(LAB_OVERRIDES) - set(variables)
    if unknown:
        raise AssertionError(f"the worked example no longer sets {', '.join(sorted(unknown))}: update LAB_OVERRIDES")
    for name, value in lab_variables.items():
        if name in NOT_FROM_LAB or (name in variables and name not in LAB_OVERRIDES):
            continue
        variables[name] = value
    children = example["all"]["children"]
    for group in ("control_plane", "workers"):
        if group not in children:
            raise AssertionError(f"the worked example has no group {group}")
        children[group] = {"hosts": lab_inventory["all"]["children"][group].get("hosts") or {}}
    if "cluster" not in children:
        raise AssertionError("the worked example has no group cluster")
    return {"all": {"vars": variables, "children": children}}


def collection_task_files(output: str) -> int:
    """How many task files site.yml's -vv output names, each checked to lie in the collection that
    ANSIBLE_COLLECTIONS_PATH names first; an AssertionError naming any other."""
    root = f"{collection_root()}/"
    files = set(re.findall(r"^task path: ([^:\n]+):\d+$", output, re.MULTILINE))
    if not any(name == f"{root}roles/init/tasks/main.yml" for name in files):
        raise AssertionError(f"site.yml did not run the init role of {root}")
    elsewhere = sorted(name for name in files if not name.startswith(root))
    if elsewhere:
        raise AssertionError(f"site.yml ran tasks from outside {root}: {elsewhere[:5]}")
    return len(files)


def bring_up(lab: DrillLab) -> dict:
    """prepare, measurements (two golden nodes merged), pre-flight verify, site, site again; their figures."""
    inventory = docs_inventory(worked_example(), yaml.safe_load(lab.inventory.read_text()))
    path = lab.dir / "docs-inventory.yml"  # so that the example's {{ inventory_dir }} is the lab's directory

    def beside_inventory(name: str) -> Path:
        return Path(inventory["all"]["vars"][name].replace("{{ inventory_dir }}", str(path.parent)))

    # The worked example's EK CA file beside the inventory: the lab's EK CA, copied there.
    shutil.copyfile(lab.dir / "ca" / "ek-ca.pem", beside_inventory("confidential_ek_ca_file"))
    # A fresh operator has no policy yet: measurements.yml writes it (lab up wrote the lab's own).
    policy = beside_inventory("confidential_measurement_policy_file")
    policy.unlink(missing_ok=True)
    path.write_text(
        "# The worked example of docs/inventory.md with the lab's hosts (tests/drills/quickstart.py).\n"
        + yaml.safe_dump(inventory, sort_keys=False)
    )
    lab.inventory = path

    golden = [lab.control_planes()[0], lab.workers()[0]]  # as the README's quick start: cp-0,worker-0
    prepare = lab.playbook("prepare")
    enrol = lab.playbook(
        "measurements", "-e", f"measurements_golden_node={','.join(golden)}", "-e", "measurements_merge=true"
    )
    if not policy.exists():
        raise AssertionError(f"measurements.yml wrote no policy at {policy}")
    preflight = lab.playbook("verify")
    # -vv prints every task's path: each must lie in the collection ANSIBLE_COLLECTIONS_PATH names first (in CI the
    # copy installed from the Galaxy tarball, scripts/installed-collection.sh), none elsewhere.
    site = lab.playbook("site", "-vv")
    task_files = collection_task_files(site.output)
    rerun = lab.playbook("site")
    if rerun.changed:
        raise AssertionError(f"site.yml re-run reported changed={rerun.changed}")
    return {
        "prepare_seconds": round(prepare.seconds, 1),
        "measurements_seconds": round(enrol.seconds, 1),
        "golden_nodes": ",".join(golden),
        "preflight_verify_seconds": round(preflight.seconds, 1),
        "site_seconds": round(site.seconds, 1),
        "site_task_files": task_files,
        "rerun_seconds": round(rerun.seconds, 1),
    }
