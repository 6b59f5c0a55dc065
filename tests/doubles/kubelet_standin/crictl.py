"""`crictl`: the commands kubeadm 1.20 runs (info, inspecti, pull, pods, stopp, rmp) and version.

Images are present when images.resolve() maps them to a local binary of the tagged version;
pods are the stand-in's static pods (pods.read_states()). Another endpoint fails as a real
crictl does when nothing listens there.
"""
from __future__ import annotations

import datetime
import json
import os
import sys

from . import RUNTIME, RUNTIME_VERSION, StandinError, same_endpoint
from .images import ImageError, resolve
from .pods import pods_dir, read_states, running, stop_container

VALUE_OPTIONS = {"-r": "runtime-endpoint", "--runtime-endpoint": "runtime-endpoint", "-i": "image-endpoint",
                 "--image-endpoint": "image-endpoint", "-t": "timeout", "--timeout": "timeout",
                 "-c": "config", "--config": "config"}
FLAG_OPTIONS = {"-D", "--debug"}


def fatal(message: str) -> int:
    print(f'time="{datetime.datetime.now().astimezone().isoformat(timespec="seconds")}" level=fatal msg="{message}"',
          file=sys.stderr)
    return 1


def pod_id(states: dict[str, dict], wanted: str) -> tuple[str, dict]:
    """The pod a (possibly truncated) id names."""
    found = [(key, state) for key, state in states.items() if state["id"].startswith(wanted)]
    if len(found) != 1:
        raise StandinError(f"{'no' if not found else 'more than one'} pod sandbox matches {wanted!r}")
    return found[0]


def command_info() -> None:
    conditions = [{"type": "RuntimeReady", "status": True, "reason": "", "message": ""},
                  {"type": "NetworkReady", "status": False, "reason": "NetworkPluginNotReady",
                   "message": "kubelet-standin runs static pods as host processes only, no pod network"}]
    print(json.dumps({"status": {"conditions": conditions}}, indent=2))


def command_pods(args: list[str]) -> None:
    states = read_states()
    if "-q" in args or "--quiet" in args:
        print("".join(f"{state['id']}\n" for state in states.values()), end="")
        return
    print(f"{'POD ID':<16}{'CREATED':<22}{'STATE':<10}{'NAME':<40}{'NAMESPACE':<14}ATTEMPT")
    for state in states.values():
        ready = "Ready" if all(running(c) for c in state["containers"]) else "NotReady"
        created = datetime.datetime.fromtimestamp(state["created"]).strftime("%Y-%m-%d %H:%M:%S")
        print(f"{state['id'][:13]:<16}{created:<22}{ready:<10}{state['name']:<40}{state['namespace']:<14}0")


def command_stopp(ids: list[str]) -> None:
    states = read_states()
    for wanted in ids:
        _, state = pod_id(states, wanted)
        for container in state["containers"]:
            stop_container(container, state.get("grace", 30.0))
        print(f"Stopped sandbox {state['id']}")


def command_rmp(ids: list[str]) -> None:
    states = read_states()
    for wanted in ids:
        key, state = pod_id(states, wanted)
        if any(running(c) for c in state["containers"]):
            raise StandinError(f"pod sandbox {state['id']} is running, please stop it first")
        (pods_dir() / f"{key}.json").unlink(missing_ok=True)
        print(f"Removed sandbox {state['id']}")


def main(argv: list[str]) -> int:
    options, args = {"runtime-endpoint": os.environ.get("CONTAINER_RUNTIME_ENDPOINT", "")}, list(argv)
    while args and args[0].startswith("-"):
        name, equals, value = args.pop(0).partition("=")
        if name in FLAG_OPTIONS:
            continue
        if name not in VALUE_OPTIONS:
            return fatal(f"flag provided but not defined: {name}")
        if not equals:
            if not args:
                return fatal(f"flag needs an argument: {name}")
            value = args.pop(0)
        options[VALUE_OPTIONS[name]] = value
    if not args:
        return fatal("a command is required (info, version, inspecti, pull, pods, stopp, rmp)")
    command, args = args[0], args[1:]
    endpoint = options["runtime-endpoint"] or "unix:///var/run/dockershim.sock"
    if not same_endpoint(endpoint):
        return fatal(f"connect: connect endpoint '{endpoint}', make sure you are running as root and the endpoint "
                     "has been started: context deadline exceeded")
    try:
        if command == "info":
            command_info()
        elif command == "version":
            print(f"Version:  0.1.0\nRuntimeName:  {RUNTIME}\nRuntimeVersion:  {RUNTIME_VERSION}\n"
                  "RuntimeApiVersion:  v1alpha2")
        elif command in ("inspecti", "pull") and len(args) == 1:
            image = resolve(args[0])
            if command == "pull":
                print(f"Image is up to date for {image.image_id}")
            else:
                print(json.dumps({"status": {"id": image.image_id, "repoTags": [image.reference], "repoDigests": [],
                                             "size": str(image.binary.stat().st_size), "username": ""},
                                  "info": {"binary": str(image.binary), "version": image.version}}, indent=2))
        elif command == "pods":
            command_pods(args)
        elif command in ("stopp", "rmp") and args:
            (command_stopp if command == "stopp" else command_rmp)(args)
        else:
            return fatal(f"unknown command or wrong arguments: {' '.join([command, *args])}")
    except ImageError as exc:
        prefix = "no such image" if command == "inspecti" else "pulling image"
        return fatal(f"{prefix}: {exc}")
    except StandinError as exc:
        return fatal(str(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
