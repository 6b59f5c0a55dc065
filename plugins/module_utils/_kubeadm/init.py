# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""kubeadm init of the first control plane (what the kubeadm_init module does): render and validate the configuration,
make the ECDSA CAs older kubeadm cannot, run ``kubeadm init``, take back the rights it gives bootstrap tokens, and
record the init as complete - or, for an init that was cut short, finish it or say that the node needs a reset."""

from __future__ import annotations

import dataclasses
import os
import tempfile

from .._files import write_private_file
from .._reset import NEEDS_RESET
from . import (
    ADMIN_CONF,
    CA_CERT,
    INIT_RECORD,
    InitOptions,
    Kubeadm,
    KubeadmError,
    ca_cert_hash,
    config_api_version,
    has_encryption_algorithm,
    render_init_config,
    skip_phases,
)
from .ca import ECDSA_P256, CaError, make_missing_cas, missing_cas
from .preflight import preflight_init

DEFAULT_CONFIG_PATH = "/etc/kubernetes/kubeadm-init.yaml"


@dataclasses.dataclass(frozen=True)
class InitRun:
    """How ``kubeadm init`` runs, beside what it is given to render (InitOptions)."""

    config_path: str = DEFAULT_CONFIG_PATH
    config_api_version: str = "auto"
    ignore_preflight_errors: list = dataclasses.field(default_factory=list)
    upload_certs: bool = False


def check_before_init(
    kubeadm: Kubeadm, options: InitOptions, run: InitRun, kubelet_binary: str, check_mode: bool
) -> dict:
    """The checks before the node lock (preflight.preflight_init) on the configuration ``initialise`` would render.

    KubeadmError carries the result so far."""
    result = {"changed": False, "admin_kubeconfig": ADMIN_CONF}
    try:
        rendered = _render(kubeadm, options, run, result)
        result.update(
            preflight_init(
                kubeadm,
                rendered,
                options.kubernetes_version or "",
                kubelet_binary,
                run.ignore_preflight_errors,
                check_mode,
            )
        )
    except (KubeadmError, OSError, ValueError) as exc:
        raise KubeadmError(str(exc), result) from None
    return result


def initialise(
    kubeadm: Kubeadm, options: InitOptions, run: InitRun, check_mode: bool = False, diff: bool = False
) -> dict:
    """Initialise the node unless it is; the module's result. A node already initialised changes nothing.

    KubeadmError carries the result so far, with ``needs_reset`` where only a reset lets the node be initialised again.
    """
    result = {"changed": False, "admin_kubeconfig": ADMIN_CONF}
    try:
        _initialise(kubeadm, options, run, check_mode, diff, result)
    except KubeadmError as exc:
        raise KubeadmError(str(exc), exc.result or result) from None
    except (CaError, OSError, ValueError) as exc:
        raise KubeadmError(str(exc), result) from None
    return result


def _render(kubeadm: Kubeadm, options: InitOptions, run: InitRun, result: dict) -> str:
    api_version = config_api_version(kubeadm.version(), run.config_api_version)
    # Never left to kubeadm, which would look the version up on the internet.
    rendered = render_init_config(
        dataclasses.replace(options, kubernetes_version=options.kubernetes_version or kubeadm.version()), api_version
    )
    result["config_api_version"] = api_version
    return rendered


def _initialise(
    kubeadm: Kubeadm, options: InitOptions, run: InitRun, check_mode: bool, diff: bool, result: dict
) -> None:
    rendered = _render(kubeadm, options, run, result)
    if diff:
        result["diff"] = dict(
            before=_read(run.config_path), after=rendered, before_header=run.config_path, after_header="rendered"
        )
    if os.path.exists(kubeadm.path(ADMIN_CONF)):
        result["ca_cert_hash"] = _ca_cert_hash(kubeadm)
        if not kubeadm.init_completed(result["ca_cert_hash"]) and not check_mode:
            _finish_interrupted_init(kubeadm, result)
        return
    result["config_validated"] = _validate(kubeadm, rendered)
    result["changed"] = True
    encryption_config = options.encryption_provider_config
    if encryption_config and not check_mode and not os.path.isfile(kubeadm.path(encryption_config)):
        raise KubeadmError(
            f"the Secrets encryption configuration {encryption_config} does not exist, so kube-apiserver could not "
            "start: init_ticket writes it from the root secrets before kubeadm init; nothing was changed"
        )
    pki_dir = kubeadm.path(os.path.dirname(CA_CERT))
    if options.ca_key_algorithm == ECDSA_P256 and not has_encryption_algorithm(result["config_api_version"]):
        result["generated_cas"] = missing_cas(pki_dir)
    if check_mode:
        return
    make_missing_cas(pki_dir, result.get("generated_cas", []))
    # Created as before (0755 under the usual umask); the file itself is replaced atomically, 0600.
    os.makedirs(os.path.dirname(run.config_path), exist_ok=True)
    write_private_file(run.config_path, rendered.encode())
    try:
        result["stdout"] = kubeadm.init(
            run.config_path,
            run.ignore_preflight_errors,
            run.upload_certs,
            skip_phases(result["config_api_version"], options.skip_phases)[1],
        )
    except KubeadmError as exc:
        raise KubeadmError(
            f"{exc}. Before it can be initialised again, {NEEDS_RESET}.", dict(result, needs_reset=True)
        ) from None
    result["deleted_default_tokens"] = kubeadm.delete_default_tokens(ADMIN_CONF)
    result["revoked_token_bindings"] = kubeadm.revoke_token_certificate_rights(ADMIN_CONF)
    result["ca_cert_hash"] = _ca_cert_hash(kubeadm)
    kubeadm.record_init_completed(result["ca_cert_hash"])


def _finish_interrupted_init(kubeadm: Kubeadm, result: dict) -> None:
    """admin.conf without the record of a completed init: the control plane must answer, or the node needs a reset."""
    try:
        result["deleted_default_tokens"] = kubeadm.delete_default_tokens(ADMIN_CONF)
    except KubeadmError as exc:
        raise KubeadmError(
            f"{ADMIN_CONF} exists but kubeadm init never completed on this node ({INIT_RECORD} is missing) and "
            f"the control plane does not answer: {exc}. An interrupted kubeadm init: {NEEDS_RESET} before it "
            "can be initialised again.",
            dict(result, needs_reset=True),
        ) from None
    result["revoked_token_bindings"] = kubeadm.revoke_token_certificate_rights(ADMIN_CONF)
    kubeadm.record_init_completed(result["ca_cert_hash"])
    result["changed"] = result["deleted_default_tokens"] > 0 or bool(result["revoked_token_bindings"])


def _validate(kubeadm: Kubeadm, rendered: str) -> bool:
    """kubeadm's validation of the rendered configuration, from a 0600 file of its own that is deleted afterwards."""
    with tempfile.NamedTemporaryFile("w", prefix="kubeadm-init-", suffix=".yaml", delete=False) as candidate:
        os.fchmod(candidate.fileno(), 0o600)
        candidate.write(rendered)
    try:
        return kubeadm.validate(candidate.name, "init")
    finally:
        os.unlink(candidate.name)


def _ca_cert_hash(kubeadm: Kubeadm) -> str:
    with open(kubeadm.path(CA_CERT), "rb") as handle:
        return ca_cert_hash(handle.read())


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return ""
