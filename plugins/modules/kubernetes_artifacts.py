#!/usr/bin/python
# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: kubernetes_artifacts
short_description: Fetch and verify the binaries of one Kubernetes version into the controller's cache
version_added: 0.2.0
description:
  - Runs on the controller. Selects the row of O(kubernetes_version) in the versions table (the collection's
    C(plugins/module_utils/_versions/kubernetes_versions.yml), with O(versions_extra) merged over it) and fetches the
    artefacts O(artifacts) of that row for the given architectures - by default the node binaries kubeadm, kubelet,
    kubectl, crictl, containerd, runc, the CNI plugins and helm - into O(cache_dir).
  - A row also pins the CNI's Helm chart (C(cilium)), one file for every architecture, which the C(cni) entry point
    of the role C(confidential.kubernetes.upgrade) fetches with O(artifacts=[cilium]).
  - Each artefact is hashed while it streams into a temporary file beside its cache entry and renamed into
    C(<cache_dir>/<sha256>/<file name>) only when its sha256 is the table's. A mismatch fails naming the artefact
    and the URL it came from, and caches nothing.
  - A cached file is hashed again before it is used, unless it still has the stat fingerprint (inode, size, mtime and
    ctime in nanoseconds) recorded in C(<file name>.verified) beside it when it was last hashed and found to be the
    table's - any write, truncate, chmod or replacement since changes that fingerprint, and the file is hashed again.
    A file that no longer hashes to the table's sha256 is removed and fetched again. A verified cache hit touches no
    network and reports no change.
  - The records are written whole (a temporary file renamed over the old one), so concurrent runs sharing the cache
    read one record or the other, each naming a verified file; a cache the controller cannot write to is hashed on
    every run. The fast path trusts the kernel's ctime, which cannot be set back from user space; a change that
    bypasses the filesystem (media corruption) is found only by hashing - delete the C(.verified) records to have
    the next run hash every cached file.
  - Sources, one of - upstream's URL from the table; O(mirror_url), the same URL path under another base URL; or
    O(source_dir), a directory holding a mirror's tree (C(<source_dir>/<URL path>)) for air-gapped sites.
  - Prints one line per artefact fetched and a progress line every few seconds while a download runs.
  - An unknown version fails with the list of supported ones; a malformed row fails listing every problem (a runc
    without the fixes of CVE-2025-31133, CVE-2025-52565 and CVE-2025-52881 is one).
  - A row whose Kubernetes minor is past its end of life (the row's C(end_of_life)) fails naming the date, unless
    O(allow_end_of_life); nothing is fetched.
author:
  - confidential.kubernetes contributors (@confidential-kubernetes)
extends_documentation_fragment:
  - confidential.kubernetes._attributes
  - confidential.kubernetes._attributes.action
  - confidential.kubernetes._versions
  - confidential.kubernetes._fetch
attributes:
  check_mode:
    support: full
    details:
      - Fetches nothing; reports a change when an artefact is not cached yet. RV(artifacts) lists the artefacts
        already in the cache (not hashed again).
  diff_mode:
    support: none
  idempotent:
    support: full
options:
  artifacts:
    description:
      - The artefacts of the row to fetch - any of C(kubeadm), C(kubelet), C(kubectl), C(crictl), C(containerd),
        C(runc), C(cni_plugins), C(helm) (one file per architecture) and C(cilium) (the CNI's Helm chart, one file).
        An unknown name fails listing the known ones. The whole row is validated whatever is fetched.
    type: list
    elements: str
    default: [kubeadm, kubelet, kubectl, crictl, containerd, runc, cni_plugins, helm]
notes:
  - The nodes receive the artefacts from the controller (the C(kubernetes) entry point of the role
    C(confidential.kubernetes.node)); they need no internet.
"""

EXAMPLES = r"""
- name: Fetch the binaries of Kubernetes 1.36.4 for the play's nodes
  confidential.kubernetes.kubernetes_artifacts:
    kubernetes_version: 1.36.4
    architectures: "{{ ansible_play_hosts | map('extract', hostvars, 'ansible_architecture') | unique }}"
  run_once: true
  register: artifacts

- name: The CNI's chart pinned by the same row
  confidential.kubernetes.kubernetes_artifacts:
    kubernetes_version: 1.36.4
    artifacts: [cilium]
  run_once: true
  register: cni_chart

- name: The same from a site mirror
  confidential.kubernetes.kubernetes_artifacts:
    kubernetes_version: 1.36.4
    mirror_url: https://mirror.example.com/kubernetes
  run_once: true
"""

RETURN = r"""
version:
  description: The selected Kubernetes version.
  returned: success
  type: str
  sample: 1.36.4
fetched:
  description: The artefacts fetched by this run (empty on a verified cache hit).
  returned: always
  type: list
  elements: str
  sample: ["kubeadm 1.36.4 (amd64)"]
cache_dir:
  description: The absolute cache directory.
  returned: success
  type: str
host_packages:
  description: The Debian packages kubeadm's preflight checks for in this version (the row's C(host_packages)).
  returned: success
  type: list
  elements: str
  sample: [iptables, iproute2, ethtool]
end_of_life:
  description: The day the row's Kubernetes minor leaves upstream support; null for a row that records none.
  returned: success
  type: str
  sample: "2027-06-28"
images:
  description:
    - The images of the row, by name - kubeadm's (C(kube-apiserver), C(etcd), C(coredns), C(pause), ...) and those
      its CNI chart's entry names (C(cilium), C(cilium-operator), C(cilium-envoy)).
  returned: success
  type: dict
artifacts:
  description:
    - By artefact name, its C(version) and, for each architecture, the cached file's C(path), C(sha256) and C(filename).
    - A chart (C(cilium)) has C(version), C(path), C(sha256) and C(filename) directly, with no architecture level.
    - An artefact an extra row sets to null is absent.
  returned: success
  type: dict
"""
