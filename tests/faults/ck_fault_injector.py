# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Test-only fault injector for lab nodes (never shipped with the collection).

The fault runner (tests/faults/run) copies this file and the step list (faults.yml as
JSON) to /opt/ck-faults/ on a lab node and adds a .pth file to the node venv that
imports it, so every Python of that venv - the Ansible modules and the join service
alike - loads it at start-up (a file named sitecustomize.py would lose to Debian's own).
It does nothing unless a step is armed: ``CK_FAULT_STEP=<name>`` in the environment (a
systemd drop-in for the join service) or the step name in /run/ck-fault/step (written by
the runner for the node-side modules).

A step (see faults.yml) names ``target: "<module under plugins/module_utils>:<Class.attr or function>"``,
``when: before|after`` and ``action``. When the target module is imported, the
named function is wrapped; the wrapper fires once per boot (marker
/run/ck-fault/fired-<name>, created with O_EXCL) and then SIGKILLs its own process,
exactly as ``kill -9`` would. Actions:

- ``kill``: SIGKILL at once (before or after the call).
- ``kill-later``: run the call, return its result, SIGKILL the process ``delay`` seconds later
  (the join service after it returned a ticket).
- ``luks-add-key``: instead of ``StateDisk._change_key`` add the new key with luksAddKey and die before
  the old keyslot is killed (an interrupted two-step re-key: both keys open the disk).
- ``kill-child``: instead of ``Kubeadm._run_command`` for ``kubeadm <argv1>``, start it, wait until ``wait_for``
  exists (or ``delay`` seconds), SIGKILL kubeadm and then this process (a crash in the middle of kubeadm).
"""

import importlib.abc
import inspect
import json
import os
import signal
import subprocess
import sys
import threading
import time

PACKAGE = "ansible_collections.confidential.kubernetes.plugins.module_utils."
# The unit test of this injector points these elsewhere.
MARKER_DIR = os.environ.get("CK_FAULT_DIR", "/run/ck-fault")
STEP_FILE = os.path.join(MARKER_DIR, "step")
STEPS_FILE = os.environ.get("CK_FAULT_STEPS_FILE", "/opt/ck-faults/faults.json")


def _armed():
    name = os.environ.get("CK_FAULT_STEP")
    if name is None:
        try:
            with open(STEP_FILE, encoding="utf-8") as handle:
                name = handle.read().strip()
        except OSError:
            return None
    try:
        with open(STEPS_FILE, encoding="utf-8") as handle:
            steps = {step["name"]: step for step in json.load(handle)["steps"]}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return steps.get(name)


def _claim(spec) -> bool:
    """True exactly once per step and boot: the marker tells the runner that the fault fired."""
    try:
        fd = os.open(os.path.join(MARKER_DIR, "fired-" + spec["name"]), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError:
        return False
    os.write(fd, f"{os.getpid()} {' '.join(sys.argv)[:200]}\n".encode())
    os.fsync(fd)
    os.close(fd)
    return True


def _die() -> None:
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _kill_later(delay: float) -> None:
    timer = threading.Timer(delay, _die)
    timer.daemon = True
    timer.start()


def _luks_add_key(spec, original):
    def change_key(self, old_key, new_key):
        if not _claim(spec):
            return original(self, old_key, new_key)
        keys = sys.modules[type(self).__module__]
        with keys.private_key_file(new_key) as new_key_file:
            result = self._cryptsetup(
                ["luksAddKey", "--batch-mode", *self._pbkdf_args(), "--key-file=-", self.device, new_key_file], old_key
            )
        if result.rc != 0:
            raise SystemExit(f"fault injector: luksAddKey failed: {result.message()}")
        _die()

    return change_key


def _kill_child(spec, original):
    def run_command(self, argv, stdin=None):
        if len(argv) < 2 or argv[1] != spec.get("argv1") or not _claim(spec):
            return original(self, argv, stdin)
        child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if stdin:
            child.stdin.write(stdin)
        child.stdin.close()
        deadline = time.monotonic() + float(spec.get("delay", 5))
        while (
            time.monotonic() < deadline
            and child.poll() is None
            and not os.path.exists(spec.get("wait_for", "/nonexistent"))
        ):
            time.sleep(0.005)
        child.kill()
        _die()

    return run_command


def _wrap(spec, original, is_async: bool):
    when, action = spec.get("when", "before"), spec.get("action", "kill")
    if action == "luks-add-key":
        return _luks_add_key(spec, original)
    if action == "kill-child":
        return _kill_child(spec, original)

    def fire() -> None:
        if action == "kill-later":
            _kill_later(float(spec.get("delay", 1.0)))
        else:
            _die()

    if is_async:

        async def wrapper(*args, **kwargs):
            armed = _claim(spec)
            if armed and when == "before":
                fire()
            result = await original(*args, **kwargs)
            if armed and when == "after":
                fire()
            return result

        return wrapper

    def wrapper(*args, **kwargs):  # pylint: disable=function-redefined
        armed = _claim(spec)
        if armed and when == "before":
            fire()
        result = original(*args, **kwargs)
        if armed and when == "after":
            fire()
        return result

    return wrapper


def _patch(module, spec) -> None:
    owner = module
    *path, attr = spec["target"].split(":", 1)[1].split(".")
    for name in path:
        owner = getattr(owner, name)
    original = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
    setattr(owner, attr, _wrap(spec, original, inspect.iscoroutinefunction(original)))


class _Loader(importlib.abc.Loader):
    def __init__(self, inner, step):
        self._inner = inner
        self._step = step

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        _patch(module, self._step)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, spec):
        self._spec = spec
        self._module = PACKAGE + spec["target"].split(":", 1)[0]

    def find_spec(self, fullname, path, target=None):
        if fullname != self._module:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            module_spec = finder.find_spec(fullname, path, target)
            if module_spec is not None and module_spec.loader is not None:
                module_spec.loader = _Loader(module_spec.loader, self._spec)
                return module_spec
        return None


_SPEC = _armed()
if _SPEC is not None:
    sys.meta_path.insert(0, _Finder(_SPEC))
