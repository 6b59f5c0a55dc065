# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Kubernetes Secrets encrypted at rest in etcd: the API servers' EncryptionConfiguration (apiserver.config.k8s.io/v1).

Its keys are derived from the root secrets (DESIGN section 2, row ``key-etcdSecrets``; generation n after n rotations
is ``key-etcdSecrets-<n>``), so every control plane writes the same file from its own copy of the root secrets and no
key travels on its own. The file lives in ``/etc/kubernetes`` (on the state disk, ``_disk/placement.py``), 0600. The
provider is ``aescbc``: Kubernetes 1.20 has ``aescbc``, ``aesgcm`` (needs a key rotation every 2^32 writes, not
automatic here) and ``secretbox``; KMS v2 (1.29 on) is the way to a key outside the node and is not used yet. The
``identity`` provider comes last so that objects written before encryption was turned on stay readable until the
rotation rewrites them.

A rotation is a sequence of key lists, each written to every control plane and each API server restarted before
the next (``rotation_step``): ``[old]`` -> ``[old, new]`` (every API server can read the new key) -> ``[new, old]``
(new writes use it) -> every Secret rewritten -> ``[new]``. The files themselves say how far a rotation got.
"""

from __future__ import annotations

import base64
import json
import hashlib
import os
import re
import subprocess

from .._crypto import derive
from .._crypto.root_secrets import RootSecrets
from .._files import read_bounded, write_file_atomically, write_private_file

try:
    import yaml
except ImportError:  # reported by the modules through missing_required_lib()
    pass

CONFIG_PATH = "/etc/kubernetes/encryption-config.yaml"
API_VERSION = "apiserver.config.k8s.io/v1"
KIND = "EncryptionConfiguration"
PROVIDER = "aescbc"
# Only Secrets: they are what holds credentials (service-account tokens before 1.24, bootstrap tokens, TLS keys,
# Helm release state). ConfigMaps hold none here, and every other resource added costs each read a decryption.
RESOURCES = ("secrets",)
# The kube-apiserver flag, and the name of the volume that mounts the file into its static pod (kubeadm extraVolumes).
API_SERVER_FLAG = "encryption-provider-config"
VOLUME_NAME = "encryption-provider-config"
# Set in the kube-apiserver static pod's manifest to the file's SHA-256: a changed value restarts the pod (the
# kubelet runs a changed manifest anew) and tells that the API server runs with that file.
RESTART_ANNOTATION = "confidential.kubernetes/encryption-config-sha256"
MAX_CONFIG_BYTES = 64 * 1024
_KEY_NAME = re.compile(re.escape(derive.ETCD_SECRETS_INFO) + r"(?:-([1-9][0-9]{0,5}))?")


class EncryptionConfigError(ValueError):
    """An EncryptionConfiguration or a key list that is not one this collection writes; the message says what."""


def storage_prefix(generation: int) -> bytes:
    """What the API server writes before each value it encrypts with this generation's key (``etcdctl get`` shows it)."""
    return f"k8s:enc:{PROVIDER}:v1:{derive.etcd_secrets_key_name(generation)}:".encode()


def check_generations(generations: list) -> list[int]:
    """A key list as written: one or two distinct generations (two only during a rotation), the first writes."""
    if not isinstance(generations, (list, tuple)) or not 1 <= len(generations) <= 2:
        raise EncryptionConfigError(
            f"the Secrets encryption keys must be one generation, or two during a rotation, got {generations!r}"
        )
    for generation in generations:
        try:
            derive.etcd_secrets_key_name(generation)
        except derive.DerivationError as exc:
            raise EncryptionConfigError(str(exc)) from None
    if len(set(generations)) != len(generations):
        raise EncryptionConfigError(f"the Secrets encryption keys name one generation twice: {list(generations)}")
    return list(generations)


def render(secrets: RootSecrets, generations: list[int]) -> bytes:
    """The EncryptionConfiguration with the keys of ``generations`` (the first encrypts, every one decrypts)."""
    keys = [
        {
            "name": derive.etcd_secrets_key_name(generation),
            "secret": base64.b64encode(
                derive.etcd_secrets_key(secrets.master_key, secrets.master_salt, generation)
            ).decode(),
        }
        for generation in check_generations(generations)
    ]
    document = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "resources": [{"resources": list(RESOURCES), "providers": [{PROVIDER: {"keys": keys}}, {"identity": {}}]}],
    }
    return yaml.safe_dump(document, sort_keys=False).encode()


def generations_of(content: bytes, source: str) -> list[int]:
    """The key generations a file names, in its order; a file this collection did not write is refused."""
    try:
        document = yaml.safe_load(content)
        resources = document["resources"]
        if document.get("apiVersion") != API_VERSION or document.get("kind") != KIND or len(resources) != 1:
            raise ValueError("not one resources entry of an EncryptionConfiguration")
        if sorted(resources[0]["resources"]) != sorted(RESOURCES):
            raise ValueError(f"resources {resources[0]['resources']!r}, not {list(RESOURCES)}")
        providers = resources[0]["providers"]
        if len(providers) != 2 or list(providers[0]) != [PROVIDER] or providers[1] != {"identity": {}}:
            raise ValueError(f"providers other than {PROVIDER} then identity")
        names = [key["name"] for key in providers[0][PROVIDER]["keys"]]
    except (yaml.YAMLError, AttributeError, KeyError, IndexError, TypeError, ValueError) as exc:
        raise EncryptionConfigError(
            f"{source} is not the Secrets encryption configuration this collection writes ({exc}); nothing was changed"
        ) from None
    generations = []
    for name in names:
        match = _KEY_NAME.fullmatch(str(name))
        if not match:
            raise EncryptionConfigError(f"{source} names a key {name!r} that is not {derive.ETCD_SECRETS_INFO}[-<n>]")
        generations.append(int(match.group(1) or 0))
    return check_generations(generations)


def read_generations(path: str) -> list[int] | None:
    """The generations of the file at ``path``, None where there is none."""
    try:
        content = read_bounded(path, MAX_CONFIG_BYTES)
    except FileNotFoundError:
        return None
    return generations_of(content, path)


def write_config(path: str, secrets: RootSecrets, generations: list[int], check_mode: bool = False) -> bool:
    """Write the configuration (0600, atomically) unless the file already holds it; whether it changed.

    Whatever the file held is replaced: before kubeadm init or join, a file left by an earlier cluster on this node
    (its keys derived from another master key) must not survive into this one."""
    wanted = render(secrets, generations)
    try:
        same = read_bounded(path, MAX_CONFIG_BYTES) == wanted and os.stat(path).st_mode & 0o777 == 0o600
    except FileNotFoundError:
        same = False
    if same:
        return False
    if not check_mode:
        # /etc/kubernetes as kubeadm makes it (0755); on a control plane it is already placed on the state disk.
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        write_private_file(path, wanted)
    return True


def config_digest(path: str) -> str:
    return hashlib.sha256(read_bounded(path, MAX_CONFIG_BYTES)).hexdigest()


def _load_manifest(path: str) -> dict:
    try:
        manifest = yaml.safe_load(read_bounded(path, 1024 * 1024))
    except FileNotFoundError:
        raise EncryptionConfigError(f"{path} does not exist: this node runs no kube-apiserver static pod") from None
    except yaml.YAMLError as exc:
        raise EncryptionConfigError(f"{path} is not YAML: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("kind") != "Pod":
        raise EncryptionConfigError(f"{path} is not a static pod manifest")
    return manifest


def running_digest(manifest_path: str) -> str | None:
    """The configuration digest the API server's static pod was last restarted for (None: never by this collection)."""
    return ((_load_manifest(manifest_path).get("metadata") or {}).get("annotations") or {}).get(RESTART_ANNOTATION)


def uses_config(manifest_path: str, config_path: str) -> bool:
    """Whether the kube-apiserver of this manifest is started with ``--encryption-provider-config=<config_path>``."""
    containers = (_load_manifest(manifest_path).get("spec") or {}).get("containers") or []
    wanted = f"--{API_SERVER_FLAG}={config_path}"
    return any(wanted in (container.get("command") or []) for container in containers)


def restart_api_server(manifest_path: str, digest: str, check_mode: bool = False) -> bool:
    """Mark the kube-apiserver manifest with ``digest`` (the kubelet then restarts the pod); whether it changed."""
    manifest = _load_manifest(manifest_path)
    metadata = manifest.setdefault("metadata", {})
    annotations = metadata.get("annotations") or {}
    if annotations.get(RESTART_ANNOTATION) == digest:
        return False
    if not check_mode:
        metadata["annotations"] = dict(annotations, **{RESTART_ANNOTATION: digest})
        mode = os.stat(manifest_path).st_mode & 0o777
        write_file_atomically(manifest_path, yaml.safe_dump(manifest, sort_keys=False).encode(), mode)
    return True


# The steps of a rotation from generation ``old`` to ``new``, in order; each is done on every control plane (and each
# API server restarted) before the next starts.
ROTATION_STEPS = ("add", "promote", "rewrite", "finish")


def rotation_plan(current: dict) -> dict:
    """From every control plane's key generations (host -> list, None where it has no file), the rotation to run.

    A rotation that was cut short is resumed (its two generations are on the hosts), else a new one starts: ``new`` is
    the next generation. ``problems`` says why none may run (then nothing may change)."""
    problems = [
        f"{host} has no Secrets encryption configuration ({CONFIG_PATH}): enable it first (docs/secrets-encryption.md)"
        for host, generations in sorted(current.items())
        if not generations
    ]
    if not current:
        problems.append("no control plane to rotate the Secrets key on")
    named = sorted({generation for generations in current.values() if generations for generation in generations})
    if len(named) > 2:
        problems.append(f"the control planes name more than two Secrets key generations between them: {named}")
    if problems:
        return {"problems": problems, "old": None, "new": None, "resumed": False}
    if len(named) == 1:
        return {"problems": [], "old": named[0], "new": named[0] + 1, "resumed": False}
    return {"problems": [], "old": named[0], "new": named[1], "resumed": True}


def keys_after(step: str, current: list[int] | None, old: int, new: int) -> list[int]:
    """The key list a control plane holding ``current`` gets in ``step`` of the rotation from ``old`` to ``new``.

    Where the step is done already, ``current``; a host that is not where the step can start is refused."""
    if old == new:
        raise EncryptionConfigError(f"a rotation needs two generations, got old = new = {old}")
    held = list(current or [])
    if step == "add":
        if new in held:
            return held
        if held != [old]:
            raise EncryptionConfigError(f"adding key generation {new} needs the keys [{old}], this host has {held}")
        return [old, new]
    if step == "promote":
        if held[:1] == [new]:
            return held
        if held != [old, new]:
            raise EncryptionConfigError(
                f"promoting key generation {new} needs the keys [{old}, {new}], this host has {held}"
            )
        return [new, old]
    if step == "finish":
        if held[:1] != [new]:
            raise EncryptionConfigError(
                f"removing key generation {old} needs generation {new} first on this host, it has {held}: "
                "run the promote and rewrite steps first"
            )
        return [new]
    raise EncryptionConfigError(f"unknown rotation step {step!r}: one of add, promote, finish")


class SecretRewriter:
    """Rewrites every Secret through the API, so that each is stored again with the API server's first key.

    ``kubectl get secrets -A -o json | kubectl replace -f -``: the values travel between the two kubectl on stdin and
    stdout only, never argv, never a file. Tests replace ``_run_command``."""

    def __init__(self, kubectl: str = "kubectl", kubeconfig: str = "/etc/kubernetes/admin.conf"):
        self.kubectl, self.kubeconfig = kubectl, kubeconfig

    def _run_command(self, argv: list[str], stdin: bytes | None = None) -> tuple[int, bytes, bytes]:
        try:
            done = subprocess.run(argv, input=stdin, capture_output=True, check=False, timeout=600)
        except FileNotFoundError:
            raise EncryptionConfigError(f"{argv[0]} is not installed on this node") from None
        except subprocess.TimeoutExpired:
            raise EncryptionConfigError(f"{' '.join(argv[:3])} did not finish within 10 minutes") from None
        return done.returncode, done.stdout, done.stderr

    def rewrite(self) -> int:
        """The number of Secrets rewritten. A Secret changed between read and write fails the run (run it again)."""
        base = [self.kubectl, f"--kubeconfig={self.kubeconfig}"]
        rc, out, err = self._run_command([*base, "get", "secrets", "--all-namespaces", "--output=json"])
        if rc != 0:
            raise EncryptionConfigError(
                f"reading the Secrets failed (exit {rc}): {err.decode(errors='replace')[-500:]}"
            )
        try:
            count = len(json.loads(out)["items"])
        except (ValueError, KeyError, TypeError):
            raise EncryptionConfigError("kubectl get secrets did not answer a JSON list") from None
        if count == 0:
            return 0
        rc, dummy, err = self._run_command([*base, "replace", "--filename=-", "--output=name"], stdin=out)
        if rc != 0:
            # kubectl's errors name Secrets and reasons (a conflict: one changed meanwhile), never their data.
            raise EncryptionConfigError(
                f"rewriting the Secrets failed (exit {rc}), run the rotation again: {err.decode(errors='replace')[-500:]}"
            )
        return count


SECRETS_PREFIX = "/registry/secrets/"
PLAINTEXT = "plaintext"


def stored_keys(etcdctl) -> dict[str, str]:
    """How etcd holds each Secret: its etcd key -> the name of the key it is encrypted with, or ``plaintext``.

    ``etcdctl`` is a ``_backup.etcd.Etcdctl``; the values are read as JSON (base64) and never returned."""
    out = etcdctl._run(
        [*etcdctl._client_args(), "get", SECRETS_PREFIX, "--prefix", "--write-out=json"], "reading the Secrets in etcd"
    )
    try:
        kvs = json.loads(out).get("kvs") or []
        stored = {base64.b64decode(kv["key"]).decode(): base64.b64decode(kv["value"]) for kv in kvs}
    except (ValueError, KeyError, TypeError, AttributeError):
        raise EncryptionConfigError("etcdctl get did not answer the JSON it writes") from None
    result = {}
    for key, value in stored.items():
        match = re.match(rb"k8s:enc:" + re.escape(PROVIDER.encode()) + rb":v1:([^:]+):", value)
        result[key] = match.group(1).decode() if match else PLAINTEXT
    return result


def secrets_key_plan(readings: dict) -> dict:
    """The plan over every control plane's reading (host -> the ``secrets_encryption`` read result).

    A cluster whose API servers do not all use the file yet, and whose files name at most generation 0, is a cluster
    from before encryption at rest (or one whose turning on was cut short): ``enable`` turns it on with generation 0.
    Otherwise the rotation of ``rotation_plan``, refused where an API server is not started with the file."""
    generations = {host: (reading or {}).get("generations") for host, reading in readings.items()}
    uses = {host: bool((reading or {}).get("api_server_uses_config")) for host, reading in readings.items()}
    if readings and not all(uses.values()) and all(g in (None, [0]) for g in generations.values()):
        resumed = any(uses.values()) or any(generations.values())
        return {"problems": [], "enable": True, "old": None, "new": 0, "resumed": resumed}
    plan = rotation_plan(generations)
    unused = [
        f"{host}: kube-apiserver is not started with --{API_SERVER_FLAG}={CONFIG_PATH}"
        for host in sorted(readings)
        if generations[host] and not uses[host]
    ]
    return dict(plan, problems=plan["problems"] + unused, enable=False)


def enable_api_server(manifest_path: str, config_path: str, digest: str, check_mode: bool = False) -> bool:
    """Start the kube-apiserver static pod with the file: its flag, a read-only hostPath volume and mount (as kubeadm's
    extraVolumes make them), and the restart mark; whether the manifest changed (the kubelet then restarts it)."""
    manifest = _load_manifest(manifest_path)
    spec = manifest.setdefault("spec", {})
    containers = [c for c in spec.get("containers") or [] if c.get("name") == "kube-apiserver"]
    if len(containers) != 1:
        raise EncryptionConfigError(f"{manifest_path} has no container named kube-apiserver")
    container = containers[0]
    flag = f"--{API_SERVER_FLAG}={config_path}"
    before = yaml.safe_dump(manifest, sort_keys=False)
    command = [arg for arg in container.get("command") or [] if not str(arg).startswith(f"--{API_SERVER_FLAG}=")]
    container["command"] = command + [flag]
    mounts = [m for m in container.get("volumeMounts") or [] if m.get("name") != VOLUME_NAME]
    container["volumeMounts"] = mounts + [{"name": VOLUME_NAME, "mountPath": config_path, "readOnly": True}]
    volumes = [v for v in spec.get("volumes") or [] if v.get("name") != VOLUME_NAME]
    spec["volumes"] = volumes + [{"name": VOLUME_NAME, "hostPath": {"path": config_path, "type": "File"}}]
    metadata = manifest.setdefault("metadata", {})
    metadata["annotations"] = dict(metadata.get("annotations") or {}, **{RESTART_ANNOTATION: digest})
    after = yaml.safe_dump(manifest, sort_keys=False)
    if after == before:
        return False
    if not check_mode:
        mode = os.stat(manifest_path).st_mode & 0o777
        write_file_atomically(manifest_path, after.encode(), mode)
    return True


def enable_in_cluster_configuration(document: str, config_path: str) -> str | None:
    """kubeadm's ClusterConfiguration (the ``kubeadm-config`` ConfigMap's, which joins and upgrades read) with the
    API server's flag and volume for the file; None where it has both already."""
    try:
        cluster = yaml.safe_load(document)
        api_version = str(cluster["apiVersion"])
    except (yaml.YAMLError, KeyError, TypeError) as exc:
        raise EncryptionConfigError(
            f"kubeadm's ClusterConfiguration cannot be read ({exc}); nothing was changed"
        ) from None
    api_server = cluster.setdefault("apiServer", {}) or {}
    cluster["apiServer"] = api_server
    args = api_server.get("extraArgs") or ([] if api_version.endswith("v1beta4") else {})
    if isinstance(args, list):
        args = [a for a in args if a.get("name") != API_SERVER_FLAG] + [{"name": API_SERVER_FLAG, "value": config_path}]
    else:
        args = dict(args, **{API_SERVER_FLAG: config_path})
    volumes = [v for v in api_server.get("extraVolumes") or [] if v.get("name") != VOLUME_NAME]
    volumes.append(
        {"name": VOLUME_NAME, "hostPath": config_path, "mountPath": config_path, "readOnly": True, "pathType": "File"}
    )
    if api_server.get("extraArgs") == args and api_server.get("extraVolumes") == volumes:
        return None
    api_server["extraArgs"], api_server["extraVolumes"] = args, volumes
    return yaml.safe_dump(cluster, sort_keys=False)


class KubeadmConfig(SecretRewriter):
    """The ``kube-system/kubeadm-config`` ConfigMap through kubectl (replaced with its resourceVersion: a concurrent
    change fails the write)."""

    def enable(self, config_path: str, check_mode: bool = False) -> bool:
        base = [self.kubectl, f"--kubeconfig={self.kubeconfig}", "--namespace=kube-system"]
        rc, out, err = self._run_command([*base, "get", "configmap", "kubeadm-config", "--output=json"])
        if rc != 0:
            raise EncryptionConfigError(
                f"reading kubeadm-config failed (exit {rc}): {err.decode(errors='replace')[-500:]}"
            )
        try:
            config_map = json.loads(out)
            document = config_map["data"]["ClusterConfiguration"]
        except (ValueError, KeyError, TypeError):
            raise EncryptionConfigError("kubeadm-config has no ClusterConfiguration") from None
        changed = enable_in_cluster_configuration(document, config_path)
        if changed is None:
            return False
        if not check_mode:
            config_map["data"]["ClusterConfiguration"] = changed
            rc, dummy, err = self._run_command(
                [*base, "replace", "--filename=-"], stdin=json.dumps(config_map).encode()
            )
            if rc != 0:
                raise EncryptionConfigError(
                    f"writing kubeadm-config failed (exit {rc}), run again: {err.decode(errors='replace')[-500:]}"
                )
        return True
