# Copyright (c) confidential.kubernetes contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the collection requires of the controller and of each node, checked before anything changes (the preflight
action). Pure: the caller passes what it found; every problem names the value found, what is supported and the
variable (or step) that fixes it."""

from __future__ import annotations

import re

from .._versions import MACHINE_ARCH

# The oldest Python the collection's code runs on, on the controller and on the nodes (tests/config.yml python_requires).
MINIMUM_PYTHON = (3, 10)
_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?")
_REQUIREMENT = re.compile(r"^\s*(>=|>|<=|<|==|!=)\s*(\d+(?:\.\d+)*)\s*$")


def _numbers(version: str) -> tuple[int, ...]:
    match = _VERSION.match(version.strip())
    if not match:
        raise ValueError(f"not a version: {version!r}")
    return tuple(int(part) for part in match.groups() if part is not None)


def _padded(numbers: tuple[int, ...]) -> tuple[int, int, int]:
    return (tuple(numbers) + (0, 0, 0))[:3]  # type: ignore[return-value]


def satisfies(version: str, specifier: str) -> bool:
    """Whether ``version`` (2.18.3, 2.19.0rc1) meets a PEP 440-style specifier of comparisons (``>=2.17.0,<2.21``), as
    meta/runtime.yml's requires_ansible states it. A pre-release counts as its release."""
    found = _padded(_numbers(version))
    for clause in specifier.split(","):
        match = _REQUIREMENT.match(clause)
        if not match:
            raise ValueError(f"cannot read the requirement {clause.strip()!r}")
        operator, bound = match.group(1), _padded(_numbers(match.group(2)))
        if not {
            ">=": found >= bound,
            ">": found > bound,
            "<=": found <= bound,
            "<": found < bound,
            "==": found == bound,
            "!=": found != bound,
        }[operator]:
            return False
    return True


def _python_text(version: tuple[int, ...]) -> str:
    return ".".join(str(part) for part in version)


def controller_problems(python: tuple[int, ...], ansible_core: str, requires_ansible: str) -> list[str]:
    """The controller's Python (``sys.version_info``) and ansible-core version against the collection's requirements."""
    problems = []
    if tuple(python[:2]) < MINIMUM_PYTHON:
        problems.append(
            f"the controller runs Python {_python_text(python[:3])}; the collection needs Python "
            f"{_python_text(MINIMUM_PYTHON)} or newer on the controller: run ansible-playbook from a Python "
            f"{_python_text(MINIMUM_PYTHON)}+ environment with pip install -r requirements.txt"
        )
    if not satisfies(ansible_core, requires_ansible):
        problems.append(
            f"the controller runs ansible-core {ansible_core}; the collection requires ansible-core {requires_ansible} "
            f"(meta/runtime.yml): install a supported one with pip install -r requirements.txt"
        )
    return problems


def node_problems(host: str, machine: str | None, python_version: str | None) -> list[str]:
    """A node's machine (``ansible_architecture``, as node_state reports it) and the Python Ansible runs there."""
    problems = []
    if machine is not None and machine not in MACHINE_ARCH:
        problems.append(
            f"{host}: the node's architecture is {machine}; the versions table provides Kubernetes builds for "
            f"{', '.join(sorted(MACHINE_ARCH))} only (amd64, arm64): remove the host from the inventory or run it "
            "on a supported machine"
        )
    if python_version is not None and _numbers(python_version)[:2] < MINIMUM_PYTHON:
        problems.append(
            f"{host}: Ansible runs Python {python_version} on the node; the collection's modules need Python "
            f"{_python_text(MINIMUM_PYTHON)} or newer there: set ansible_python_interpreter (and node_python, which "
            f"creates the modules' environment) to a Python {_python_text(MINIMUM_PYTHON)}+ on the node"
        )
    return problems
