"""What a VM node's real kubelet needs from the lab beyond what the node role installs: a small step that `lab up`
runs on each VM once it answers SSH, and the images the role imports.

- the pod network's configuration: a bridge conflist over a per-VM /24 (no CNI runs on the VM; the role installs the
  row's CNI plugins, cklab/runtime.py);
- the images the VM's pods run, which cannot be pulled here, as OCI archives in the lab's images directory
  (`images_dir`, laid out as the node role's node_kubernetes_images_dir wants them): the pause image, built from the
  Kubernetes source's pause.c (gcc -static), kube-proxy's, the lab's kube-proxy build with Debian's iptables and
  conntrack, and the lab's tools image (busybox). The node role fetches them from there, records their digests in the
  lab's lock file, pushes and imports them like any site's images.
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

from . import LabError
from .host import run
from .paths import LabPaths
from .plan import NodeSpec

CNI_CONFLIST = "/etc/cni/net.d/10-cklab-bridge.conflist"
PAUSE_SOURCE = "build/pause/linux/pause.c"
# The lab's tools image (tools_archive): the CNI stand-in chart's agent image (the lab's row names it, cklab/cni.py)
# and the image of the VM tests' pods. Its tag changes with its content: the lab's lock file pins the digest per tag.
TOOLS_IMAGE = "cklab.invalid/lab-tools:2"
# The node lock's record (the collection's node_lock): present once the node has joined.
NODE_LOCK_RECORD = "/var/lib/confidential-kubernetes/nodelock.json"
# kube-proxy's image (kube_proxy_archive): Debian 12's iptables (nf_tables commands, its libraries and xtables
# modules), conntrack (which kube-proxy runs to clear UDP flows) and the C library they link.
KUBE_PROXY_PACKAGES = (
    "iptables",
    "libip4tc2",
    "libip6tc2",
    "libxtables12",
    "libnftnl11",
    "libmnl0",
    "libnetfilter-conntrack3",
    "libnfnetlink0",
    "conntrack",
    "libnetfilter-cthelper0",
    "libnetfilter-queue1",
    "libc6",
)
KUBE_PROXY_XTABLES_COMMANDS = tuple(
    f"{family}{suffix}" for family in ("iptables", "ip6tables") for suffix in ("", "-save", "-restore")
)
TOOLS_APPLETS = ("sh", "sleep", "cat", "echo", "hostname", "ls", "ps", "env", "id", "wget", "nslookup")


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


def images_dir(lab_dir: Path) -> Path:
    """The lab's images as a site's directory of OCI archives: images/<repository>/<tag>.oci.tar."""
    return lab_dir / "images-site"


def _image_archive(paths: LabPaths, reference: str, build: Callable[[Path], bytes]) -> Path:
    """The archive of `reference` in the lab's images directory, made once by `build` (given a scratch directory
    beside it) and written whole (a partial file renamed into place)."""
    repository, tag = reference.rsplit(":", 1)
    archive = images_dir(paths.lab_dir) / "images" / repository / f"{tag}.oci.tar"
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

    return _image_archive(paths, image_name, build)


def tools_files(busybox: bytes) -> dict[str, tuple[bytes, int] | str]:
    """The lab's tools image: Debian's static busybox with its applets as links, and the CNI stand-in chart's agent
    (`cilium-agent`: prints its arguments and sleeps), so that a pod on a VM runs, logs and takes `kubectl exec`."""
    files: dict[str, tuple[bytes, int] | str] = {"bin/busybox": (busybox, 0o755)}
    files.update({f"bin/{applet}": "busybox" for applet in TOOLS_APPLETS})
    files["bin/cilium-agent"] = (
        b"#!/bin/sh\n# PID 1 of its container: TERM must end it (a stopped pod or node waits for it otherwise).\n"
        b"trap 'exit 0' TERM\n"
        b'echo "cilium-agent (the lab\'s stand-in) on $(hostname): $*"\nsleep 2147483647 &\nwait\n',
        0o755,
    )
    files["tmp/.keep"] = (b"", 0o644)
    return files


def _unpacked_packages(work: Path, packages: tuple[str, ...]) -> Path:
    """Debian's `packages`, downloaded with apt into `work` (not installed on the host, where they could conflict with
    its own) and unpacked into work/root, which is returned."""
    run(["apt-get", "download", *packages], what=f"apt-get download {' '.join(packages)}", cwd=work)
    for deb in sorted(work.glob("*.deb")):
        run(["dpkg-deb", "-x", deb, work / "root"], what=f"dpkg-deb -x of {deb.name}")
    return work / "root"


def tools_archive(paths: LabPaths) -> Path:
    """The tools image's OCI archive (TOOLS_IMAGE), built once per lab dir from Debian's busybox-static package,
    downloaded with apt (not installed on the host: it would conflict with a busybox there)."""

    def build(work: Path) -> bytes:
        busybox = (_unpacked_packages(work, ("busybox-static",)) / "bin" / "busybox").read_bytes()
        return oci_archive(TOOLS_IMAGE, "/bin/sh", tools_files(busybox))

    return _image_archive(paths, TOOLS_IMAGE, build)


def tree_files(root: Path) -> dict[str, tuple[bytes, int] | str]:
    """The files and symbolic links under `root` (an unpacked package), by path relative to it."""
    files: dict[str, tuple[bytes, int] | str] = {}
    for path in sorted(root.rglob("*")):
        name = path.relative_to(root).as_posix()
        if path.is_symlink():
            files[name] = str(path.readlink())
        elif path.is_file():
            files[name] = (path.read_bytes(), path.stat().st_mode & 0o777)
    return files


def kube_proxy_files(binary: bytes, packages_root: Path) -> dict[str, tuple[bytes, int] | str]:
    """kube-proxy's image: the lab's kube-proxy and Debian's iptables (with the libraries and xtables modules it loads)
    and conntrack, unpacked from their packages. The iptables commands are the nf_tables ones, as on a Debian 12 host
    (update-alternatives makes those links on a host; an image has none)."""
    files = {
        name: entry
        for name, entry in tree_files(packages_root).items()
        if name.startswith(("usr/sbin/", "usr/lib/", "lib/", "lib64/", "etc/")) and "/share/" not in name
    }
    files["usr/local/bin/kube-proxy"] = (binary, 0o755)
    for command in KUBE_PROXY_XTABLES_COMMANDS:
        files[f"usr/sbin/{command}"] = "xtables-nft-multi"
    files["run/.keep"] = (b"", 0o644)
    return files


def kube_proxy_archive(paths: LabPaths, binary: Path, image_name: str) -> Path:
    """kube-proxy's OCI archive (the row's kube-proxy image name), built once per lab dir from the lab's kube-proxy
    build and Debian's packages (KUBE_PROXY_PACKAGES, downloaded with apt, not installed on the host)."""

    def build(work: Path) -> bytes:
        if not binary.is_file():
            raise LabError(f"kube-proxy {binary} is missing (tests/lab/lab kubernetes builds it)")
        root = _unpacked_packages(work, KUBE_PROXY_PACKAGES)
        return oci_archive(image_name, "/usr/local/bin/kube-proxy", kube_proxy_files(binary.read_bytes(), root))

    return _image_archive(paths, image_name, build)


def install(ssh: list[str], node: NodeSpec) -> bool:
    """Write the CNI conflist on a booted VM (idempotent); `ssh` is the command prefix. A VM that has joined a cluster
    is left alone; returns whether anything was done."""
    script = "\n".join(
        [
            "set -eu",
            # A node that has joined keeps its configuration; its state disk is mapped by the boot agent only.
            f"if [ -e {NODE_LOCK_RECORD} ]; then echo joined; exit 0; fi",
            f"mkdir -p {Path(CNI_CONFLIST).parent}",
            f"cat > {CNI_CONFLIST} <<'CKLAB_EOF'\n{cni_conflist(node)}CKLAB_EOF",
        ]
    )
    done = subprocess.run([*ssh, "sh", "-c", shlex.quote(script)], capture_output=True, timeout=120, check=False)
    if done.returncode != 0:
        raise LabError(f"{node.name}: the lab's runtime step failed: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout.decode().strip() != "joined"
