"""The Ansible inventory the lab writes for its nodes (YAML, rendered without a YAML library)."""

from __future__ import annotations

import json
from pathlib import Path

from .base import STANDIN_KUBELET
from .paths import KUBERNETES_VERSION
from .plan import KIND_VM, NodeSpec
from .vm import EVENT_LOG as VM_EVENT_LOG, STATE_DISK_DEVICE
from .vmruntime import TOOLS_IMAGE, images_dir

NODE_PYTHON = "/opt/confidential-kubernetes/venv/bin/python"
NODE_TPM_TCTI = "swtpm:path=/run/tpm/swtpm.sock"
NODE_STATE_DISK = "/srv/state-disk.img"
NODE_EVENT_LOG = "/run/tpm/binary_bios_measurements"
# The kubelet stand-in's CRI endpoint (tests/doubles/kubelet_standin): kubeadm asks its crictl about images and pods.
NODE_CRI_SOCKET = "unix:///run/kubelet-standin/runtime.sock"
# Lab-only: the images of pods the stand-in cannot run (kube-proxy, CoreDNS, pause) cannot be pulled here.
LAB_IGNORED_PREFLIGHT_ERRORS = ["ImagePull"]
# Lab-only: kubeadm init deploys no addon the stand-in cannot run (it runs no pod from the API). Their objects would
# stay Pending for ever, and kubeadm 1.20's upgrade apply, which upgrades an addon only when its ConfigMap exists, would
# then wait 42.6 min for a ready CoreDNS replica after the static pods (postupgrade.go, TryRunCommand(..., 10)).
# A lab with VM nodes gets kube-proxy (VM_SKIPPED_INIT_PHASES): a real kubelet runs its DaemonSet's pod there (its
# pods on nspawn nodes stay Pending; nothing waits for them).
LAB_SKIPPED_INIT_PHASES = ["addon/coredns", "addon/kube-proxy"]
VM_SKIPPED_INIT_PHASES = ["addon/coredns"]
# The VM's container runtime: the row's containerd (Debian's 1.6, cklab/runtime.py), which the real kubelet talks to.
VM_CRI_SOCKET = "unix:///run/containerd/containerd.sock"
# crictl is not in bookworm and the lab's row has none; kubeadm join's preflight only checks that it is on the PATH.
VM_IGNORED_PREFLIGHT_ERRORS = ["FileExisting-crictl"]
# A VM node (cklab/vm.py) is a real host where the nspawn nodes are not: the production TCTI auto-detection finds its
# /dev/tpmrm0, the kernel's own event log is read, and its state disk is a block device that dm-crypt maps. The role
# installs the row's containerd and CNI plugins and the real kubelet there, imports the images its pods run from the
# lab's images directory (vm_variables), loads kernel modules and turns swap off: none of the nspawn nodes' stand-in
# settings apply.
VM_HOST_VARIABLES = {
    "lab_node_kind": KIND_VM,
    "node_stack_container_runtime": True,
    # The lab's init deploys no CoreDNS (VM_SKIPPED_INIT_PHASES): the sandboxes' pause, kube-proxy (the lab's build,
    # cklab/vmruntime.py) and the CNI chart's agent (the lab's tools image, cklab/cni.py) are the row's images a VM's
    # pods run. The tests' pods run the tools image as a site workload's (the same reference: fetched and imported
    # once).
    "node_kubernetes_images": ["pause", "kube-proxy", "cilium"],
    "kubernetes_images_extra": {"lab-tools": TOOLS_IMAGE},
    # The node play runs before the node venv exists (the role makes it); the later plays set the venv's Python.
    "ansible_python_interpreter": "/usr/bin/python3",
    # The VM reaches no Debian mirror: an air-gapped site, whose image holds the packages the role installs
    # (guest.PACKAGES); the node role refuses, naming it, a package the image lacks.
    "confidential_air_gapped": True,
    "node_stack_kubelet_path": "/usr/local/bin/kubelet",
    "node_stack_kernel_modules": True,
    "node_stack_swap_off": True,
    "join_kubeadm_extra": {"cri_socket": VM_CRI_SOCKET, "ignore_preflight_errors": VM_IGNORED_PREFLIGHT_ERRORS},
    "confidential_tpm_tcti": "auto",
    "confidential_tpm_event_log": VM_EVENT_LOG,
    "confidential_state_disk": {
        "device": STATE_DISK_DEVICE,
        "state": "mounted",
        "pbkdf_memory": 32768,
        "pbkdf_iterations": 4,
    },
    "confidential_state_disk_allow_unmapped": False,
}


def vm_variables(lab_dir: Path) -> dict:
    """A VM node's variables: VM_HOST_VARIABLES and where its images come from (the lab's images directory, whose
    digests the lab's own lock file records on first fetch)."""
    return {
        **VM_HOST_VARIABLES,
        "kubernetes_images_dir": str(images_dir(lab_dir)),
        "kubernetes_images_lock_file": str(lab_dir / "images.lock.yml"),
    }


def ssh_options(known_hosts: Path, batch: bool = True) -> list[str]:
    """ssh options that trust exactly the host keys the lab collected, never the user's ~/.ssh."""
    batch_options = ["-o", "BatchMode=yes"] if batch else []
    return [
        *batch_options,
        "-o",
        f"UserKnownHostsFile={known_hosts}",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "LogLevel=ERROR",
    ]


def _scalar(value) -> str:
    # JSON is valid YAML: a string is a double-quoted scalar, a mapping a flow mapping.
    return json.dumps(value)


# One SSH connection per node for a whole run (Ansible puts its socket under ~/.ansible/cp, a short path), and each
# task's module piped into the remote Python over it instead of copied to a temporary file first: one round trip a
# task instead of four. The lab logs in as root, so no sudo requiretty stands in the way.
CONNECTION_REUSE = ["-o", "ControlMaster=auto", "-o", "ControlPersist=60s"]


def render_inventory(
    nodes: list[NodeSpec], lab_dir: Path, ssh_key: Path, known_hosts: Path, versions_row: dict, mirror_url: str
) -> str:
    common_args = " ".join(ssh_options(known_hosts) + CONNECTION_REUSE)
    variables = {
        "ansible_user": "root",
        "ansible_ssh_private_key_file": str(ssh_key),
        "ansible_ssh_common_args": common_args,
        "ansible_pipelining": True,
        "ansible_python_interpreter": NODE_PYTHON,
        "confidential_tpm_tcti": NODE_TPM_TCTI,
        "confidential_ek_ca_file": str(lab_dir / "ca" / "ek-ca.pem"),
        "confidential_measurement_policy_file": str(lab_dir / "measurement-policy.yml"),
        # Lab-only: a cheap argon2id cost keeps keyslot operations fast on this 2-core machine.
        "confidential_state_disk": {
            "device": NODE_STATE_DISK,
            "state": "formatted",
            "pbkdf_memory": 32768,
            "pbkdf_iterations": 4,
        },
        # Lab-only: containers cannot map the state disk, so the node's cluster state stays on the root filesystem.
        "confidential_state_disk_allow_unmapped": True,
        "confidential_tpm_event_log": NODE_EVENT_LOG,
        "kubernetes_version": KUBERNETES_VERSION,
        "init_ca_key_algorithm": "ecdsa-p256",
        # The lab's row of the versions table (written with its build) and the mirror on the bridge serving it: the
        # node role installs kubeadm, kubelet, kubectl and helm from there, verified, as on a real air-gapped site.
        "kubernetes_versions_extra": versions_row,
        "kubernetes_mirror_url": mirror_url,
        # Lab-only: the unit runs the kubelet stand-in (the real kubelet the role installed cannot run in nspawn);
        # modprobe and swapoff would act on the host's kernel, so the role leaves them to the host. The stand-in is
        # the nodes' container runtime too: the role installs none of the row's.
        "node_stack_kubelet_path": STANDIN_KUBELET,
        "node_stack_container_runtime": False,
        "node_stack_kernel_modules": False,
        "node_stack_swap_off": False,
        "init_kubeadm_extra": {
            "cri_socket": NODE_CRI_SOCKET,
            "ignore_preflight_errors": LAB_IGNORED_PREFLIGHT_ERRORS,
            "skip_phases": VM_SKIPPED_INIT_PHASES
            if any(node.kind == KIND_VM for node in nodes)
            else LAB_SKIPPED_INIT_PHASES,
        },
        "join_kubeadm_extra": {"cri_socket": NODE_CRI_SOCKET, "ignore_preflight_errors": LAB_IGNORED_PREFLIGHT_ERRORS},
        # The VM nodes import the CNI chart's image from the lab's row (vm_variables): the chart runs that one. The
        # nspawn nodes run no pod, so their agents stay Pending whatever the image.
        "upgrade_cni_images_preloaded": True,
        "lab_dir": str(lab_dir),
    }
    lines = ["# Written by tests/lab/lab up; rewritten on every up.", "all:", "  vars:"]
    lines += [f"    {key}: {_scalar(value)}" for key, value in variables.items()]
    lines.append("  children:")
    for group in ("control_plane", "workers"):
        members = [node for node in nodes if node.group == group]
        if not members:
            lines.append(f"    {group}: {{}}")
            continue
        lines.append(f"    {group}:")
        lines.append("      hosts:")
        for node in members:
            lines.append(f"        {node.name}:")
            lines.append(f"          ansible_host: {_scalar(node.address)}")
            if node.tampered:
                lines.append("          lab_tampered: true")
            if node.kind == KIND_VM:
                lines += [f"          {key}: {_scalar(value)}" for key, value in vm_variables(lab_dir).items()]
    lines += ["    cluster:", "      children:", "        control_plane: {}", "        workers: {}"]
    return "\n".join(lines) + "\n"
