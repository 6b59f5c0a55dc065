"""Test doubles of kubeadm, kube-apiserver, kubectl and helm.

Used only by the lab and by unit tests; the collection always runs the real
binaries on real hosts.  See README.md for what is simulated and what is real.
"""

from __future__ import annotations

KUBERNETES_VERSION = "v1.31.4"
GIT_COMMIT = "a78aa47129b8539636eb86a9d00e31b2720fe06b"
BUILD_DATE = "2024-12-10T18:07:00Z"
GO_VERSION = "go1.22.10"
