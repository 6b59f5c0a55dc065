#!/usr/bin/python
# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: secrets_encryption
short_description: Read or rotate a control plane's encryption of Kubernetes Secrets at rest in etcd
version_added: 0.2.0
description:
  - The API servers encrypt Secrets in etcd with keys derived from the cluster's root secrets (HKDF-SHA256, info
    C(key-etcdSecrets), C(key-etcdSecrets-<n>) after n rotations; provider C(aescbc), then C(identity) for objects
    written before), from the C(EncryptionConfiguration) at O(path) (0600, in C(/etc/kubernetes), on the state disk).
    M(confidential.kubernetes.init_ticket) and M(confidential.kubernetes.join_ticket) write the first one; this
    module reads it and performs one step of a key rotation on one control plane (the
    C(confidential.kubernetes.rotate_secrets_key) playbook runs the steps on every control plane in order).
  - A step that writes a new file marks the kube-apiserver static pod's manifest with the file's SHA-256 (annotation
    C(confidential.kubernetes/encryption-config-sha256)); the kubelet then restarts the API server, which reads its
    configuration at start only. A manifest whose mark differs from the file is marked again, so a step cut short
    between the two restarts the API server on the next run.
  - No key is returned or logged; the keys are derived on the node from its own copy of the root secrets.
author:
  - confidential.kubernetes contributors (@confidential-kubernetes)
extends_documentation_fragment:
  - confidential.kubernetes._attributes
attributes:
  check_mode:
    support: full
    details:
      - In check mode nothing is written and no Secret is rewritten; the result says what would change.
  diff_mode:
    support: none
  idempotent:
    support: partial
    details:
      - Every step but V(rewrite) changes nothing where it is done. V(rewrite) rewrites every Secret each time.
requirements:
  - kubectl on the node for O(step=rewrite)
options:
  step:
    description:
      - V(read) reports the key generations of the file, whether the API server's manifest names it and the digest the
        API server was last restarted for; nothing is changed.
      - V(add) writes the keys C([old, new]) (every API server can then read Secrets written with the new key).
      - V(promote) writes C([new, old]) (new writes use the new key), once every control plane has done V(add).
      - V(rewrite) rewrites every Secret through the API (C(kubectl get secrets -A -o json | kubectl replace -f -)),
        once every control plane has done V(promote); run it on one control plane.
      - V(finish) writes C([new]) (the old key is gone), once the Secrets are rewritten.
      - V(enable) turns encryption at rest on for a control plane of a cluster from before it - the file with
        generation 0 (written where there is none), and the kube-apiserver static pod started with it (its
        C(--encryption-provider-config) flag, a read-only hostPath volume and mount, the restart mark). Secrets
        written before stay readable (the C(identity) provider) until V(rewrite) encrypts them.
      - V(kubeadm_config) adds the same flag and volume to the ClusterConfiguration of the C(kube-system/kubeadm-config)
        ConfigMap, which control planes that join and C(kubeadm upgrade) read (run it on one control plane, before
        V(enable)).
      - V(check) reads every Secret's stored value from etcd (C(etcdctl get /registry/secrets/ --prefix), as JSON;
        the values are never returned) and reports which key each is encrypted with (RV(stored)); it fails where one
        is stored in plaintext or, with O(new), with another key than generation O(new)'s.
      - A step already done on this host changes nothing; a host that is not where the step starts is refused.
    type: str
    choices: [read, add, promote, rewrite, finish, check, enable, kubeadm_config]
    default: read
  old:
    description: The generation the rotation starts from (required for V(add), V(promote), V(finish)).
    type: int
  new:
    description: The generation it rotates to.
    type: int
  path:
    description: The C(EncryptionConfiguration) file.
    type: path
    default: /etc/kubernetes/encryption-config.yaml
  secrets_file:
    description: The control plane's copy of the root secrets (its join service's), to derive the keys.
    type: path
    default: /etc/confidential-kubernetes/cluster-secrets.json
  api_server_manifest:
    description: The kube-apiserver static pod manifest.
    type: path
    default: /etc/kubernetes/manifests/kube-apiserver.yaml
  kubeconfig:
    description: The kubeconfig for O(step=rewrite) (cluster-admin).
    type: path
    default: /etc/kubernetes/admin.conf
  binary_path:
    description: kubectl, for O(step=rewrite).
    type: path
    default: kubectl
  etcdctl_path:
    description: etcdctl (v3 API), for O(step=check).
    type: path
    default: etcdctl
  endpoint:
    description: The etcd member O(step=check) reads.
    type: str
    default: https://127.0.0.1:2379
  cacert:
    description: The etcd CA certificate.
    type: path
    default: /etc/kubernetes/pki/etcd/ca.crt
  cert:
    description: The etcd client certificate.
    type: path
    default: /etc/kubernetes/pki/etcd/healthcheck-client.crt
  key:
    description: Its private key (a path).
    type: path
    default: /etc/kubernetes/pki/etcd/healthcheck-client.key
"""

EXAMPLES = r"""
- name: Read this control plane's Secrets key generations
  confidential.kubernetes.secrets_encryption:
  register: secrets_encryption

- name: Add the new key as the second one
  confidential.kubernetes.secrets_encryption:
    step: add
    old: 0
    new: 1
"""

RETURN = r"""
generations:
  description: The key generations of the file after the task (the first encrypts), none where there is no file.
  returned: success
  type: list
  elements: int
key_names:
  description: Their names in the file (C(key-etcdSecrets), C(key-etcdSecrets-<n>)).
  returned: success
  type: list
  elements: str
config_sha256:
  description: The SHA-256 of the file after the task.
  returned: when the file exists
  type: str
api_server_uses_config:
  description: Whether the kube-apiserver manifest passes C(--encryption-provider-config) with O(path).
  returned: when the manifest exists
  type: bool
running_sha256:
  description: The file digest the API server's manifest was last marked with (it runs with that file), if any.
  returned: when the manifest exists
  type: str
restarted:
  description: Whether the API server's manifest was marked now, so the kubelet restarts it.
  returned: success
  type: bool
rewritten:
  description: The number of Secrets rewritten (O(step=rewrite)).
  returned: when O(step=rewrite)
  type: int
stored:
  description: Per key name (or C(plaintext)), how many Secrets etcd holds encrypted with it (O(step=check)).
  returned: when O(step=check)
  type: dict
"""

import os
import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.confidential.kubernetes.plugins.module_utils._backup.etcd import EtcdError
from ansible_collections.confidential.kubernetes.plugins.module_utils._backup.etcd import Etcdctl
from ansible_collections.confidential.kubernetes.plugins.module_utils._backup.module import etcd_argument_spec
from ansible_collections.confidential.kubernetes.plugins.module_utils._crypto import derive
from ansible_collections.confidential.kubernetes.plugins.module_utils._join.config import ConfigError, load_root_secrets
from ansible_collections.confidential.kubernetes.plugins.module_utils._kubeadm import encryption

try:
    import cryptography  # noqa: F401 pylint: disable=unused-import
    import yaml  # noqa: F401 pylint: disable=unused-import
except ImportError:
    IMPORT_ERROR: str | None = traceback.format_exc()
else:
    IMPORT_ERROR = None


def etcdctl(params: dict) -> Etcdctl:
    return Etcdctl(
        binary=params["etcdctl_path"],
        endpoint=params["endpoint"],
        cacert=params["cacert"],
        cert=params["cert"],
        key=params["key"],
    )


def _describe(params: dict) -> dict:
    generations = encryption.read_generations(params["path"])
    result = {
        "generations": generations,
        "key_names": [derive.etcd_secrets_key_name(g) for g in generations or []],
    }
    if generations is not None:
        result["config_sha256"] = encryption.config_digest(params["path"])
    if os.path.exists(params["api_server_manifest"]):
        result["api_server_uses_config"] = encryption.uses_config(params["api_server_manifest"], params["path"])
        result["running_sha256"] = encryption.running_digest(params["api_server_manifest"])
    return result


def _enable(params: dict, check_mode: bool) -> dict:
    written = encryption.write_config(params["path"], load_root_secrets(params["secrets_file"]), [0], check_mode)
    if check_mode and written:
        return dict(_describe(params), changed=True, restarted=True, generations=[0], key_names=["key-etcdSecrets"])
    digest = encryption.config_digest(params["path"])
    manifest = params["api_server_manifest"]
    if encryption.uses_config(manifest, params["path"]):
        restarted = encryption.restart_api_server(manifest, digest, check_mode)
    else:
        restarted = encryption.enable_api_server(manifest, params["path"], digest, check_mode)
    return dict(_describe(params), changed=written or restarted, restarted=restarted)


def run(params: dict, check_mode: bool) -> dict:
    step = params["step"]
    if step == "read":
        return dict(_describe(params), changed=False, restarted=False)
    if step == "check":
        counts: dict = {}
        for name in encryption.stored_keys(etcdctl(params)).values():
            counts[name] = counts.get(name, 0) + 1
        wanted = derive.etcd_secrets_key_name(params["new"]) if params["new"] is not None else None
        wrong = {
            name: count
            for name, count in counts.items()
            if name == encryption.PLAINTEXT or (wanted is not None and name != wanted)
        }
        if wrong:
            raise encryption.EncryptionConfigError(
                f"etcd holds Secrets that are not encrypted with {wanted or 'a key'}: {wrong} (of {counts})"
            )
        return dict(_describe(params), changed=False, restarted=False, stored=counts)
    if step == "kubeadm_config":
        changed = encryption.KubeadmConfig(params["binary_path"], params["kubeconfig"]).enable(
            params["path"], check_mode
        )
        return dict(_describe(params), changed=changed, restarted=False)
    if step == "enable":
        return _enable(params, check_mode)
    if step == "rewrite":
        rewriter = encryption.SecretRewriter(params["binary_path"], params["kubeconfig"])
        rewritten = 0 if check_mode else rewriter.rewrite()
        return dict(_describe(params), changed=True, restarted=False, rewritten=rewritten)
    if params["old"] is None or params["new"] is None:
        raise encryption.EncryptionConfigError(f"step {step} needs the generations old and new")
    current = encryption.read_generations(params["path"])
    wanted = encryption.keys_after(step, current, params["old"], params["new"])
    before = _describe(params)
    if not before.get("api_server_uses_config", False):
        raise encryption.EncryptionConfigError(
            f"{params['api_server_manifest']} does not start kube-apiserver with --encryption-provider-config="
            f"{params['path']}: this control plane does not encrypt Secrets at rest, so there is no key to rotate"
        )
    written = False
    if wanted != current:
        written = encryption.write_config(params["path"], load_root_secrets(params["secrets_file"]), wanted, check_mode)
    # In check mode a file that would be written would also restart the API server.
    restarted = (check_mode and written) or encryption.restart_api_server(
        params["api_server_manifest"], encryption.config_digest(params["path"]), check_mode
    )
    after = before if check_mode else _describe(params)
    if check_mode:
        after = dict(after, generations=wanted, key_names=[derive.etcd_secrets_key_name(g) for g in wanted])
    return dict(after, changed=written or restarted, restarted=restarted)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            step=dict(
                type="str",
                default="read",
                choices=["read", "add", "promote", "rewrite", "finish", "check", "enable", "kubeadm_config"],
            ),
            old=dict(type="int"),
            new=dict(type="int"),
            path=dict(type="path", default=encryption.CONFIG_PATH),
            secrets_file=dict(type="path", default="/etc/confidential-kubernetes/cluster-secrets.json", no_log=False),
            api_server_manifest=dict(type="path", default="/etc/kubernetes/manifests/kube-apiserver.yaml"),
            kubeconfig=dict(type="path", default="/etc/kubernetes/admin.conf"),
            binary_path=dict(type="path", default="kubectl"),
            **{
                k: v
                for k, v in etcd_argument_spec().items()
                if k in ("etcdctl_path", "endpoint", "cacert", "cert", "key")
            },
        ),
        supports_check_mode=True,
    )
    if IMPORT_ERROR:
        module.fail_json(msg=missing_required_lib("cryptography and PyYAML"), exception=IMPORT_ERROR)
    try:
        result = run(module.params, module.check_mode)
    except (encryption.EncryptionConfigError, ConfigError, derive.DerivationError, EtcdError, OSError) as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
