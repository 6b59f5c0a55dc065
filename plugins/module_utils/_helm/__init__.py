# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Helm releases (install, upgrade, policy, change detection) and the CRD/CR backups taken before upgrades."""

# Argument spec of what a release is made from, shared by helm_release and crd_backup (which saves those inputs).
RELEASE_SOURCE_OPTIONS = dict(
    release_name=dict(type="str", required=True, aliases=["name"]),
    release_namespace=dict(type="str", required=True, aliases=["namespace"]),
    chart_ref=dict(type="path", required=True),
    chart_version=dict(type="str"),
    chart_repo_url=dict(type="str"),
    release_values=dict(type="dict", default={}, no_log=True, aliases=["values"]),
    values_files=dict(type="list", elements="path", default=[]),
)

# How helm_release and helm_plan run helm on the node (doc fragment confidential.kubernetes._helm).
HELM_OPTIONS = dict(
    kubeconfig=dict(type="path", aliases=["kubeconfig_path"]),
    context=dict(type="str", aliases=["kube_context"]),
    binary_path=dict(type="path", default="helm"),
)

# One release of the upgrade role's list (upgrade_releases), as helm_plan and crd_backup take the list as it is.
ROLE_RELEASE_OPTIONS = dict(
    RELEASE_SOURCE_OPTIONS,
    wait_timeout=dict(type="str"),
    atomic=dict(type="bool"),
    create_namespace=dict(type="bool"),
    force=dict(type="bool"),
    skip_version_policy=dict(type="bool"),
)

# helm_plan's options as a task gives them (its action plugin adds what it read on the controller: ``resolved``).
PLAN_OPTIONS = dict(
    releases=dict(type="list", elements="dict", default=[], options=ROLE_RELEASE_OPTIONS),
    skip_version_policy=dict(type="bool", default=False),
    **HELM_OPTIONS,
)
