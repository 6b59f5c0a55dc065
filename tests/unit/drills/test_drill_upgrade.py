# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The upgrade drill's lab-only kubeadm settings agree with how the lab's clusters are made (no lab is booted here)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tests" / "drills"))
sys.path.insert(0, str(REPO / "tests" / "lab"))

import drill_upgrade  # noqa: E402 pylint: disable=wrong-import-position
from cklab.inventory import LAB_SKIPPED_INIT_PHASES  # noqa: E402 pylint: disable=wrong-import-position

# kubeadm 1.20's CoreDNS migration checks, which fail without a coredns ConfigMap ("start version '' not supported").
COREDNS_CHECKS = {"CoreDNSUnsupportedPlugins", "CoreDNSMigration"}


def test_the_drill_ignores_the_coredns_checks_exactly_when_the_labs_init_skips_coredns():
    ignored = set(json.loads(drill_upgrade.LAB_ARGS[1])["upgrade_kubernetes_ignore_preflight_errors"])
    assert (COREDNS_CHECKS <= ignored) == ("addon/coredns" in LAB_SKIPPED_INIT_PHASES)
    assert COREDNS_CHECKS <= ignored or not COREDNS_CHECKS & ignored, "one CoreDNS check ignored without the other"
