"""Entry point of every double: ``python run.py TOOL ARGS...`` (the bin/ launchers call this)."""

import importlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.realpath(__file__))))

TOOLS = {"kubeadm": "kubeadm", "kubectl": "kubectl", "helm": "helm", "kube-apiserver": "apiserver"}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in TOOLS:
        sys.exit(f"usage: run.py {{{','.join(TOOLS)}}} [ARGS...]")
    sys.exit(importlib.import_module(f"k8sdoubles.{TOOLS[sys.argv[1]]}").main(sys.argv[2:]))
