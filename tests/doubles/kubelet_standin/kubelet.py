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

FLAGS = {line.rstrip("="): line.endswith("=")
         for line in (Path(__file__).parent / "kubelet-flags.txt").read_text().splitlines()
         if line and not line.startswith("#")}
SHORTHANDS = {"v": "v", "h": "help"}
HEARTBEAT_SECONDS, SYNC_SECONDS = 10.0, 2.0


def log(message: str) -> None:
    print(f"kubelet-standin: {message}", file=sys.stderr, flush=True)


def parse_flags(argv: list[str]) -> dict[str, str]:
    """pflag's rules for the real kubelet's flags: --name=value, --name value, --bool, -v 2."""
    values: dict[str, str] = {}
    args = iter(argv)
    for arg in args:
        if arg.startswith("--"):
            name, equals, value = arg[2:].partition("=")
            if name not in FLAGS:
                raise StandinError(f"unknown flag: --{name}")
        elif arg.startswith("-") and len(arg) > 1:
            short, equals, value = arg[1:].partition("=")
            if short not in SHORTHANDS:
                raise StandinError(f"unknown shorthand flag: {short[0]!r} in -{short}")
            name = SHORTHANDS[short]
        else:
            raise StandinError(f"unknown command: {arg}")
        if FLAGS[name] and not equals:
            value = next(args, None)
            if value is None:
                raise StandinError(f"flag needs an argument: --{name}")
        values[name] = value if FLAGS[name] or equals else "true"
    return values


def load_config(path: str) -> dict:
    try:
        config = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise StandinError(f"failed to load Kubelet config file {path}, error: {exc}") from None
    if (config.get("apiVersion"), config.get("kind")) != ("kubelet.config.k8s.io/v1beta1", "KubeletConfiguration"):
        raise StandinError(f"failed to load Kubelet config file {path}: not a kubelet.config.k8s.io/v1beta1 "
                           "KubeletConfiguration")
    return config


def node_address(hostname: str) -> str:
    """The hostname's address, or (loopback or unresolvable) the address of the default route's interface."""
    try:
        address = socket.gethostbyname(hostname)
        if not address.startswith("127."):
            return address
    except OSError:
        pass
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("10.255.255.255", 1))
        return probe.getsockname()[0]


def serve_healthz(address: str, port: int) -> None:
    class Healthz(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ok = self.path == "/healthz"
            self.send_response(200 if ok else 404)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.end_headers()
            self.wfile.write(b"ok" if ok else b"404 page not found\n")

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer((address, port), Healthz)
    threading.Thread(target=server.serve_forever, daemon=True).start()


def run_node(agent_args: dict, kubeconfig: Path, boot, cert_dir: Path, node_name: str) -> None:
    """Finish the TLS bootstrap if needed, register the Node, then heartbeat every 10 s (retrying on errors)."""
    last_error, agent = "", None
    while True:
        try:
            if boot is not None:
                store_certificate(cert_dir, *request_certificate(Client(boot), node_name, log))
                log(f"client certificate issued and stored in {cert_dir}")
                boot = None
            if agent is None:
                candidate = NodeAgent(Client(load_kubeconfig(kubeconfig)), **agent_args)
                candidate.register()
                agent = candidate
                log(f"node {node_name} registered")
            agent.heartbeat()
            last_error = ""
            time.sleep(HEARTBEAT_SECONDS)
        except StandinError as exc:
            if str(exc) != last_error:
                log(f"will retry: {exc}")
            last_error = str(exc)
            time.sleep(2)


def main(argv: list[str]) -> int:
    try:
        flags = parse_flags(argv)
        if flags.get("help") == "true":
            print("Usage:\n  kubelet [flags]\n\nFlags (those of the real kubelet; see tests/doubles/kubelet_standin):\n  "
                  + "\n  ".join(f"--{name}{' value' if value else ''}" for name, value in sorted(FLAGS.items())))
            return 0
        if flags.get("version", "false") != "false":
            print(f"Kubernetes {kubernetes_version()}")
            return 0
        config = load_config(flags["config"]) if "config" in flags else {}
        runtime, endpoint = flags.get("container-runtime", "docker"), flags.get("container-runtime-endpoint", "")
        if runtime != "remote" or not same_endpoint(endpoint):
            raise StandinError(f"failed to run Kubelet: container runtime {runtime!r} at {endpoint or 'default'!r} "
                               f"is not available: this stand-in serves only --container-runtime=remote "
                               f"--container-runtime-endpoint={ENDPOINT}")
        hostname = socket.gethostname().lower()
        node_name = flags.get("hostname-override", hostname).lower()
        cert_dir = Path(flags.get("cert-dir", "/var/lib/kubelet/pki"))
        kubeconfig = Path(flags.get("kubeconfig", "/etc/kubernetes/kubelet.conf"))
        rotate = flags.get("rotate-certificates", str(config.get("rotateCertificates", False))).lower() == "true"
        bootstrap = Path(flags["bootstrap-kubeconfig"]) if flags.get("bootstrap-kubeconfig") else None
        boot = client_config(kubeconfig, bootstrap, cert_dir, rotate, log)
        agent_args = {
            "name": node_name, "hostname": hostname, "version": kubernetes_version(),
            "address": flags.get("node-ip") or node_address(hostname),
            "labels": parse_labels(flags.get("node-labels", "")), "taints": parse_taints(flags.get("register-with-taints", "")),
            "max_pods": int(flags.get("max-pods", config.get("maxPods", 110)))}
        serve_healthz(flags.get("healthz-bind-address", config.get("healthzBindAddress", "127.0.0.1")),
                      int(flags.get("healthz-port", config.get("healthzPort", 10248))))
    except (StandinError, OSError, ValueError) as exc:
        print(f"F{time.strftime('%m%d %H:%M:%S')} kubelet-standin] {exc}", file=sys.stderr, flush=True)
        return 255
    log(f"node {node_name}: {'valid client credentials' if boot is None else 'TLS bootstrap in the background'}")
    threading.Thread(target=run_node, args=(agent_args, kubeconfig, boot, cert_dir, node_name), daemon=True).start()
    manifests = flags.get("pod-manifest-path", config.get("staticPodPath", ""))
    pods = StaticPods(Path(manifests), node_name, log) if manifests else None
    # SIGTERM ends the stand-in only: its pods run on (KillMode=process), as containers outlive a kubelet.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        if pods is not None:
            pods.sync()
        time.sleep(SYNC_SECONDS)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
