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
