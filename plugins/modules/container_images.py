#!/usr/bin/python
# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: container_images
short_description: Fetch and verify the container images of one Kubernetes version, as OCI archives, into the controller's cache
version_added: 0.2.0
description:
  - Runs on the controller. Selects the row of O(kubernetes_version) in the versions table (as
    M(confidential.kubernetes.kubernetes_artifacts) does) and fetches its images O(images) - kube-apiserver,
    kube-controller-manager, kube-scheduler, kube-proxy, etcd, CoreDNS and pause - each as an OCI image-layout tar
    archive, into C(<cache_dir>/images/<manifest digest>/).
  - Sources, one of - O(source_dir), a directory holding C(images/<repository>/<tag>.oci.tar) (for example
    C(images/registry.k8s.io/pause/3.10.2.oci.tar)); or O(mirror_url), a base URL serving the same paths (the binary
    mirror's base URL, with the images beside the binaries). Pulling from a registry is not supported; an image with
    no source fails saying which sources exist.
  - Each archive is verified before it is cached - read as containerd's importer reads a tar (member names cleaned like
    Go's C(path.Clean), regular files only; duplicate, non-canonical, escaping or unexpected members, C(CONTTYPE),
    sparse and link members and a Docker archive's C(manifest.json) or C(repositories) refused naming the member),
    index.json's names for its image the image's reference or none, every blob's sha256 is its name, index.json
    names exactly one image, its manifest (for an image index, the manifest of each node architecture) is present with its config and
    layers, and the archive is at most 4 GiB - and index.json's digest must be the image's digest.
  - The digest an image must have is the one the row pins (C(registry/path:tag@sha256:...)), else the one the lock
    file O(lock_file) records. An image with neither gets the digest of its first verified archive recorded in the
    lock file; every later fetch, and every node (M(confidential.kubernetes.containerd_images)), must match it. A
    mismatch fails naming the image and both digests, caches nothing and records nothing. To trust a new image under
    the same tag, delete its line from the lock file.
  - A cached archive is trusted while it keeps the stat fingerprint recorded beside it when it was verified (as the
    binaries' cache does); otherwise it is verified again, and removed and fetched again when it fails.
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
      - Fetches and records nothing; reports a change when an image is not cached under its pinned or locked digest.
  diff_mode:
    support: none
  idempotent:
    support: full
options:
  images:
    description:
      - The images of the row to fetch, by their names in the row - kubeadm's (the default) and those its CNI chart
        deploys (C(cilium), C(cilium-operator), C(cilium-envoy), which the chart's entry in the row names). A name
        the row pins no image for fails naming it.
    type: list
    elements: str
    default: [kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy, etcd, coredns, pause]
  images_extra:
    description:
      - Images beyond the row's, by name, each C(registry/path:tag) with an optional C(@sha256:<digest>) (a site's CNI
        or workloads), fetched, verified and locked the same way. A name of the row's images is refused; a
        reference that is also one of the row's images is fetched once.
    type: dict
    default: {}
  lock_file:
    description: The lock file of image digests recorded on first fetch; C(<cache_dir>/images.lock.yml) when empty.
    type: path
    default: ""
notes:
  - The nodes receive the archives from the controller and import them with M(confidential.kubernetes.containerd_images)
    before kubeadm runs; they pull no image.
  - An archive of the right shape is what C(ctr -n k8s.io images export --platform linux/amd64 <file> <reference>)
    or C(skopeo copy docker://<reference> oci-archive:<file>) writes.
"""

EXAMPLES = r"""
- name: Fetch the images of Kubernetes 1.36.4 from the site's directory
  confidential.kubernetes.container_images:
    kubernetes_version: 1.36.4
    source_dir: /srv/kubernetes-mirror
  run_once: true
  register: images
"""

RETURN = r"""
images:
  description: The row's images in the cache, each with C(name), C(reference), C(digest), C(path) and C(filename).
  returned: success
  type: list
  elements: dict
fetched:
  description: The images this run fetched (or would fetch, in check mode).
  returned: always
  type: list
  elements: str
  sample: ["pause (registry.k8s.io/pause:3.10.2)"]
locked:
  description: The references whose digest this run recorded in the lock file.
  returned: success
  type: list
  elements: str
cache_dir:
  description: The absolute cache directory.
  returned: success
  type: str
lock_file:
  description: The absolute path of the lock file.
  returned: success
  type: str
"""
