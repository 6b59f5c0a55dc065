"""kubelet double: reports its version; it runs no pods."""

from __future__ import annotations

import sys

from . import KUBERNETES_VERSION


def main(argv: list[str]) -> int:
    if argv in (["--version"], ["--version=true"]):
        print(f"Kubernetes {KUBERNETES_VERSION}")
        return 0
    print(
        'E0000 run.go:72] "command failed" err="this kubelet is a test double (k8s-doubles): it runs no pods; '
        "only 'kubelet --version' is supported\"",
        file=sys.stderr,
    )
    return 1
