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
  - With O(release_state=absent) the release is uninstalled (C(helm uninstall), waiting as installs wait - Helm 3
    C(--wait), Helm 4 C(--wait=watcher) - unless O(skip_wait) or O(wait=false)). First, on the controller, the action
    takes the backup an upgrade takes (M(confidential.kubernetes.crd_backup)'s every CRD and custom resource, in a new
    C(upgrade-<UTC time>) directory under O(backup_dir)); if the backup fails nothing is uninstalled. A release helm
    does not know (or uninstalled with kept history) is V(changed=false), and neither backup nor helm runs.
  - Installs and upgrades take no backup here; the C(confidential.kubernetes.upgrade) role takes it with
    M(confidential.kubernetes.crd_backup) before it upgrades an existing release.
  - "Compared with M(kubernetes.core.helm): both have O(release_name), O(release_namespace), O(release_state),
    O(chart_ref), O(chart_version), O(chart_repo_url), O(release_values), O(values_files), O(wait), O(wait_timeout),
    O(atomic), O(force), O(create_namespace), O(kubeconfig), O(context) and O(binary_path), with the same names and
    aliases. Only here: O(skip_wait) (Constellation's C(--skip-helm-wait)), O(skip_version_policy) (this module refuses
    downgrades and version jumps), O(backup_dir) and O(backup_kubeconfig) (the backup before an uninstall). Only in
    kubernetes.core (not offered - the collection pins charts and runs one atomic path): C(update_repo_cache),
    C(disable_hook), C(purge) (uninstalls here always purge the history), C(replace), C(skip_crds), C(history_max),
    C(post_renderer), C(timeout), C(dependency_update), C(set_values), C(plain_http), C(reset_then_reuse_values),
    C(host)/C(api_key)/C(ca_cert)/C(validate_certs) (the kubeconfig is the one way in). Differences - O(wait) and
    O(atomic) default to V(true); a repository chart needs a pinned O(chart_version); RV(status) has no C(values)."
author:
  - confidential.kubernetes contributors (@confidential-kubernetes)
extends_documentation_fragment:
  - confidential.kubernetes._attributes
  - confidential.kubernetes._attributes.action
  - confidential.kubernetes._helm
attributes:
  action:
    details:
      - The action takes the backup before an uninstall on the controller; the rest runs on the host (also with C(async)).
  check_mode:
    support: full
    details:
      - Reads the release and reports whether it would be installed, upgraded or uninstalled; the version policy is
        enforced. No backup is written.
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
  release_state:
    description:
      - V(present) installs or upgrades the release; V(absent) backs up the CRDs and custom resources, then uninstalls it.
    type: str
    choices: [present, absent]
    default: present
    aliases: [state]
  chart_ref:
    description:
      - A chart archive (C(.tgz)) or chart directory on the host, or a chart name in the repository O(chart_repo_url).
      - Required with O(release_state=present).
    type: path
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
  backup_dir:
    description:
      - The controller directory under which the backup before an uninstall is made (C(upgrade-<UTC time>), as the
        C(confidential.kubernetes.upgrade) role's C(upgrade_backup_dir)). Required with O(release_state=absent).
    type: path
  backup_kubeconfig:
    description:
      - The admin kubeconfig on the controller, read for the backup before an uninstall (the init role stores it as
        C(secrets/admin.conf) next to the inventory). Required with O(release_state=absent).
    type: path
requirements:
  - helm 3 or 4 on the host
  - PyYAML on the host
  - the C(kubernetes) Python library on the controller, for the backup before an uninstall
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

- name: Uninstall a release, its cluster's CRDs and custom resources backed up to the controller first
  confidential.kubernetes.helm_release:
    release_name: gadgets
    release_namespace: apps
    state: absent
    kubeconfig: /etc/kubernetes/admin.conf
    backup_dir: "{{ inventory_dir }}/upgrades"
    backup_kubeconfig: "{{ inventory_dir }}/secrets/admin.conf"
  register: removed

- name: Show where the backup is
  ansible.builtin.debug:
    msg: "{{ removed.backup_path }}"
  when: removed is changed
"""

RETURN = r"""
action:
  description: V(install), V(upgrade), V(uninstall) or V(none).
  returned: always
  type: str
reason:
  description: Why (for example V(the values differ)).
  returned: always
  type: str
chart_name:
  description: The requested chart's name.
  returned: with O(release_state=present)
  type: str
chart_version:
  description: The requested chart version.
  returned: with O(release_state=present)
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
  description: The release's latest revision after this task (null once uninstalled).
  returned: always
  type: int
status:
  description:
    - The release after this task as M(kubernetes.core.helm) returns it (its C(helm list -o json) entry); null when
      helm lists no such release (not installed, or uninstalled).
    - Unlike kubernetes.core, without C(values) - they routinely carry credentials; C(helm get values) on the host
      shows them.
    - It used to be the status string alone, which is RV(status.status) now.
  returned: always
  type: dict
  contains:
    name:
      description: The release name.
      type: str
    namespace:
      description: The release namespace.
      type: str
    revision:
      description: The latest revision, a string as helm lists it.
      type: str
    status:
      description: The latest revision's status (V(deployed) on success).
      type: str
    chart:
      description: Chart name and version, C(<name>-<version>).
      type: str
    app_version:
      description: The chart's appVersion (empty when it has none).
      type: str
    updated:
      description: When the latest revision was made, as helm prints it.
      type: str
  sample:
    name: coredns
    namespace: kube-system
    revision: "2"
    status: deployed
    chart: coredns-1.36.1
    app_version: 1.12.0
    updated: "2026-11-26 11:02:03.123456789 +0000 UTC"
backup_path:
  description: The controller directory of the backup taken before the uninstall.
  returned: when a release was uninstalled
  type: str
rolled_back:
  description: Whether a failed upgrade was rolled back (by helm, or by this module under O(skip_wait)).
  returned: always
  type: bool
command:
  description: The helm command line run (values are in a removed temporary file, never on it).
  returned: when helm install, upgrade or uninstall ran
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
from ansible_collections.confidential.kubernetes.plugins.module_utils._helm.runner import (
    Helm,
    HelmError,
    ReleaseRequest,
)
from ansible_collections.confidential.kubernetes.plugins.module_utils._helm.values import (
    HAS_YAML,
    ValuesError,
    requested_values,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            RELEASE_SOURCE_OPTIONS,
            chart_ref=dict(type="path"),
            release_state=dict(type="str", choices=["present", "absent"], default="present", aliases=["state"]),
            wait=dict(type="bool", default=True),
            skip_wait=dict(type="bool", default=False),
            wait_timeout=dict(type="str", default="5m0s"),
            atomic=dict(type="bool", default=True),
            force=dict(type="bool", default=False),
            skip_version_policy=dict(type="bool", default=False),
            create_namespace=dict(type="bool", default=False),
            # Read by the action on the controller (the backup before an uninstall).
            backup_dir=dict(type="path"),
            backup_kubeconfig=dict(type="path"),
            **HELM_OPTIONS,
        ),
        required_if=[
            ("release_state", "present", ["chart_ref"]),
            ("release_state", "absent", ["backup_dir", "backup_kubeconfig"]),
        ],
        supports_check_mode=True,
    )
    if not HAS_YAML:
        module.fail_json(msg=missing_required_lib("PyYAML"))
    params = module.params
    request = ReleaseRequest(
        release_name=params["release_name"],
        release_namespace=params["release_namespace"],
        chart_ref=params["chart_ref"] or "",
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
        manager = ReleaseManager(helm, request, values, params["skip_version_policy"])
        if params["release_state"] == "absent":
            result = manager.uninstall(module.check_mode)
        else:
            result = manager.ensure(module.check_mode, module._diff)
        result["status"] = helm.release_status(request.release_name, request.release_namespace)
    except ReleaseFailed as exc:
        module.fail_json(msg=str(exc), **dict(exc.result, status=_status_after_failure(helm, request)))
    except VersionPolicyError as exc:
        module.fail_json(msg=f"release {request.release_name}: {exc}", policy=exc.reason, changed=False)
    except (HelmError, ChartError, ValuesError) as exc:
        module.fail_json(msg=f"release {request.release_name}: {exc}", changed=False)
    module.exit_json(**result)


def _status_after_failure(helm: Helm, request: ReleaseRequest) -> dict | None:
    try:
        return helm.release_status(request.release_name, request.release_namespace)
    except HelmError:
        return None


if __name__ == "__main__":
    main()
