# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One release brought to its declared chart version and values: plan (pure), diff, apply, roll back."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

from .chart import ChartError, ChartRef, resolve_chart
from .policy import check_version_policy
from .runner import PENDING, DeployedRelease, Helm, HelmError, ReleasePendingError, ReleaseRequest
from .values import ValueMasker, dump_values, normalise, requested_values, values_equal


@dataclass(frozen=True)
class Plan:
    action: str  # install | upgrade | none
    reason: str


def plan_release(
    deployed: DeployedRelease | None,
    deployed_values: dict,
    chart: ChartRef,
    values: dict,
    skip_version_policy: bool = False,
) -> Plan:
    """What to do, from what helm reports. Raises ReleasePendingError and VersionPolicyError; changes nothing."""
    if deployed is None or deployed.status == "uninstalled":
        return Plan("install", "the release does not exist")
    if deployed.status in PENDING:
        raise ReleasePendingError(
            f"release {deployed.name} in namespace {deployed.namespace} is stuck in {deployed.status} "
            f"(revision {deployed.revision}): another helm operation is running or was killed. Nothing was changed. "
            f"Check 'helm history {deployed.name} -n {deployed.namespace}', then roll back to the last deployed "
            f"revision ('helm rollback {deployed.name} <revision> -n {deployed.namespace}') and re-run."
        )
    if deployed.chart_name and deployed.chart_name != chart.name and not skip_version_policy:
        raise HelmError(
            f"release {deployed.name} runs chart {deployed.chart_name}, not {chart.name}; refusing to replace it "
            "(set skip_version_policy to override)"
        )
    check_version_policy(deployed.chart_version or None, chart.version, skip_version_policy)
    if deployed.status != "deployed":
        return Plan("upgrade", f"the latest revision {deployed.revision} is {deployed.status}")
    if deployed.chart_version != chart.version or deployed.chart_name != chart.name:
        return Plan("upgrade", f"chart {deployed.chart_name} {deployed.chart_version} -> {chart.name} {chart.version}")
    if not values_equal(deployed_values, values):
        return Plan("upgrade", "the values differ")
    return Plan("none", "same chart version and values")


def resolve_inputs(release: dict, find_file: Callable[[str], str | None]) -> dict:
    """What the plan compares of a release whose chart and values files are where ``find_file`` finds them (on the
    controller): the chart's name and version and the merged values (as JSON: one no_log string for the module, whose
    keys do not show either), as the node reads them once they are staged."""
    chart_ref = release["chart_ref"]
    if not release["chart_repo_url"]:
        # The upgrade role copies every chart without a repository URL to the node: it is a local chart.
        found = find_file(chart_ref.rstrip("/"))
        if found is None:
            raise ChartError(f"chart {chart_ref} not found on the controller")
        chart_ref = found
    chart = resolve_chart(chart_ref, release["chart_version"], release["chart_repo_url"])
    values_files = [find_file(path) or path for path in release["values_files"]]
    return dict(
        chart_name=chart.name,
        chart_version=chart.version,
        values_json=json.dumps(normalise(requested_values(values_files, release["release_values"]))),
    )


@dataclass(frozen=True)
class _Reading:
    """What helm reports about a release, the plan made from it, and the result fields both carry."""

    plan: Plan
    deployed: DeployedRelease | None
    present: bool
    deployed_values: dict
    result: dict


class ReleaseManager:
    """Drives helm for one release: ``ensure`` (module helm_release) and ``plan`` (module helm_plan)."""

    def __init__(self, helm: Helm, request: ReleaseRequest, values: dict, skip_version_policy: bool = False):
        self.helm = helm
        self.request = request
        self.values = normalise(values)
        self.skip_version_policy = skip_version_policy
        self.masker = ValueMasker()

    def plan(self, chart: ChartRef) -> dict:
        """What ``ensure`` would do with ``chart`` (its name and version), changing nothing: the upgrade role plans with
        the chart as read on the controller, before anything is copied to the node."""
        return self._read(chart).result

    def ensure(self, check_mode: bool, diff: bool) -> dict:
        request = self.request
        reading = self._read(resolve_chart(request.chart_ref, request.chart_version, request.chart_repo_url))
        result = dict(reading.result, helm_major_version=self.helm.major, rolled_back=False)
        if diff:
            result["diff"] = self._diff(reading.deployed_values, reading.present)
        if reading.plan.action == "none" or check_mode:
            return result
        atomic_by_helm = request.atomic and request.wait
        try:
            result["command"] = self.helm.upgrade(request, self.values)
        except HelmError as exc:
            self._fail(result, reading.plan, str(exc), reading.deployed if reading.present else None, atomic_by_helm)
        after = self.helm.status(request.release_name, request.release_namespace)
        if after is not None:
            result.update(revision=after.revision, status=after.status)
        return result

    def uninstall(self, check_mode: bool) -> dict:
        """``state: absent``: uninstall the release if helm knows it (a release uninstalled with kept history counts as
        absent). The caller takes the backup first (the helm_release action: the CRDs and custom resources)."""
        request = self.request
        where = f"release {request.release_name} in namespace {request.release_namespace}"
        deployed = self.helm.status(request.release_name, request.release_namespace)
        present = deployed is not None and deployed.status != "uninstalled"
        result: dict = dict(
            changed=present,
            action="uninstall" if present else "none",
            reason=(
                f"{where} exists (revision {deployed.revision}, {deployed.status})"
                if present and deployed
                else f"{where} does not exist"
            ),
            release_name=request.release_name,
            release_namespace=request.release_namespace,
            previous_chart_version=deployed.chart_version if present and deployed else None,
            previous_revision=deployed.revision if deployed else None,
            revision=None if present else (deployed.revision if deployed else None),
            helm_major_version=self.helm.major,
            rolled_back=False,
        )
        if not present or check_mode:
            return result
        try:
            result["command"] = self.helm.uninstall(request)
        except HelmError as exc:
            result["command"] = self.helm.uninstall_argv(request)
            try:
                after = self.helm.status(request.release_name, request.release_namespace)
            except HelmError:
                after = deployed
            result["changed"] = after is None or after != deployed
            result["revision"] = after.revision if after else None
            raise ReleaseFailed(f"helm uninstall of {where} failed: {exc}", result) from None
        return result

    def _read(self, chart: ChartRef) -> _Reading:
        request = self.request
        deployed = self.helm.status(request.release_name, request.release_namespace)
        present = deployed is not None and deployed.status not in ("uninstalled",) + PENDING
        deployed_values = self.helm.get_values(request.release_name, request.release_namespace) if present else {}
        plan = plan_release(deployed, deployed_values, chart, self.values, self.skip_version_policy)
        result: dict = dict(
            changed=plan.action != "none",
            action=plan.action,
            reason=plan.reason,
            release_name=request.release_name,
            release_namespace=request.release_namespace,
            chart_name=chart.name,
            chart_version=chart.version,
            previous_chart_version=deployed.chart_version if present and deployed else None,
            previous_revision=deployed.revision if deployed else None,
            revision=deployed.revision if deployed else None,
            status=deployed.status if deployed else None,
        )
        return _Reading(plan, deployed, present, deployed_values, result)

    def _fail(
        self, result: dict, plan: Plan, message: str, deployed: DeployedRelease | None, atomic_by_helm: bool
    ) -> None:
        request = self.request
        result["command"] = self.helm.upgrade_argv(request, "<values file>")
        if request.atomic and not atomic_by_helm and plan.action == "upgrade" and deployed is not None:
            # Without wait helm cannot roll back by itself: return to the revision that was deployed.
            try:
                self.helm.rollback(
                    request.release_name, request.release_namespace, deployed.revision, request.wait_timeout
                )
                result["rolled_back"] = True
                message += f" (rolled back to revision {deployed.revision})"
            except HelmError as rollback_error:
                message += f"; the rollback to revision {deployed.revision} failed too: {rollback_error}"
        elif "rolled back" in message:
            result["rolled_back"] = True
        try:
            after = self.helm.status(request.release_name, request.release_namespace)
        except HelmError:
            after = None
        if after is not None:
            result.update(revision=after.revision, status=after.status)
            result["deployed_chart_version"] = after.chart_version
        # helm refusing up front (bad values, unknown chart, unreachable repository) records no revision: no change.
        result["changed"] = after is not None and (deployed is None or after.revision != deployed.revision)
        raise ReleaseFailed(message, result)

    def _diff(self, deployed_values: dict, present: bool) -> list[dict]:
        request = self.request
        masked_before = self.masker.mask(normalise(deployed_values))
        masked_after = self.masker.mask(self.values)
        diffs = [
            dict(
                before_header=f"{request.release_name} values (deployed, masked)",
                after_header=f"{request.release_name} values (requested, masked)",
                before=dump_values(masked_before) if present else "",
                after=dump_values(masked_after),
            )
        ]
        before_manifest = self.helm.get_manifest(request.release_name, request.release_namespace) if present else ""
        after_manifest = self.helm.template(request, self.values)
        secrets = [deployed_values, self.values]
        diffs.append(
            dict(
                before_header=f"{request.release_name} manifest (deployed)",
                after_header=f"{request.release_name} manifest (rendered)",
                before=self.masker.scrub_text(before_manifest, secrets),
                after=self.masker.scrub_text(after_manifest, secrets),
            )
        )
        return diffs


class ReleaseFailed(HelmError):
    """helm failed to install or upgrade; ``result`` says what is deployed now."""

    def __init__(self, message: str, result: dict):
        super().__init__(message)
        self.result = result
