# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A node's state as the node role needs it to decide a re-run, learnt in one call (behind the node_state module).

Owns: everything the role would otherwise ask the node in a round trip each - whether the modules' virtualenv
imports what they need, the machine, the runtime tools, the host preparation kubeadm's preflight expects (swap
off and out of fstab, kernel modules loaded and listed, sysctls set and written), which stamps of the installed
stack still verify, the services' states, and whether an archive is unpacked where it belongs.

Protocol: the role runs the module once in check mode before anything changes (reading only, and saying what
the host preparation would change), then skips every step the report shows is done. Only the host preparation
is changed here (``NodeState.prepare``), in a second call and only when the first one found something to do; and
the stamp of an installed stack (``NodeState.write_stamp``, its format in ``stamp``), after an install.

Stdlib only: it runs on the node's system Python, before the virtualenv exists. Commands go through
``NodeState._run_command`` (argument lists only); ``/proc`` is a constructor argument, so tests use a tree of
their own.
"""

from __future__ import annotations


class NodeStateError(RuntimeError):
    """The node cannot be brought to the asked state; the message names what failed."""
