#!/usr/bin/env bash
# Makes the source tree importable as confidential.kubernetes from .venv/collections.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
link="$repo/.venv/collections/ansible_collections/confidential/kubernetes"
mkdir -p "$(dirname "$link")"
[ -L "$link" ] || ln -s "$repo" "$link"
