# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What an operator does with a node that needs a reset: one text, so that every such message names the same step."""

from __future__ import annotations

# The playbook that resets a node, its confirmation variable, and the reboot that clears PCR 15 (nothing else can).
NEEDS_RESET = (
    "the node needs a reset: ansible-playbook -i <inventory> confidential.kubernetes.reset -l <node> "
    "-e confirm_reset=yes-reset-<node> (a Node still in a running cluster: confidential.kubernetes.remove_node "
    "-e remove_node=<node> -e confirm_reset=yes-reset-<node>), then reboot it to clear PCR 15"
)
