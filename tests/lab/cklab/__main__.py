"""Command line of the lab: `lab up|down|stop|start|reboot|status|ssh|kubernetes|guest`."""

from __future__ import annotations

import argparse
import sys

from . import LabError, guest, kubernetes, lab
from .paths import LabPaths


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="lab", description="Kubernetes lab nodes (systemd-nspawn + swtpm) on this machine."
    )
    commands = top.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="boot the lab nodes (reusing running ones) and write the inventory")
    up.add_argument("--control-planes", type=int, default=1, metavar="N")
    up.add_argument("--workers", type=int, default=2, metavar="M")
    up.add_argument(
        "--vm-workers",
        type=int,
        default=0,
        metavar="V",
        help="QEMU workers vm-0.. beside the nspawn nodes (guest image built once; minutes to boot under TCG)",
    )
    up.add_argument(
        "--tamper",
        nargs="+",
        default=[],
        metavar="NODE",
        help="boot these nodes with a different kernel command line (PCR 8; a VM's real one, PCR 9)",
    )
    commands.add_parser(
        "down", help="stop every node and remove bridge, veths, node state and the cluster's secrets/ and backups/"
    )
    for name, what in (
        ("stop", "power nodes off, keeping their disks and TPM state (all nodes when none is named)"),
        ("start", "power stopped nodes on: swtpm restarted (PCRs reset), boot measured (all for none)"),
        ("reboot", "power nodes off and on: swtpm restarted, so PCRs (15 too) reset (all for none)"),
    ):
        power = commands.add_parser(name, help=what)
        power.add_argument("nodes", nargs="*", metavar="NODE")
    commands.add_parser("status", help="table of the nodes")
    ssh = commands.add_parser("ssh", help="ssh into a node, or run a command there")
    ssh.add_argument("node")
    ssh.add_argument("remote", nargs=argparse.REMAINDER, metavar="CMD")
    real = commands.add_parser(
        "kubernetes", help="build (once) and verify the real Kubernetes binaries in the cache; prints their bin dir"
    )
    real.add_argument(
        "--verify-only",
        action="store_true",
        help="check every binary against SHA256SUMS, change nothing; exit 1 on any problem",
    )
    image = commands.add_parser(
        "guest", help="build (once) and verify the VM nodes' guest image in the cache; prints its directory"
    )
    image.add_argument(
        "--verify-only",
        action="store_true",
        help="check the image, kernel and initrd against the manifest, change nothing; exit 1 on any problem",
    )
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    paths = LabPaths.from_environment()
    try:
        if args.command == "up":
            lab.up(paths, args.control_planes, args.workers, args.tamper, args.vm_workers)
            return 0
        if args.command == "down":
            lab.down(paths)
            return 0
        if args.command in ("stop", "start", "reboot"):
            getattr(lab, args.command)(paths, args.nodes)
            return 0
        if args.command == "status":
            return lab.status(paths)
        if args.command == "kubernetes":
            return _kubernetes(paths, args.verify_only)
        if args.command == "guest":
            return _guest(paths, args.verify_only)
        return lab.ssh(paths, args.node, args.remote)
    except LabError as exc:
        print(f"lab {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"lab {args.command}: interrupted", file=sys.stderr)
        return 130


def _kubernetes(paths: LabPaths, verify_only: bool) -> int:
    if not verify_only:
        for release in kubernetes.RELEASES:
            print(kubernetes.ensure_kubernetes(paths, lab.log, release))
        return 0
    failed = False
    for release in kubernetes.RELEASES:
        problems = kubernetes.verify_kubernetes(paths, release, log=lab.log)
        for name, problem in problems.items():
            lab.log(f"kubernetes: {release.version}: {name}: {problem}")
        if problems:
            failed = True
            continue
        lab.log(f"kubernetes: {release.version}: all {len(release.artefacts)} binaries match SHA256SUMS")
        print(kubernetes.CacheLayout(paths, release).bin_dir)
    return 1 if failed else 0


def _guest(paths: LabPaths, verify_only: bool) -> int:
    if not verify_only:
        print(guest.ensure_guest(paths, lab.log).root_image.parent)
        return 0
    problems = guest.verify_guest(paths, log=lab.log)
    for name, problem in problems.items():
        lab.log(f"guest: {name}: {problem}")
    if problems:
        return 1
    lab.log(f"guest: image {guest.image_key()[:20]}: {' '.join(guest.FILES)} match the manifest")
    print(guest.GuestLayout(paths, guest.image_key()).image_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
