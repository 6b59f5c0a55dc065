# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A controller's site for playbooks run for real by ansible-playbook, with local hosts standing in for the nodes."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Callable

import pytest
import yaml

from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto.root_secrets import RootSecrets


@pytest.fixture
def local_site(tmp_path) -> Callable[..., Path]:
    """Writes the site into tmp_path: the cluster's root secrets (secrets/cluster-secrets.json, 0600) and inventory.yml
    with the given control planes and workers ({name: ansible_host}), every host local; returns tmp_path."""

    def write(secrets: RootSecrets, control_planes: dict[str, str], workers: dict[str, str]) -> Path:
        (tmp_path / "secrets").mkdir(mode=0o700)
        secrets_file = tmp_path / "secrets" / "cluster-secrets.json"
        secrets_file.write_text(json.dumps(secrets.to_document()))
        os.chmod(secrets_file, 0o600)
        hosts = {
            group: {"hosts": {name: {"ansible_host": address} for name, address in members.items()}}
            for group, members in (("control_plane", control_planes), ("workers", workers))
        }
        inventory = {
            "all": {
                "vars": {
                    "ansible_connection": "local",
                    "ansible_python_interpreter": sys.executable,
                    "confidential_node_python": sys.executable,
                },
                "children": {**hosts, "cluster": {"children": {"control_plane": {}, "workers": {}}}},
            }
        }
        (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
        return tmp_path

    return write
