"""Where the lab keeps its run state, its base cache and the repository."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_LAB_DIR = "/var/tmp/confidential-kubernetes-lab"
DEFAULT_CACHE_DIR = "/var/cache/confidential-kubernetes-lab"
KUBERNETES_VERSION = "v1.20.2"
# The lab's relabelled build of the same source (kubernetes.RELABELLED): the version the upgrade drill moves to.
UPGRADE_VERSION = "v1.20.3-lab.1"


@dataclass(frozen=True)
class LabPaths:
    lab_dir: Path
    cache_dir: Path
    repo_root: Path

    @classmethod
    def from_environment(cls) -> LabPaths:
        repo_root = os.environ.get("CK_LAB_REPO_ROOT") or Path(__file__).resolve().parents[3]
        return cls(
            lab_dir=Path(os.environ.get("CK_LAB_DIR") or DEFAULT_LAB_DIR).absolute(),
            cache_dir=Path(os.environ.get("CK_LAB_CACHE") or DEFAULT_CACHE_DIR).absolute(),
            repo_root=Path(repo_root).resolve(),
        )

    @property
    def state_file(self) -> Path:
        return self.lab_dir / "lab.json"

    @property
    def inventory(self) -> Path:
        return self.lab_dir / "inventory.yml"

    @property
    def measurement_policy(self) -> Path:
        return self.lab_dir / "measurement-policy.yml"

    @property
    def ssh_dir(self) -> Path:
        return self.lab_dir / "ssh"

    @property
    def ssh_key(self) -> Path:
        return self.ssh_dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.ssh_dir / "known_hosts"

    @property
    def ca_dir(self) -> Path:
        return self.lab_dir / "ca"

    @property
    def ek_ca(self) -> Path:
        return self.ca_dir / "ek-ca.pem"

    @property
    def nodes_dir(self) -> Path:
        return self.lab_dir / "nodes"

    def node_dir(self, name: str) -> Path:
        return self.nodes_dir / name

    @property
    def requirements_node(self) -> Path:
        return self.repo_root / "requirements-node.txt"

    @property
    def kubernetes_bin(self) -> Path:
        """The lab cache's build of KUBERNETES_VERSION (`lab kubernetes`): the nodes' binaries and the mirror's source."""
        return self.cache_dir / "kubernetes" / KUBERNETES_VERSION / "bin"

    @property
    def upgrade_bin(self) -> Path:
        """The lab cache's relabelled build (UPGRADE_VERSION, a 1.20.2 stamped as a newer patch) for the upgrade."""
        return self.cache_dir / "kubernetes" / UPGRADE_VERSION / "bin"

    @property
    def doubles_dir(self) -> Path:
        return self.repo_root / "tests" / "doubles"
