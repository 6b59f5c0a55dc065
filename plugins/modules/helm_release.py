#!/usr/bin/python
# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: helm_release
short_description: Install or upgrade one Helm release atomically, with a version policy and reliable change detection
version_added: 0.1.0
description:
  - Runs C(helm upgrade --install) on the host that has helm and the cluster's kubeconfig (in this collection, the
    first control-plane node). The option names are those of M(kubernetes.core.helm).
  - Atomic by default - a failed install or upgrade (for example a failing hook) is rolled back and the task fails with
    helm's message, the previously deployed revision still running. Helm 3 gets C(--atomic --wait); Helm 4 gets
    C(--rollback-on-failure --wait=watcher). The helm major version is read from C(helm version --short).
  - With O(skip_wait) (Constellation's C(--skip-helm-wait)) helm does not wait for the resources to become ready. Since
    both helms wait whenever they roll back by themselves, the rollback flag is then left out and this module runs
    C(helm rollback) to the previously deployed revision when an upgrade fails.
  - Version policy - refuses a downgrade, a major version change, a minor jump greater than one, and replacing the
    release's chart by another chart, unless O(skip_version_policy). Checked before anything changes.
  - Nothing to do (V(changed=false)) when the latest revision is C(deployed) with the same chart name and version and
    the same user-supplied values (C(helm get values -o json) against O(values_files) merged with O(release_values) as helm
    merges them). C(--reset-values) is always passed, so the release runs exactly the declared values.
  - A release whose latest revision is C(pending-install), C(pending-upgrade) or C(pending-rollback) is an error that
    names the release and what to do; nothing is changed.
  - Values reach helm in one 0600 temporary file (C(--values)), removed afterwards; never on the command line.
  - This module takes no backups; the M(confidential.kubernetes.crd_backup) action and the
    C(confidential.kubernetes.upgrade) role back up every CRD and custom resource before an upgrade.
author:
  - confidential.kubernetes contributors (@confidential-kubernetes)
extends_documentation_fragment:
  - confidential.kubernetes._attributes
  - confidential.kubernetes._helm
attributes:
  check_mode:
    support: full
    details:
      - Reads the release and reports whether it would be installed or upgraded; the version policy is enforced.
  diff_mode:
    support: full
    details:
      - Two diffs - the user-supplied values with every leaf value replaced by a per-run keyed fingerprint (so a diff
        shows which keys change, never a value), and the manifest (C(helm get manifest) against C(helm template))
        with every string value of at least 4 characters from the values, plain or base64, masked the same way.
  idempotent:
    support: full
options:
  release_name:
    description: The release name.
    type: str
    required: true
    aliases: [name]
  release_namespace:
    description: The release's namespace.
    type: str
    required: true
    aliases: [namespace]
  chart_ref:
    description:
      - A chart archive (C(.tgz)) or chart directory on the host, or a chart name in the repository O(chart_repo_url).
    type: path
    required: true
  chart_version:
    description:
      - The chart version. Required for a repository chart (versions are pinned). For a local chart, when given, it
        must equal the version in its C(Chart.yaml).
    type: str
  chart_repo_url:
    description: The chart repository URL (passed as C(--repo)).
    type: str
  release_values:
    description:
      - Values, merged over O(values_files).
      - V(no_log) because values routinely carry credentials (passwords, tokens, keys); diff output masks them too.
    type: dict
    default: {}
    aliases: [values]
  values_files:
    description: Values files on the host, merged in order as helm merges C(-f) files.
    type: list
    elements: path
    default: []
  wait:
    description: Wait until the release's resources are ready (C(--wait), C(--wait=watcher) on Helm 4).
    type: bool
    default: true
  skip_wait:
    description: Do not wait for readiness, whatever O(wait) says (Constellation's C(--skip-helm-wait)).
    type: bool
    default: false
  wait_timeout:
    description: How long helm waits for each operation, as a Go duration.
    type: str
    default: 5m0s
  atomic:
    description: Roll back a failed install or upgrade.
    type: bool
    default: true
  force:
    description:
      - Helm's C(--force) (C(--force-replace --server-side=false) on Helm 4) - resources that cannot be patched are deleted and created
        again, as in M(kubernetes.core.helm). It does not skip the version policy; O(skip_version_policy) does.
    type: bool
    default: false
  skip_version_policy:
    description:
      - Allow what the version policy refuses - a downgrade, a major version change, a minor jump greater than one,
        another chart.
      - Named like O(skip_wait), for what it skips; V(force) is helm's C(--force) here as in M(kubernetes.core.helm).
    type: bool
    default: false
  create_namespace:
    description: Create the release namespace if it does not exist.
    type: bool
    default: false
requirements:
  - helm 3 or 4 on the host
  - PyYAML on the host
seealso:
  - module: confidential.kubernetes.helm_plan
  - module: confidential.kubernetes.crd_backup
  - module: kubernetes.core.helm
"""

EXAMPLES = r"""
- name: Install or upgrade CoreDNS from a chart archive, rolled back on failure
  confidential.kubernetes.helm_release:
    release_name: coredns
    release_namespace: kube-system
    chart_ref: /var/tmp/charts/coredns-1.36.1.tgz
    release_values:
      replicaCount: 2
    kubeconfig: /etc/kubernetes/admin.conf

- name: A repository chart, pinned, without waiting for readiness
  confidential.kubernetes.helm_release:
    release_name: cilium
    release_namespace: kube-system
    chart_ref: cilium
    chart_repo_url: https://helm.cilium.io
    chart_version: 1.16.5
    values_files: [/etc/confidential-kubernetes/cilium-values.yaml]
    skip_wait: true
    kubeconfig: /etc/kubernetes/admin.conf
"""

RETURN = r"""
action:
  description: V(install), V(upgrade) or V(none).
  returned: always
  type: str
reason:
  description: Why (for example V(the values differ)).
  returned: always
  type: str
chart_name:
  description: The requested chart's name.
  returned: always
  type: str
chart_version:
  description: The requested chart version.
  returned: always
  type: str
previous_chart_version:
  description: The chart version of the release before this task (null when it did not exist).
  returned: always
  type: str
previous_revision:
  description: The release's latest revision before this task.
  returned: always
  type: int
revision:
  description: The release's latest revision after this task.
  returned: always
  type: int
status:
  description: The latest revision's status after this task (V(deployed) on success).
  returned: always
  type: str
rolled_back:
  description: Whether a failed upgrade was rolled back (by helm, or by this module under O(skip_wait)).
  returned: always
  type: bool
command:
  description: The helm command line run (values are in a removed temporary file, never on it).
  returned: when helm install or upgrade ran
  type: list
  elements: str
helm_major_version:
  description: 3 or 4.
  returned: always
  type: int
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.confidential.kubernetes.plugins.module_utils._helm import HELM_OPTIONS, RELEASE_SOURCE_OPTIONS
from ansible_collections.confidential.kubernetes.plugins.module_utils._helm.chart import ChartError
from ansible_collections.confidential.kubernetes.plugins.module_utils._helm.policy import VersionPolicyError
from ansible_collections.confidential.kubernetes.plugins.module_utils._helm.release import ReleaseFailed, ReleaseManager
from ansible_collections.confidential.kubernetes.plugins.module_utils._helm.runner import Helm, HelmError, ReleaseRequest
from ansible_collections.confidential.kubernetes.plugins.module_utils._helm.values import HAS_YAML, ValuesError, requested_values


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            RELEASE_SOURCE_OPTIONS,
            wait=dict(type="bool", default=True),
            skip_wait=dict(type="bool", default=False),
            wait_timeout=dict(type="str", default="5m0s"),
            atomic=dict(type="bool", default=True),
            force=dict(type="bool", default=False),
            skip_version_policy=dict(type="bool", default=False),
            create_namespace=dict(type="bool", default=False),
            **HELM_OPTIONS,
        ),
        supports_check_mode=True,
    )
    if not HAS_YAML:
        module.fail_json(msg=missing_required_lib("PyYAML"))
    params = module.params
    request = ReleaseRequest(
        release_name=params["release_name"],
        release_namespace=params["release_namespace"],
        chart_ref=params["chart_ref"],
        chart_version=params["chart_version"],
        chart_repo_url=params["chart_repo_url"],
        wait=params["wait"] and not params["skip_wait"],
        wait_timeout=params["wait_timeout"],
        atomic=params["atomic"],
        create_namespace=params["create_namespace"],
        force=params["force"],
    )
    helm = Helm(params["binary_path"], params["kubeconfig"], params["context"])
    try:
        values = requested_values(params["values_files"], params["release_values"])
        result = ReleaseManager(helm, request, values, params["skip_version_policy"]).ensure(module.check_mode, module._diff)
    except ReleaseFailed as exc:
        module.fail_json(msg=str(exc), **exc.result)
    except VersionPolicyError as exc:
        module.fail_json(msg=f"release {request.release_name}: {exc}", policy=exc.reason, changed=False)
    except (HelmError, ChartError, ValuesError) as exc:
        module.fail_json(msg=f"release {request.release_name}: {exc}", changed=False)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
