"""`crictl`: the calls kubeadm 1.20 makes (-r ENDPOINT info, inspecti, pull, pods, stopp, rmp); see README.md."""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import sys

from . import StandinError, resolve_image, same_endpoint
from .pods import PODS, read_states, running, stop_container

INFO = {
    "status": {
        "conditions": [
            {"type": "RuntimeReady", "status": True, "reason": "", "message": ""},
            {
                "type": "NetworkReady",
                "status": False,
                "reason": "NetworkPluginNotReady",
                "message": "kubelet-standin runs static pods as host processes, with no pod network",
            },
        ]
    }
}


def image(command: str, reference: str) -> str:
    try:
        _component, binary, version = resolve_image(reference)
    except StandinError as exc:
        raise StandinError(f"{'pulling image' if command == 'pull' else 'no such image'}: {exc}") from None
    image_id = "sha256:" + hashlib.sha256(f"{binary}:{binary.stat().st_size}:{version}".encode()).hexdigest()
    if command == "pull":
        return f"Image is up to date for {image_id}\n"
    status = {"id": image_id, "repoTags": [reference], "repoDigests": [], "size": str(binary.stat().st_size)}
    return json.dumps({"status": status, "info": {"binary": str(binary)}}, indent=2) + "\n"


def stop_or_remove(command: str, ids: list[str]) -> str:
    out, states = "", read_states()
    for wanted in ids:
        found = [(key, state) for key, state in states.items() if state["id"].startswith(wanted)]
        if len(found) != 1:
            raise StandinError(f"{'no' if not found else 'more than one'} pod sandbox matches {wanted!r}")
        key, state = found[0]
        if command == "stopp":
            for container in state["containers"]:
                stop_container(container, state["grace"])
        elif any(map(running, state["containers"])):
            raise StandinError(f"pod sandbox {state['id']} is running, please stop it first")
        else:
            (PODS / f"{key}.json").unlink(missing_ok=True)
        out += f"{'Stopped' if command == 'stopp' else 'Removed'} sandbox {state['id']}\n"
    return out


def main(argv: list[str]) -> int:
    endpoint, args = os.environ.get("CONTAINER_RUNTIME_ENDPOINT", "unix:///var/run/dockershim.sock"), list(argv)
    try:
        while args and args[0].split("=")[0] in ("-r", "--runtime-endpoint"):
            option, equals, endpoint = args.pop(0).partition("=")
            if not equals and not args:
                raise StandinError(f"flag needs an argument: {option}")
            endpoint = endpoint if equals else args.pop(0)
        if args and args[0].startswith("-"):
            raise StandinError(f"flag provided but not defined: {args[0]}")
        if not same_endpoint(endpoint):
            raise StandinError(
                f"connect: connect endpoint '{endpoint}', make sure you are running as root and the "
                "endpoint has been started: context deadline exceeded"
            )
        command, rest = (args or [""])[0], args[1:]
        if command == "info" and not rest:
            print(json.dumps(INFO, indent=2))
        elif command in ("inspecti", "pull") and len(rest) == 1:
            print(image(command, rest[0]), end="")
        elif command == "pods" and rest in ([], ["-q"], ["--quiet"]):
            for pod in read_states().values():
                ready = "Ready" if all(map(running, pod["containers"])) else "NotReady"
                print(pod["id"] if rest else f"{pod['id'][:13]}  {pod['name']}  {pod['namespace']}  {ready}")
        elif command in ("stopp", "rmp") and rest:
            print(stop_or_remove(command, rest), end="")
        else:
            raise StandinError(f"unsupported: {' '.join(args) or 'no command'} (info inspecti pull pods stopp rmp)")
    except StandinError as exc:
        stamp = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        print(f'time="{stamp}" level=fatal msg="{exc}"', file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
