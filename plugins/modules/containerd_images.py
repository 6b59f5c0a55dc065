#!/usr/bin/python
# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: containerd_images
short_description: Import pinned container images from verified OCI archives into containerd, before kubeadm runs
version_added: 0.2.0
description:
  - Runs on a node with containerd running. Asks containerd once (C(ctr images ls) in O(namespace)) which of
    O(images) it has under their reference with the pinned digest; a converged node stops there.
  - Each missing image's OCI archive (pushed by the role from the controller's cache, see
    M(confidential.kubernetes.container_images)) is verified again on the node - read as containerd's importer reads
    a tar (cleaned names, regular files only, anything the two could read differently refused naming the member),
    every blob hashes to its name, the manifest with its config and layers is present, index.json names the pinned
    digest and, in its annotations, no other name than the image's reference.
  - What is imported (C(ctr images import)) is a canonical archive written from the verified blobs, with an index.json
    of the module's own, under a staging name; the image's reference, its aliases and each of them by digest
    (C(repository@sha256:...)) are then moved to it, so that kubeadm and the kubelet find it locally and pull nothing.
  - The staging name must name the pinned digest before any name moves (a failed import leaves the names as they
    were), and every name must name it afterwards; a name that does not is removed, and the module fails naming the
    image and both digests.
  - An archive that fails verification is refused naming the image, and is not imported.
  - Needs only the Python standard library.
author:
  - confidential.kubernetes contributors (@confidential-kubernetes)
extends_documentation_fragment:
  - confidential.kubernetes._attributes
attributes:
  check_mode:
    support: full
    details:
      - Asks containerd, imports nothing; reports a change when an image is missing.
  diff_mode:
    support: none
  idempotent:
    support: full
options:
  images:
    description:
      - The images the node needs, each with C(name) (the row's name, for example C(pause)), C(reference)
        (C(registry.k8s.io/pause:3.10.2)), C(digest) (C(sha256:...), the pinned or locked manifest digest) and
        C(archive) (the OCI archive's path on the node), and optionally C(aliases), other names the image must also
        have (C(registry.example.com/k8s/pause:3.10.2), where kubeadm and containerd look with a site image
        repository); an image lacking one of them counts as missing.
    type: list
    elements: dict
    required: true
  architecture:
    description: The node's release architecture (C(amd64), C(arm64)), whose manifest an archive must hold; empty to not check.
    type: str
    default: ""
  namespace:
    description: containerd's namespace; the CRI plugin (the kubelet) uses C(k8s.io).
    type: str
    default: k8s.io
  address:
    description: containerd's socket.
    type: path
    default: /run/containerd/containerd.sock
  ctr_path:
    description: The C(ctr) binary; found on the PATH when empty.
    type: path
    default: ""
"""

EXAMPLES = r"""
- name: Import the row's images before kubeadm runs
  confidential.kubernetes.containerd_images:
    architecture: amd64
    images:
      - name: pause
        reference: registry.k8s.io/pause:3.10.2
        digest: sha256:0000000000000000000000000000000000000000000000000000000000000000
        archive: /var/cache/confidential-kubernetes/images/registry.k8s.io_pause_3.10.2.oci.tar
"""

RETURN = r"""
imported:
  description: The images this run imported (or would import, in check mode), by reference.
  returned: always
  type: list
  elements: str
  sample: [registry.k8s.io/pause:3.10.2]
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.confidential.kubernetes.plugins.module_utils._images.containerd import (
    ContainerdImageError,
    ContainerdImages,
    wanted_images,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            images=dict(type="list", elements="dict", required=True),
            architecture=dict(type="str", default=""),
            namespace=dict(type="str", default="k8s.io"),
            address=dict(type="path", default="/run/containerd/containerd.sock"),
            ctr_path=dict(type="path", default=""),
        ),
        supports_check_mode=True,
    )
    params = module.params
    ctr = params["ctr_path"] or module.get_bin_path("ctr", required=True)
    containerd = ContainerdImages(ctr, params["address"], module.run_command, namespace=params["namespace"])
    try:
        missing = containerd.missing(wanted_images(params["images"]))
        if not module.check_mode:
            containerd.import_missing(missing, params["architecture"])
    except ContainerdImageError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=bool(missing), imported=[image.reference for image in missing])


if __name__ == "__main__":
    main()
