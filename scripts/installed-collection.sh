#!/usr/bin/env bash
# The collection as users get it: build the tarball with ansible-galaxy, check what it holds, install it into the
# collections path DEST, and check that confidential.kubernetes resolves to that installed copy. scripts/test.sh then
# runs the quick start and the day-2 drills from it (ANSIBLE_COLLECTIONS_PATH=DEST tests/drills/run: every task of
# site.yml must come from DEST).
# Run: bash scripts/installed-collection.sh DEST   (DEST: a new or empty directory)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
export PATH="$repo/.venv/bin:$PATH"
fail() { echo "installed-collection: $*" >&2; exit 1; }
step() { printf 'installed-collection: %s\n' "$*"; }
[ $# = 1 ] || fail "usage: $0 DEST (the collections path to install into)"
mkdir -p "$1"
dest=$(cd "$1" && pwd)
[ -z "$(ls -A "$dest")" ] || fail "$dest is not empty"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

step "build"
ansible-galaxy collection build --force --output-path "$work/dist" "$repo" >/dev/null
tarball=$(ls "$work"/dist/confidential-kubernetes-*.tar.gz)
tar -tzf "$tarball" | sed 's,^\./,,' > "$work/contents"
step "$(basename "$tarball"): $(wc -l < "$work/contents") entries, $(du -k "$tarball" | cut -f1) KiB"

# What must not be in it: virtualenvs, caches, test output, lab state, the test suite and its doubles (the lab
# runs from a source checkout), CI and development scripts.
if grep -E '(^|/)(\.venv[^/]*|__pycache__|\.pytest_cache|\.hypothesis|\.git|\.lab|\.ci|tests|extensions|scripts|bench|build)(/|$)|\.pyc$|\.tar\.gz$' \
    "$work/contents" > "$work/unwanted"; then
  fail "the tarball holds what it must not: $(head -5 "$work/unwanted" | tr '\n' ' ')"
fi
for wanted in MANIFEST.json FILES.json README.md CHANGELOG.md LICENSES/GPL-3.0-or-later.txt meta/runtime.yml \
    meta/execution-environment.yml requirements.txt requirements-node.txt bindep.txt docs/index.md \
    playbooks/site.yml playbooks/verify.yml playbooks/templates/attestation_table.j2 roles/node/meta/argument_specs.yml \
    plugins/modules/tpm_evidence.py plugins/module_utils/_join/joinservice_pb2.py plugins/doc_fragments/_attributes.py; do
  grep -qx "$wanted" "$work/contents" || fail "the tarball lacks $wanted"
done

step "install"
# --force: a copy elsewhere (molecule leaves one in ~/.ansible/collections) must not make it skip the install.
ansible-galaxy collection install --offline --force -p "$dest" "$tarball" > "$work/install.log" 2>&1 \
  || { cat "$work/install.log" >&2; fail "ansible-galaxy collection install failed"; }
installed="$dest/ansible_collections/confidential/kubernetes"
[ -f "$installed/MANIFEST.json" ] || fail "nothing installed at $installed"
[ ! -L "$installed" ] || fail "$installed is a link, not an installed copy"
export ANSIBLE_COLLECTIONS_PATH="$dest"
# Run from the temporary directory so that nothing next to the source tree (ansible.cfg, collections/) is picked up.
cd "$work"

listed=$(ansible-galaxy collection list confidential.kubernetes --format json)
python - "$listed" "$dest/ansible_collections" <<'PY' || fail "ansible-galaxy does not list the installed copy"
import json, sys
listing, expected = json.loads(sys.argv[1]), sys.argv[2]
assert list(listing) == [expected], listing
assert "confidential.kubernetes" in listing[expected], listing
PY
doc_file=$(ansible-doc --json confidential.kubernetes.tpm_evidence | python -c 'import json,sys; print(json.load(sys.stdin)["confidential.kubernetes.tpm_evidence"]["doc"]["filename"])')
case "$doc_file" in
  "$installed"/*) ;;
  *) fail "ansible-doc resolves confidential.kubernetes.tpm_evidence to $doc_file, not to $installed" ;;
esac
step "confidential.kubernetes resolves to $installed"
