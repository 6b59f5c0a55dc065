# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Checks before the point of no return (DESIGN section 6): installed versions, the kubelet skew policy, and kubeadm's
own preflight, run while the node is still unlocked (PCR 15 zero, no lock record).

What ``kubeadm join phase preflight`` checks before it needs the cluster (kubeadm 1.20
cmd/phases/join/preflight.go): ``RunJoinNodeChecks`` first (root, /etc/kubernetes/manifests empty, kubelet.conf,
bootstrap-kubelet.conf and, on workers, ca.crt absent, the container runtime, port 10250, swap, the kubelet's
version and service, required binaries, ip_forward, bridge-nf-call-iptables, HTTP proxy), and only then
``InitCfg()``, which runs discovery. A bootstrap-token discovery dials the API server with the token, which a node
gets only inside its join ticket, so here discovery is a local file that kubeadm cannot parse: kubeadm validates
that it exists, ``clientcmd.LoadFromFile`` fails on it and nothing is dialled. The control-plane checks (ports
6443, 10257, 10259, 2379, 2380, the etcd data directory, image pulls) come after discovery and therefore run
only inside ``kubeadm join``, after the lock.
"""

from __future__ import annotations

import os
import re
import tempfile

from . import ADMIN_CONF, KUBELET_CONF, JoinOptions, Kubeadm, KubeadmError, join_skip_phases, skip_phases

try:
    import yaml
except ImportError:  # reported by the modules through missing_required_lib()
    pass

_VERSION = re.compile(r"\bv?(\d+)\.(\d+)\.(\d+)\b")
# kubeadm's error once the general join checks passed and discovery reached the unparseable placeholder file.
DISCOVERY_REACHED = "couldn't validate the identity of the API Server"
# The options kubeadm_init and kubeadm_join take for their preflight mode (documented in each module).
PREFLIGHT_OPTIONS = dict(
    preflight=dict(type="bool", default=False),
    kubelet_binary_path=dict(type="path", default="kubelet"),
)
# Deliberately not YAML: kubeadm's file discovery fails on it before any connection.
DISCOVERY_PLACEHOLDER = "{\n"


class PreflightError(KubeadmError):
    """A check before the node lock failed; the message says what to fix. Nothing was changed."""


def parse_version(text: str, what: str) -> tuple[int, int, int]:
    """(major, minor, patch) of ``v1.20.2``, ``1.20.2`` or ``Kubernetes v1.20.2`` (``kubelet --version``)."""
    match = _VERSION.search(str(text or ""))
    if not match:
        raise PreflightError(f"cannot read the version of {what} from {text!r}")
    return int(match.group(1)), int(match.group(2)), int(match.group(3))


def _show(version: tuple[int, int, int]) -> str:
    return "v%d.%d.%d" % version


def check_installed(wanted: str, installed: dict[str, str]) -> None:
    """Every installed binary (name -> its version output) must be exactly ``wanted``; nothing to check when it is empty."""
    if not wanted:
        return
    target = parse_version(wanted, "kubernetes_version")
    wrong = {name: parse_version(output, name) for name, output in sorted(installed.items())}
    wrong = {name: version for name, version in wrong.items() if version != target}
    if wrong:
        found = ", ".join(f"{name} is {_show(version)}" for name, version in wrong.items())
        raise PreflightError(
            f"{found} but kubernetes_version is {_show(target)}: install the binaries of {_show(target)} (the node "
            "role installs the versions table's row of kubernetes_version) or set kubernetes_version to the "
            "installed version; the node was not locked"
        )


def max_kubelet_skew(api_server: tuple[int, int, int], kubelet: tuple[int, int, int]) -> int:
    """Minor versions a kubelet may lag behind the API server: 3 from API server 1.28 for kubelets from 1.25, else 2."""
    return 3 if api_server[:2] >= (1, 28) and kubelet[:2] >= (1, 25) else 2


def check_kubelet_skew(kubelet_version: str, cluster_version: str) -> None:
    """The kubelet skew policy: never a newer minor than the API server, at most ``max_kubelet_skew`` minors older."""
    kubelet = parse_version(kubelet_version, "the kubelet")
    cluster = parse_version(cluster_version, "the cluster (the join ticket's kubernetes_version)")
    if kubelet[0] != cluster[0] or kubelet[1] > cluster[1]:
        raise PreflightError(
            f"the kubelet is {_show(kubelet)}, newer than the cluster's API server ({_show(cluster)}): a kubelet "
            "must never be newer than the API server; install the cluster's version on this node"
        )
    allowed = max_kubelet_skew(cluster, kubelet)
    if cluster[1] - kubelet[1] > allowed:
        raise PreflightError(
            f"the kubelet is {_show(kubelet)}, {cluster[1] - kubelet[1]} minor versions older than the cluster's API "
            f"server ({_show(cluster)}); the skew policy allows {allowed}: install a newer kubelet on this node"
        )


def installed_versions(kubeadm: Kubeadm, kubelet_binary: str) -> dict[str, str]:
    """``kubeadm version -o short`` and ``kubelet --version``."""
    rc, out, err = kubeadm._run_command([kubelet_binary, "--version"])
    if rc != 0:
        raise PreflightError(f"{kubelet_binary} --version failed (exit {rc}): {(err or out).strip()}")
    return {"kubeadm": kubeadm.version(), "kubelet": out.strip()}


def _ignore_flag(ignore_preflight_errors: list[str]) -> list[str]:
    return ["--ignore-preflight-errors=" + ",".join(ignore_preflight_errors)] if ignore_preflight_errors else []


def _errors(out: str, err: str) -> str:
    """kubeadm's failure without its warnings (which it prints to the same stream before the errors)."""
    lines = [line for line in (err or out).strip().splitlines() if not line.strip().startswith("[WARNING")]
    return "\n".join(lines)


def init_preflight(kubeadm: Kubeadm, config_path: str, ignore_preflight_errors: list[str]) -> None:
    """``kubeadm init phase preflight`` on the rendered configuration (it pulls the images unless ImagePull is ignored)."""
    rc, out, err = kubeadm._run_command(
        [kubeadm.binary, "init", "phase", "preflight", "--config", config_path, *_ignore_flag(ignore_preflight_errors)]
    )
    if rc != 0:
        raise PreflightError(
            f"kubeadm's init preflight failed (exit {rc}); fix this and run again, the node was not locked: "
            f"{_errors(out, err)}"
        )


def render_join_preflight_config(options: JoinOptions, api_version: str, discovery_file: str) -> str:
    """The node's JoinConfiguration with file discovery pointing at ``discovery_file`` (no token, no endpoint)."""
    document = {
        "apiVersion": f"kubeadm.k8s.io/{api_version}",
        "kind": "JoinConfiguration",
        "discovery": {"file": {"kubeConfigPath": discovery_file}},
        "nodeRegistration": {
            key: value for key, value in (("name", options.node_name), ("criSocket", options.cri_socket)) if value
        },
    }
    if options.control_plane:
        document["controlPlane"] = {
            "localAPIEndpoint": {
                key: value
                for key, value in (("advertiseAddress", options.advertise_address), ("bindPort", options.bind_port))
                if value
            }
        }
    phases = skip_phases(api_version, join_skip_phases(options))[0]
    if phases:
        document["skipPhases"] = phases
    return yaml.safe_dump(document, sort_keys=False)


def join_preflight(
    kubeadm: Kubeadm, options: JoinOptions, api_version: str, ignore_preflight_errors: list[str]
) -> None:
    """``kubeadm join phase preflight``'s checks that need no cluster; passes when kubeadm got as far as discovery."""
    with tempfile.TemporaryDirectory(prefix="kubeadm-preflight-") as directory:
        discovery_file = os.path.join(directory, "no-discovery.conf")
        config_path = os.path.join(directory, "join.yaml")
        with open(discovery_file, "w", encoding="ascii") as handle:
            handle.write(DISCOVERY_PLACEHOLDER)
        with open(config_path, "w", encoding="utf-8") as handle:
            handle.write(render_join_preflight_config(options, api_version, discovery_file))
        rc, out, err = kubeadm._run_command(
            [
                kubeadm.binary,
                "join",
                "phase",
                "preflight",
                "--config",
                config_path,
                *_ignore_flag(ignore_preflight_errors),
            ]
        )
    if rc != 0 and DISCOVERY_REACHED not in err + out:
        raise PreflightError(
            f"kubeadm's join preflight failed (exit {rc}); fix this and run again, the node was not locked: "
            f"{_errors(out, err)}"
        )


def _passed(versions: dict[str, str], check_mode: bool) -> dict:
    # In check mode kubeadm's preflight does not run: it pulls images.
    return {
        "changed": False,
        "preflight": "checked" if check_mode else "passed",
        "kubeadm_version": versions["kubeadm"],
        "kubelet_version": versions["kubelet"],
    }


def preflight_init(
    kubeadm: Kubeadm,
    rendered: str,
    wanted_version: str,
    kubelet_binary: str,
    ignore_preflight_errors: list[str],
    check_mode: bool,
) -> dict:
    """Everything kubeadm_init checks before the lock: versions, the rendered configuration, kubeadm's init preflight.

    A node that was initialised (admin.conf exists) is not checked again: kubeadm init leaves it alone.
    """
    if os.path.exists(kubeadm.path(ADMIN_CONF)):
        return {"changed": False, "preflight": "initialised"}
    versions = installed_versions(kubeadm, kubelet_binary)
    check_installed(wanted_version, versions)
    result = _passed(versions, check_mode)
    fd, config_path = tempfile.mkstemp(prefix="kubeadm-preflight-", suffix=".yaml")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(rendered)
        result["config_validated"] = kubeadm.validate(config_path, "init")
        if not check_mode:
            init_preflight(kubeadm, config_path, ignore_preflight_errors)
    finally:
        os.unlink(config_path)
    return result


def preflight_join(
    kubeadm: Kubeadm,
    options: JoinOptions,
    api_version: str,
    wanted_version: str,
    kubelet_binary: str,
    ignore_preflight_errors: list[str],
    check_mode: bool,
) -> dict:
    """Everything kubeadm_join checks before the node has a ticket: versions and kubeadm's local join checks.

    A node that has joined (kubelet.conf exists) is not checked again: kubeadm join leaves it alone.
    """
    if os.path.exists(kubeadm.path(KUBELET_CONF)):
        return {"changed": False, "preflight": "joined"}
    versions = installed_versions(kubeadm, kubelet_binary)
    check_installed(wanted_version, versions)
    if not check_mode:
        join_preflight(kubeadm, options, api_version, ignore_preflight_errors)
    return _passed(versions, check_mode)
