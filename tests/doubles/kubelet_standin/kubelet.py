"""`kubelet`: the real kubelet's command line; credentials, Node + Lease, healthz and static pods."""

from __future__ import annotations

import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

from . import ENDPOINT, StandinError, kubernetes_version, same_endpoint
from .api import Client, client_config, load_kubeconfig, request_certificate, store_certificate
from .node import NodeAgent, parse_labels, parse_taints
from .pods import StaticPods

FLAGS = {
    line.rstrip("="): line.endswith("=")
    for line in (Path(__file__).parent / "kubelet-flags.txt").read_text().splitlines()
    if line and not line.startswith("#")
}
HEARTBEAT_SECONDS, SYNC_SECONDS = 10.0, 2.0
KUBELET_CONFIG = ("kubelet.config.k8s.io/v1beta1", "KubeletConfiguration")


def log(message: str) -> None:
    print(f"kubelet-standin: {message}", file=sys.stderr, flush=True)


def parse_flags(argv: list[str]) -> dict[str, str]:
    """pflag's rules for the real kubelet's flags: --name=value, --name value, --bool, -v 2."""
    values: dict[str, str] = {}
    args = iter(argv)
    for arg in args:
        name, equals, value = arg.lstrip("-").partition("=")
        if not arg.startswith("-") or arg == "-":
            raise StandinError(f"unknown command: {arg}")
        if arg.startswith("--") and name not in FLAGS:
            raise StandinError(f"unknown flag: --{name}")
        if not arg.startswith("--"):
            if name not in ("v", "h"):
                raise StandinError(f"unknown shorthand flag: {name[0]!r} in -{name}")
            name = {"v": "v", "h": "help"}[name]
        if FLAGS[name] and not equals:
            value = next(args, None)
            if value is None:
                raise StandinError(f"flag needs an argument: --{name}")
        values[name] = value if FLAGS[name] or equals else "true"
    return values


def node_address(hostname: str) -> str:
    """The hostname's first non-loopback address, else the address of the default route's interface."""
    try:
        return next(a for a in socket.gethostbyname_ex(hostname)[2] if not a.startswith("127."))
    except (OSError, StopIteration):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("10.255.255.255", 1))
            return probe.getsockname()[0]


class Healthz(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/healthz" else 404)
        self.end_headers()
        self.wfile.write(b"ok" if self.path == "/healthz" else b"404 page not found\n")

    def log_message(self, *args) -> None:
        """No access log."""


def run_node(agent_args: dict, kubeconfig: Path, boot, cert_dir: Path) -> None:
    """Finish the TLS bootstrap if needed, register the Node, then heartbeat every 10 s (retrying on errors)."""
    last_error, agent = "", None
    while True:
        try:
            if boot is not None:
                store_certificate(cert_dir, *request_certificate(Client(boot), agent_args["name"], log))
                log(f"client certificate issued and stored in {cert_dir}")
                boot = None
            if agent is None:
                agent = NodeAgent(Client(load_kubeconfig(kubeconfig)), **agent_args)
                agent.register()
                log(f"node {agent.name} registered")
            agent.heartbeat()
            last_error = ""
            time.sleep(HEARTBEAT_SECONDS)
        except StandinError as exc:
            agent = agent if agent is not None and agent.uid else None
            if str(exc) != last_error:
                log(f"will retry: {exc}")
            last_error = str(exc)
            time.sleep(2)


def main(argv: list[str]) -> int:
    try:
        flags = parse_flags(argv)
        if flags.get("help", "false") != "false":
            print(
                "Usage: kubelet [flags]\n" + "".join(f"  --{flag}{' value' * value}\n" for flag, value in FLAGS.items())
            )
            return 0
        if flags.get("version", "false") != "false":
            print(f"Kubernetes {kubernetes_version()}")
            return 0
        config: dict = {}
        if "config" in flags:
            try:
                config = yaml.safe_load(Path(flags["config"]).read_text())
            except (OSError, yaml.YAMLError) as exc:
                raise StandinError(f"failed to load Kubelet config file {flags['config']}, error: {exc}") from None
            if not isinstance(config, dict) or (config.get("apiVersion"), config.get("kind")) != KUBELET_CONFIG:
                raise StandinError(
                    f"failed to load Kubelet config file {flags['config']}: not a {' '.join(KUBELET_CONFIG)}"
                )

        def setting(flag: str, field: str, default: object) -> str:
            return str(flags.get(flag, config.get(field, default)))

        runtime, endpoint = flags.get("container-runtime", "docker"), flags.get("container-runtime-endpoint", "")
        if runtime != "remote" or not same_endpoint(endpoint):
            raise StandinError(
                f"failed to run Kubelet: container runtime {runtime!r} at {endpoint or 'default'!r} is "
                f"unavailable: the stand-in serves only --container-runtime=remote "
                f"--container-runtime-endpoint={ENDPOINT}"
            )
        hostname = socket.gethostname().lower()
        if not flags.get("kubeconfig"):
            raise StandinError("--kubeconfig is needed: the stand-in does not run in standalone mode")
        cert_dir, kubeconfig = Path(flags.get("cert-dir", "/var/lib/kubelet/pki")), Path(flags["kubeconfig"])
        bootstrap = Path(flags["bootstrap-kubeconfig"]) if flags.get("bootstrap-kubeconfig") else None
        rotate = setting("rotate-certificates", "rotateCertificates", False).lower() == "true"
        boot = client_config(kubeconfig, bootstrap, cert_dir, rotate, log)
        agent_args = {
            "name": flags.get("hostname-override", hostname).lower(),
            "hostname": hostname,
            "version": kubernetes_version(),
            "address": flags.get("node-ip") or node_address(hostname),
            "labels": parse_labels(flags.get("node-labels", "")),
            "taints": parse_taints(flags.get("register-with-taints", "")),
            "max_pods": int(setting("max-pods", "maxPods", 110)),
        }
        server = ThreadingHTTPServer(
            (
                setting("healthz-bind-address", "healthzBindAddress", "127.0.0.1"),
                int(setting("healthz-port", "healthzPort", 10248)),
            ),
            Healthz,
        )
    except (StandinError, OSError, ValueError) as exc:
        print(f"F{time.strftime('%m%d %H:%M:%S')} kubelet-standin] {exc}", file=sys.stderr, flush=True)
        return 255
    threading.Thread(target=server.serve_forever, daemon=True).start()
    log(f"node {agent_args['name']}: {'TLS bootstrap in the background' if boot else 'valid client credentials'}")
    threading.Thread(target=run_node, args=(agent_args, kubeconfig, boot, cert_dir), daemon=True).start()
    manifests = setting("pod-manifest-path", "staticPodPath", "")
    pods = StaticPods(Path(manifests), agent_args["name"], log) if manifests else None
    # SIGTERM ends the stand-in only: its pods run on (KillMode=process), as containers outlive a kubelet.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        if pods is not None:
            pods.sync()
        time.sleep(SYNC_SECONDS)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
