#!/usr/bin/python
# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: helm_plan
short_description: Plan Helm releases whose charts and values files are on the controller, without copying them
version_added: 0.2.0
description:
  - Says for each release what M(confidential.kubernetes.helm_release) would do - V(install), V(upgrade) or V(none) -
    in one call to the node, before any chart or values file is copied there. The C(confidential.kubernetes.upgrade)
    role plans with it and stages only the releases that are not up to date.
  - On the controller, the action plugin reads each local chart's name and version from its C(Chart.yaml) (an archive
    or a directory, found as M(ansible.builtin.copy) finds its C(src)) and merges the values files with the values as
    helm does. A repository chart (O(releases[].chart_repo_url)) is planned with its pinned O(releases[].chart_version).
  - On the node, the module compares them with the release as helm reports it, exactly as
    M(confidential.kubernetes.helm_release) does before it changes anything - the same version policy, the same refusal of a
    release stuck in a pending state, the same comparison of the chart name, chart version and user-supplied values.
  - Every release is planned; when any plan fails (the version policy, a pending release, another chart, a chart or
    values file that cannot be read) the task fails naming each of them, and nothing was changed.
  - Values reach the node only inside the module's arguments, as one V(no_log) string; neither a value nor a key of
    the values appears in the result or the output.
author:
  - confidential.kubernetes contributors (@confidential-kubernetes)
extends_documentation_fragment:
  - confidential.kubernetes._attributes
  - confidential.kubernetes._attributes.action
  - confidential.kubernetes._attributes.INFO_MODULE
  - confidential.kubernetes._helm
  - confidential.kubernetes._helm.releases
attributes:
  idempotent:
    support: full
options:
  skip_version_policy:
    description: Skip the version policy for every release that does not set its own O(releases[].skip_version_policy).
    type: bool
    default: false
  resolved:
    description:
      - Set by the action plugin from O(releases) as read on the controller, one entry per release in order; a task
        cannot set it.
    type: list
    elements: dict
    suboptions:
      chart_name:
        description: The chart's name.
        type: str
        required: true
      chart_version:
        description: The chart's version.
        type: str
        required: true
      values_json:
        description:
          - The values files merged with the release's values, as JSON (V(no_log)). A string, so that not even the
            keys of a values file appear in the output at any verbosity.
        type: str
        default: "{}"
requirements:
  - helm 3 or 4 on the node
  - PyYAML on the controller
seealso:
  - module: confidential.kubernetes.helm_release
  - module: confidential.kubernetes.crd_backup
"""

EXAMPLES = r"""
- name: Plan the releases before copying any chart
  confidential.kubernetes.helm_plan:
    releases:
      - release_name: coredns
        release_namespace: kube-system
        chart_ref: "{{ inventory_dir }}/charts/coredns-1.36.1.tgz"
        values_files: ["{{ inventory_dir }}/values/coredns.yml"]
    kubeconfig: /etc/kubernetes/admin.conf
  register: plan

- name: Install or upgrade only what is out of date
  ansible.builtin.debug:
    msg: "{{ plan.plans | rejectattr('action', 'equalto', 'none') | map(attribute='release_name') | list }}"
"""

RETURN = r"""
plans:
  description:
    - One per release, in order, with the fields M(confidential.kubernetes.helm_release) returns in check mode
      (C(action), C(reason), C(changed) - whether it would change -, C(release_name), C(release_namespace),
      C(chart_name), C(chart_version), C(previous_chart_version), C(previous_revision), C(revision), C(status)).
    - A release whose plan failed has C(failed), C(msg) and, for a version policy refusal, C(policy).
  returned: always
  type: list
  elements: dict
"""

import json

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.confidential.kubernetes.plugins.module_utils._helm import PLAN_OPTIONS
from ansible_collections.confidential.kubernetes.plugins.module_utils._helm.chart import ChartRef
from ansible_collections.confidential.kubernetes.plugins.module_utils._helm.policy import VersionPolicyError
from ansible_collections.confidential.kubernetes.plugins.module_utils._helm.release import ReleaseManager
from ansible_collections.confidential.kubernetes.plugins.module_utils._helm.runner import (
    Helm,
    HelmError,
    ReleaseRequest,
)

RESOLVED_OPTIONS = dict(
    chart_name=dict(type="str", required=True),
    chart_version=dict(type="str", required=True),
    values_json=dict(type="str", default="{}", no_log=True),
)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(PLAN_OPTIONS, resolved=dict(type="list", elements="dict", options=RESOLVED_OPTIONS)),
        supports_check_mode=True,
    )
    params = module.params
    if len(params["resolved"] or []) != len(params["releases"]):
        module.fail_json(msg="resolved must hold one entry per release (the action plugin sets it)", plans=[])
    helm = Helm(params["binary_path"], params["kubeconfig"], params["context"])
    plans, failures = [], []
    for release, source in zip(params["releases"], params["resolved"]):
        request = ReleaseRequest(
            release["release_name"],
            release["release_namespace"],
            release["chart_ref"],
            source["chart_version"],
            release["chart_repo_url"],
        )
        chart = ChartRef(source["chart_name"], source["chart_version"], not release["chart_repo_url"])
        skip = (
            params["skip_version_policy"] if release["skip_version_policy"] is None else release["skip_version_policy"]
        )
        failure: dict = {}
        try:
            plans.append(ReleaseManager(helm, request, json.loads(source["values_json"]), skip).plan(chart))
        except VersionPolicyError as exc:
            failure = dict(msg=f"release {request.release_name}: {exc}", policy=exc.reason)
        except HelmError as exc:
            failure = dict(msg=f"release {request.release_name}: {exc}")
        if failure:
            failures.append(failure["msg"])
            plans.append(
                dict(
                    failure,
                    failed=True,
                    changed=False,
                    release_name=request.release_name,
                    release_namespace=request.release_namespace,
                )
            )
    if failures:
        module.fail_json(msg="; ".join(failures), plans=plans, changed=False)
    module.exit_json(changed=False, plans=plans)


if __name__ == "__main__":
    main()
