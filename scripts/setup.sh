#!/usr/bin/env bash
# Prepares this machine for the lab and the tests: Debian packages (as root)
# and a project virtualenv in .venv. Safe to re-run; does nothing when done.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
packages=(swtpm swtpm-tools tpm2-tools libtss2-dev pkg-config gcc debootstrap
          systemd-container cryptsetup-bin iproute2 openssh-client git shellcheck
          containerd softhsm2)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "setup: missing Debian packages (run as root to install): ${missing[*]}" >&2
    exit 1
  fi
  echo "setup: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

venv="$repo/.venv"
stamp="$venv/.requirements.sha256"
want=$(cat "$repo"/requirements*.txt | sha256sum | cut -d' ' -f1)
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing Python packages into $venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$repo/requirements-test.txt" -r "$repo/requirements-node.txt"
  echo "$want" > "$stamp"
fi
