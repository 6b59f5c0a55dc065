"""What a VM node's real kubelet needs from the lab until the node role installs it (issue 28): a small, replaceable
step that `lab up` runs on each VM once it answers SSH.

- containerd: the image's Debian 1.6 (the lab's row has no containerd), configured with the collection's own template
  (roles/node/templates/containerd-config.toml.j2, its containerd 1.x form: systemd cgroups, the row's pause image),
  runc at Debian's path;
- the pod network: Debian's CNI plugins (bridge, host-local, loopback, portmap) copied where containerd looks
  (/opt/cni/bin) and a bridge conflist over a per-VM /24 (no CNI runs on the VM yet);
- the pause image, which cannot be pulled here: built from the Kubernetes source's pause.c (gcc -static), packed by hand
  as an OCI archive and imported with `ctr -n k8s.io images import` (REAL-NODE.md). The real image path is on the
  `images` branch; this goes when it lands.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shlex
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

import jinja2

from . import LabError
from .host import run
from .paths import LabPaths
from .plan import NodeSpec

CONTAINERD_VERSION = "1.6.20"
RUNC_DIR = "/usr/sbin"
DEBIAN_CNI_DIR = "/usr/lib/cni"
CNI_BIN_DIR = "/opt/cni/bin"
CNI_PLUGINS = ("bridge", "host-local", "loopback", "portmap")
CNI_CONFLIST = "/etc/cni/net.d/10-cklab-bridge.conflist"
PAUSE_SOURCE = "build/pause/linux/pause.c"
# The lab's tools image (tools_archive): the CNI stand-in chart's agent image (tests/doubles/cilium-chart/values.yaml)
# and the image of the VM tests' pods.
TOOLS_IMAGE = "cklab.invalid/lab-tools:1"
# The node lock's record (the collection's node_lock): present once the node has joined.
NODE_LOCK_RECORD = "/var/lib/confidential-kubernetes/nodelock.json"
TOOLS_APPLETS = ("sh", "sleep", "cat", "echo", "hostname", "ls", "ps", "env", "id", "wget", "nslookup")
_TEMPLATE = Path(__file__).resolve().parents[3] / "roles" / "node" / "templates" / "containerd-config.toml.j2"


def containerd_config(kubernetes_version: str, pause_image: str) -> str:
    """The collection's containerd configuration for containerd 1.x, as the node role would render it."""
    template = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True).from_string(
        _TEMPLATE.read_text()
    )
    return template.render(
        ansible_managed="Written by tests/lab/lab up (cklab/vmruntime.py) from the node role's template",
        __node_stack={
            "artifacts": {"containerd": {"version": CONTAINERD_VERSION}},
            "version": kubernetes_version,
            "images": {"pause": pause_image},
        },
        __node_stack_containerd_major=int(CONTAINERD_VERSION.split(".", maxsplit=1)[0]),
        node_stack_bin_dir=RUNC_DIR,
        # The role's own pause image (its kubernetes_image_repository unset) and no registry mirror: the VMs pull nothing.
        __node_stack_pause_image=pause_image,
        node_containerd_registry_mirrors={},
    )


def pod_subnet(node: NodeSpec) -> str:
    """A /24 of the cluster's pod network (10.244.0.0/16) per VM, by its address: 10.244.<last byte>.0/24."""
    return f"10.244.{node.address.rsplit('.', 1)[1]}.0/24"


def cni_conflist(node: NodeSpec) -> str:
    return (
        json.dumps(
            {
                "cniVersion": "0.4.0",
                "name": "cklab",
                "plugins": [
                    {
                        "type": "bridge",
                        "bridge": "cni0",
                        "isGateway": True,
                        "ipMasq": True,
                        "ipam": {"type": "host-local", "ranges": [[{"subnet": pod_subnet(node)}]]},
                    },
                    {"type": "portmap", "capabilities": {"portMappings": True}},
                ],
            },
            indent=2,
        )
        + "\n"
    )


def _tar_bytes(files: dict[str, tuple[bytes, int] | str]) -> bytes:
    """A tar of these files (name -> (content, mode), or name -> a symbolic link's target), reproducible: fixed owners
    and times."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name, entry in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.mtime = 0
            if isinstance(entry, str):
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, entry, 0o777
                archive.addfile(info)
                continue
            content, mode = entry
            info.size, info.mode = len(content), mode
            archive.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def oci_archive(image_name: str, entrypoint: str, files: dict[str, tuple[bytes, int] | str]) -> bytes:
    """An OCI image layout archive of one layer holding `files`, named `image_name` for containerd's import."""
    layer = _tar_bytes(files)
    layer_gz = gzip.compress(layer, mtime=0)
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": [entrypoint]},
            "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]},
        }
    ).encode()
    blobs = {
        config: "application/vnd.oci.image.config.v1+json",
        layer_gz: "application/vnd.oci.image.layer.v1.tar+gzip",
    }

    def descriptor(blob: bytes) -> dict:
        return {"mediaType": blobs[blob], "digest": "sha256:" + hashlib.sha256(blob).hexdigest(), "size": len(blob)}

    manifest = json.dumps({"schemaVersion": 2, "config": descriptor(config), "layers": [descriptor(layer_gz)]}).encode()
    index = json.dumps(
        {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": "sha256:" + hashlib.sha256(manifest).hexdigest(),
                    "size": len(manifest),
                    "annotations": {"io.containerd.image.name": image_name},
                }
            ],
        }
    ).encode()
    entries = {"oci-layout": (b'{"imageLayoutVersion": "1.0.0"}', 0o644), "index.json": (index, 0o644)}
    for blob in (config, layer_gz, manifest):
        entries["blobs/sha256/" + hashlib.sha256(blob).hexdigest()] = (blob, 0o644)
    return _tar_bytes(entries)


def _image_archive(paths: LabPaths, name: str, build: Callable[[Path], bytes]) -> Path:
    """The lab dir's OCI archive `vm-images/<name>.oci.tar`, made once by `build` (given a scratch directory beside it)
    and written whole (a partial file renamed into place)."""
    archive = paths.lab_dir / "vm-images" / f"{name}.oci.tar"
    if archive.is_file():
        return archive
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=archive.parent) as work:
        content = build(Path(work))
    temporary = archive.with_suffix(".part")
    temporary.write_bytes(content)
    temporary.replace(archive)
    return archive


def pause_archive(paths: LabPaths, source_dir: Path, image_name: str) -> Path:
    """The pause image's OCI archive, built once per lab dir from the Kubernetes source's pause.c."""
    source = source_dir / PAUSE_SOURCE

    def build(work: Path) -> bytes:
        if not source.is_file():
            raise LabError(f"the pause image's source {source} is missing (tests/lab/lab kubernetes unpacks it)")
        run(["gcc", "-Os", "-static", "-o", work / "pause", source], what="gcc of the pause image")
        return oci_archive(image_name, "/pause", {"pause": ((work / "pause").read_bytes(), 0o755)})

    return _image_archive(paths, "pause", build)


def tools_files(busybox: bytes) -> dict[str, tuple[bytes, int] | str]:
    """The lab's tools image: Debian's static busybox with its applets as links, and the CNI stand-in chart's agent
    (`cilium-agent`: prints its arguments and sleeps), so that a pod on a VM runs, logs and takes `kubectl exec`."""
    files: dict[str, tuple[bytes, int] | str] = {"bin/busybox": (busybox, 0o755)}
    files.update({f"bin/{applet}": "busybox" for applet in TOOLS_APPLETS})
    files["bin/cilium-agent"] = (
        b'#!/bin/sh\necho "cilium-agent (the lab\'s stand-in) on $(hostname): $*"\nexec sleep 2147483647\n',
        0o755,
    )
    files["tmp/.keep"] = (b"", 0o644)
    return files


def tools_archive(paths: LabPaths) -> Path:
    """The tools image's OCI archive (TOOLS_IMAGE), built once per lab dir from Debian's busybox-static package,
    downloaded with apt (not installed on the host: it would conflict with a busybox there)."""

    def build(work: Path) -> bytes:
        run(["apt-get", "download", "busybox-static"], what="apt-get download busybox-static", cwd=work)
        (deb,) = work.glob("busybox-static_*.deb")
        run(["dpkg-deb", "-x", deb, work / "root"], what="dpkg-deb -x of busybox-static")
        return oci_archive(TOOLS_IMAGE, "/bin/sh", tools_files((work / "root" / "bin" / "busybox").read_bytes()))

    return _image_archive(paths, "tools", build)


def images_bundle(archives: list[Path]) -> bytes:
    """The OCI archives as one tar, which `install` sends to each VM on its standard input."""
    return _tar_bytes({path.name: (path.read_bytes(), 0o644) for path in archives})


def install(ssh: list[str], node: NodeSpec, kubernetes_version: str, pause_image: str, bundle: bytes) -> bool:
    """Configure containerd, the CNI and import the images (`images_bundle`) on a booted VM (idempotent); `ssh` is the
    command prefix. A VM that has joined a cluster is left alone; returns whether anything was done."""
    script = "\n".join(
        [
            "set -eu",
            # A node that has joined keeps its images and containerd's state on its state disk, which only the boot
            # agent maps (containerd waits for it): nothing to do, and containerd may not run (a tampered boot).
            f"if [ -e {NODE_LOCK_RECORD} ]; then cat >/dev/null; echo joined; exit 0; fi",
            "rm -rf /run/cklab-images; mkdir /run/cklab-images",
            "tar -x -C /run/cklab-images",
            f"mkdir -p /etc/containerd {CNI_BIN_DIR} {Path(CNI_CONFLIST).parent}",
            *(f"cp -p {DEBIAN_CNI_DIR}/{name} {CNI_BIN_DIR}/{name}" for name in CNI_PLUGINS),
            f"cat > {CNI_CONFLIST} <<'CKLAB_EOF'\n{cni_conflist(node)}CKLAB_EOF",
            f"cat > /etc/containerd/config.toml.new <<'CKLAB_EOF'\n"
            f"{containerd_config(kubernetes_version, pause_image)}CKLAB_EOF",
            "if ! cmp -s /etc/containerd/config.toml.new /etc/containerd/config.toml; then"
            " mv /etc/containerd/config.toml.new /etc/containerd/config.toml; systemctl restart containerd;"
            " else rm /etc/containerd/config.toml.new; fi",
            "for i in $(seq 60); do ctr version >/dev/null 2>&1 && break; sleep 1; done",
            'for image in /run/cklab-images/*.oci.tar; do ctr -n k8s.io images import "$image" >/dev/null; done',
            "rm -rf /run/cklab-images",
        ]
    )
    remote = ["sh", "-c", shlex.quote(script)]
    done = subprocess.run([*ssh, *remote], input=bundle, capture_output=True, timeout=600, check=False)
    if done.returncode != 0:
        raise LabError(f"{node.name}: the lab's runtime step failed: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout.decode().strip() != "joined"
