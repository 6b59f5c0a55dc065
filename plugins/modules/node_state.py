#!/usr/bin/python
# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: node_state
short_description: Learn in one call what a node needs, and prepare its host as kubeadm's preflight expects
version_added: 0.2.0
description:
  - Reports, in one round trip, everything the C(confidential.kubernetes.node) role needs to decide a re-run - the
    node's machine, whether the modules' virtualenv imports what they need, which runtime tools are found, which stamps
    of the installed node stack still verify, the state of systemd services, and whether an archive is unpacked where it
    belongs. Each part is asked for by its options and left out otherwise.
  - Prepares the host as kubeadm's preflight expects, where asked - swap turned off and its C(/etc/fstab) lines commented
    out, kernel modules loaded and listed in O(modules_load_file), sysctls set and written to O(sysctl_file) - and
    writes the stamp of an installed stack, where asked (O(stamp_dest)). These are the only things the module changes,
    and RV(changes) says what it changed.
  - Run it in check mode first to learn, before anything changes, what the host preparation would change; run it
    again for real only when RV(changes) is not empty.
  - Needs only the Python standard library, so it runs on the node's system Python before the virtualenv exists.
  - A malformed kernel module name, sysctl key or value, or checksum fails naming it, and changes nothing.
  - A sysctl that does not take its value - the kernel did not take it, or a file the boot applies after O(sysctl_file)
    sets another - fails naming the key, the value and where it is set.
author:
  - confidential.kubernetes contributors (@confidential-kubernetes)
extends_documentation_fragment:
  - confidential.kubernetes._attributes
attributes:
  check_mode:
    support: full
    details:
      - Reads everything and changes nothing; RV(changes) and the diff say what the host preparation would change, and
        RV(changes) whether the stamp O(stamp_dest) would be written (always, when one of O(stamp_files) is missing).
  diff_mode:
    support: full
    details:
      - Shows O(fstab), O(modules_load_file) and O(sysctl_file) before and after.
  idempotent:
    support: full
options:
  venv:
    description:
      - A virtualenv whose C(bin/python) must import every module of O(venv_imports); reported as RV(venv).
    type: path
  venv_imports:
    description: The modules the virtualenv must import, by dotted name (for example C(cryptography.hazmat.primitives.hpke)).
    type: list
    elements: str
    default: []
  tools:
    description: Commands the node must have, looked up on C(PATH) and in the system's C(sbin) and C(bin) directories; reported as RV(tools).
    type: list
    elements: str
    default: []
  packages:
    description:
      - Debian packages the node must have (the versions table row's C(host_packages)); reported as RV(packages), read
        with C(dpkg-query). Nothing is installed.
    type: list
    elements: str
    default: []
  swap_off:
    description:
      - Turn swap off (C(swapoff --all)) when C(/proc/swaps) lists any, and comment out (C(# )) every swap line of O(fstab).
      - So that nothing turns it on again at the next boot, also mask (C(systemctl mask)) every swap unit systemd knows
        (C(systemctl list-units --type=swap --all)) and the zram services C(zramswap.service) (Debian's zram-tools) and
        C(zram-config.service) (Ubuntu's zram-config), and mask systemd's zram-generator with a link to C(/dev/null) in
        C(/etc/systemd/system-generators) where it is installed. Where systemd cannot say (no C(systemctl), or a system
        not booted with systemd) there are no units to mask.
    type: bool
    default: false
  fstab:
    description: The fstab whose swap lines O(swap_off) comments out; a missing file is left missing.
    type: path
    default: /etc/fstab
  kernel_modules:
    description:
      - Kernel modules to load now (C(modprobe)) when C(/proc/modules) does not list them, and at boot (one a line in
        O(modules_load_file), mode 0644).
    type: list
    elements: str
    default: []
  modules_load_file:
    description: The C(modules-load.d) file that lists O(kernel_modules).
    type: path
    default: /etc/modules-load.d/kubernetes.conf
  sysctls:
    description:
      - Sysctls to set now (through C(/proc/sys)) where their value differs, and at boot (C(key = value) a line in
        O(sysctl_file), mode 0644). Values compare with their whitespace collapsed, as C(/proc/sys) shows them.
      - Then each is checked as the kernel has it and as the boot will set it - the last file in O(sysctl_dirs), by
        name, that sets the key. A value that differs fails naming the key, the value and where it is set (the file, or
        that no C(sysctl.d) file sets it). Not in check mode, which changes nothing.
    type: dict
    default: {}
  sysctl_file:
    description:
      - The C(sysctl.d) file that holds O(sysctls). Its name should sort after every other file of O(sysctl_dirs), so
        that no other file overrides it at boot - C(zz-) sorts after C(99-sysctl.conf), Debian's link to
        C(/etc/sysctl.conf).
    type: path
    default: /etc/sysctl.d/zz-confidential-kubernetes.conf
  sysctl_files_replaced:
    description: Files that held O(sysctls) before (an earlier name of O(sysctl_file)), removed where they exist.
    type: list
    elements: path
    default: []
  sysctl_dirs:
    description:
      - The directories systemd-sysctl reads at boot, in its order of precedence for files of the same name; what
        O(sysctls) are checked against.
    type: list
    elements: path
    default: [/etc/sysctl.d, /run/sysctl.d, /usr/local/lib/sysctl.d, /usr/lib/sysctl.d, /lib/sysctl.d]
  stamps:
    description:
      - A glob of stamps, files in C(sha256sum)'s format that list the sha256 of installed files (O(stamp_dest) writes
        them). Each match is reported in RV(stamps) with whether every file it lists still has that sha256, as
        C(sha256sum --check --strict) would find, and the mode its C(#stat) line records.
      - Fast path - a C(#stat) line also records the file's fingerprint when it was hashed (inode, size, mtime and
        ctime in nanoseconds). A file that still has that fingerprint is taken as verified without reading it, since any
        write, truncate, chmod or chown moves a file's ctime, which cannot be set back from user space, and a file put
        in its place is another inode. Every other file is hashed, and so is every file of a stamp without C(#stat)
        lines (written by an older version of this collection, which still verifies).
      - What the fast path trusts - the kernel's ctime and the stamp itself (root's, mode 0644). A change that bypasses
        the filesystem (writing to the block device, media corruption) or a clock set back to the second a file was
        written is found only by hashing; remove the stamps to have the next run install and hash everything.
    type: str
  stamp_dest:
    description:
      - Write the stamp of O(stamp_files) here (mode 0644), when it differs - each file's sha256 in C(sha256sum)'s
        format after a C(#stat) line with its mode and fingerprint. First waits, at most a second, until the newest file
        changed long enough ago that a later change in the same timestamp tick cannot keep its ctime (a file that is
        still too new, or changes while it is read, gets no C(#stat) line and is hashed on every check).
      - A file that cannot be read, or whose name holds a newline or backslash, fails naming it.
    type: path
  stamp_files:
    description:
      - The installed files O(stamp_dest) lists, in order; at least one regular file. Needs O(stamp_dest).
      - A directory among them is recorded with its mode (a C(#dir) line) - the stamp verifies only while it is a
        directory with that mode.
    type: list
    elements: path
  stamp_absent:
    description:
      - Paths that the install removed, recorded in O(stamp_dest) (C(#absent) lines) - the stamp verifies only while
        none of them exists. One that exists fails the stamp (in check mode it would be written).
    type: list
    elements: path
    default: []
  services:
    description: systemd units whose state is reported in RV(services).
    type: list
    elements: str
    default: []
  archive:
    description:
      - A tar archive on the node that is unpacked under O(archive_dest); reported as RV(archive). Needs
        O(archive_dest) and O(archive_sha256).
    type: path
  archive_dest:
    description: The directory O(archive) is unpacked in.
    type: path
  archive_sha256:
    description: The sha256 the archive should have (the controller's copy of it), 64 lower-case hexadecimal digits.
    type: str
notes:
  - The host preparation needs root. Everything else only reads.
seealso:
  - module: ansible.posix.sysctl
  - module: community.general.modprobe
"""

EXAMPLES = r"""
- name: Learn the node's state before anything changes
  confidential.kubernetes.node_state:
    venv: /opt/confidential-kubernetes/venv
    venv_imports: [yaml, grpc]
    tools: [cryptsetup]
    swap_off: true
    kernel_modules: [overlay, br_netfilter]
    sysctls:
      net.bridge.bridge-nf-call-iptables: 1
      net.ipv4.ip_forward: 1
    stamps: /var/cache/confidential-kubernetes/artifacts/installed-*.sha256
    services: [containerd, kubelet]
  check_mode: true
  changed_when: false
  register: node_state

- name: Stamp what was installed (the next probe verifies it)
  confidential.kubernetes.node_state:
    stamp_dest: /var/cache/confidential-kubernetes/artifacts/installed-5d1c0b.sha256
    stamp_files: [/usr/local/bin/kubeadm, /usr/local/bin/kubelet, /etc/systemd/system/kubelet.service]

- name: Prepare the host when the probe found something to do
  confidential.kubernetes.node_state:
    swap_off: true
    kernel_modules: [overlay, br_netfilter]
    sysctls:
      net.bridge.bridge-nf-call-iptables: 1
      net.ipv4.ip_forward: 1
  when: node_state.changes | length > 0

- name: Is the shipped code unpacked and current?
  confidential.kubernetes.node_state:
    archive: /opt/confidential-kubernetes/lib.tar
    archive_dest: /opt/confidential-kubernetes/lib
    archive_sha256: 0e5751c026e543b2e8ab2eb06099daa1d1e5df47778f7787faab45cdf12fe3a8
  register: shipped_code
"""

RETURN = r"""
changes:
  description: What the host preparation and the stamp changed, or in check mode would change, one entry a step; empty when nothing.
  returned: always
  type: list
  elements: str
  sample: ["swapoff --all (active: /swapfile)", "systemctl mask dev-vda2.swap",
           "write /etc/sysctl.d/zz-confidential-kubernetes.conf", "sysctl net.ipv4.ip_forward = 1 (was 0)",
           "write /var/cache/confidential-kubernetes/artifacts/installed-5d1c0b.sha256"]
architecture:
  description: The node's machine as Ansible's facts name it (C(ansible_architecture)).
  returned: always
  type: str
  sample: x86_64
python_version:
  description: The version of the Python this module ran with (the one Ansible runs on the node).
  returned: always
  type: str
  sample: 3.11.2
venv:
  description: The virtualenv O(venv) - its C(path), whether it is C(complete) (imports every module), and the C(error) line when not.
  returned: when O(venv) is set
  type: dict
  sample: {path: /opt/confidential-kubernetes/venv, complete: false, error: "ModuleNotFoundError: No module named 'grpc'"}
tools:
  description: Each tool of O(tools) and its path; null for a missing one.
  returned: always
  type: dict
  sample: {cryptsetup: /usr/sbin/cryptsetup}
packages:
  description: Each package of O(packages) and whether it is installed; all false where dpkg cannot say.
  returned: always
  type: dict
  sample: {conntrack: true, iptables: false}
stamps:
  description: Each stamp O(stamps) matches, and whether it verifies.
  returned: always
  type: dict
  sample: {/var/cache/confidential-kubernetes/artifacts/installed-5d1c0b.sha256: true}
services:
  description: Each unit of O(services) - C(active) (running) and C(enabled); both false where systemd cannot say.
  returned: always
  type: dict
  sample: {containerd: {active: true, enabled: true}, kubelet: {active: false, enabled: true}}
archive:
  description:
    - O(archive) on the node - its C(sha256) (null when missing), whether that is O(archive_sha256) (C(current)), and whether
      O(archive_dest) holds every directory and file of it with the same content and mode (C(unpacked)).
  returned: when O(archive) is set
  type: dict
  sample: {sha256: 0e5751c026e543b2e8ab2eb06099daa1d1e5df47778f7787faab45cdf12fe3a8, current: true, unpacked: true}
"""

import platform
import re

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.confidential.kubernetes.plugins.module_utils._node import NodeStateError
from ansible_collections.confidential.kubernetes.plugins.module_utils._node.state import (
    SYSCTL_DIRS,
    HostPreparation,
    NodeState,
    Outcome,
)

SHA256 = re.compile(r"^[0-9a-f]{64}$")


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            venv=dict(type="path"),
            venv_imports=dict(type="list", elements="str", default=[]),
            tools=dict(type="list", elements="str", default=[]),
            packages=dict(type="list", elements="str", default=[]),
            swap_off=dict(type="bool", default=False),
            fstab=dict(type="path", default="/etc/fstab"),
            kernel_modules=dict(type="list", elements="str", default=[]),
            modules_load_file=dict(type="path", default="/etc/modules-load.d/kubernetes.conf"),
            sysctls=dict(type="dict", default={}),
            sysctl_file=dict(type="path", default="/etc/sysctl.d/zz-confidential-kubernetes.conf"),
            sysctl_files_replaced=dict(type="list", elements="path", default=[]),
            sysctl_dirs=dict(type="list", elements="path", default=list(SYSCTL_DIRS)),
            stamps=dict(type="str"),
            services=dict(type="list", elements="str", default=[]),
            archive=dict(type="path"),
            archive_dest=dict(type="path"),
            archive_sha256=dict(type="str"),
            stamp_dest=dict(type="path"),
            stamp_files=dict(type="list", elements="path"),
            stamp_absent=dict(type="list", elements="path", default=[]),
        ),
        required_together=[("archive", "archive_dest", "archive_sha256"), ("stamp_dest", "stamp_files")],
        supports_check_mode=True,
    )
    params = module.params
    if params["archive_sha256"] is not None and not SHA256.match(params["archive_sha256"]):
        module.fail_json(
            msg=f"archive_sha256 must be 64 lower-case hexadecimal digits, not {params['archive_sha256']!r}"
        )
    preparation = HostPreparation(
        swap_off=params["swap_off"],
        fstab=params["fstab"],
        kernel_modules=tuple(params["kernel_modules"]),
        modules_load_file=params["modules_load_file"],
        sysctls=tuple((str(key), str(value)) for key, value in params["sysctls"].items()),
        sysctl_file=params["sysctl_file"],
        sysctl_files_replaced=tuple(params["sysctl_files_replaced"]),
        sysctl_dirs=tuple(params["sysctl_dirs"]),
    )
    node = NodeState(check_mode=module.check_mode)
    try:
        packages = node.packages(params["packages"])
    except NodeStateError as exc:
        module.fail_json(msg=str(exc))
    result = dict(
        architecture=node.architecture(),
        python_version=platform.python_version(),
        tools=node.tools(params["tools"]),
        packages=packages,
        stamps=node.stamps(params["stamps"]) if params["stamps"] else {},
        services=node.services(params["services"]),
    )
    if params["venv"]:
        result["venv"] = node.venv(params["venv"], params["venv_imports"])
    if params["archive"]:
        result["archive"] = node.archive(params["archive"], params["archive_dest"], params["archive_sha256"])
    outcome = Outcome()
    try:
        node.prepare(preparation, outcome)
        if params["stamp_dest"]:
            node.write_stamp(params["stamp_dest"], params["stamp_files"], outcome, params["stamp_absent"])
    except NodeStateError as exc:
        module.fail_json(msg=str(exc), changed=bool(outcome.changes), changes=outcome.changes, **result)
    except OSError as exc:
        module.fail_json(
            msg=f"preparing the host: {exc}", changed=bool(outcome.changes), changes=outcome.changes, **result
        )
    if module._diff:
        result["diff"] = outcome.diff
    module.exit_json(changed=bool(outcome.changes), changes=outcome.changes, **result)


if __name__ == "__main__":
    main()
