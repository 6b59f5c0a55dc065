# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""HA drill (last: it powers a control plane off): ha.yml checks that every control plane is a full one (its join
service answers over TLS, the same CA and service-account keys with keys 0600, a started etcd member, a ready API
server), that the API host a worker uses is the first ready control plane and the next one when the first answers no
kubectl, and that after the last control plane is powered off the others still serve and a write still commits.

Figures: the playbook's seconds, and how many control planes were left serving."""

from __future__ import annotations


def drill(lab) -> dict:
    planes = lab.control_planes()
    if len(planes) < 3:
        raise AssertionError(f"the HA drill needs 3 control planes, the lab has {len(planes)}")
    run = lab.playbook("tests/drills/ha.yml")
    return {"ha_seconds": round(run.seconds, 1), "control_planes_left": len(planes) - 1}
