#!/usr/bin/env bash
# The collection as users get it: build the tarball with ansible-galaxy, check what it holds, install it into a
# temporary collections path, check that confidential.kubernetes resolves to that installed copy, and run the
# default bring-up on a 1 control plane + 1 worker lab from it - site.yml, again with changed=0, then verify.yml.
# The lab itself (tests/lab) runs from the source tree; every playbook, role and plugin comes from the install.
# Honours CK_LAB_INDEX / CK_LAB_DIR like the lab. Run as root.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
export PATH="$repo/.venv/bin:$PATH"
lab="$repo/tests/lab/lab"
work=$(mktemp -d)
lab_started=0
cleanup() {
  if [ "$lab_started" = 1 ]; then "$lab" down >/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "installed-collection: $*" >&2; exit 1; }
step() { printf 'installed-collection: %s\n' "$*"; }

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
ansible-galaxy collection install --offline --force -p "$work/collections" "$tarball" > "$work/install.log" 2>&1 \
  || { cat "$work/install.log" >&2; fail "ansible-galaxy collection install failed"; }
installed="$work/collections/ansible_collections/confidential/kubernetes"
[ -f "$installed/MANIFEST.json" ] || fail "nothing installed at $installed"
[ ! -L "$installed" ] || fail "$installed is a link, not an installed copy"
export ANSIBLE_COLLECTIONS_PATH="$work/collections"
# Run from the temporary directory so that nothing next to the source tree (ansible.cfg, collections/) is picked up.
cd "$work"

listed=$(ansible-galaxy collection list confidential.kubernetes --format json)
python - "$listed" "$work/collections/ansible_collections" <<'PY' || fail "ansible-galaxy does not list the installed copy"
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

step "lab: 1 control plane + 1 worker"
lab_started=1
inventory=$("$lab" up --control-planes=1 --workers=1 | tail -n 1)

run() {
  local name=$1
  shift
  ANSIBLE_STDOUT_CALLBACK=ansible.builtin.default ANSIBLE_FORCE_COLOR=0 \
    ansible-playbook --inventory="$inventory" "$@" > "$work/$name.log" 2>&1 || { tail -n 40 "$work/$name.log" >&2; fail "$name failed"; }
}

step "site.yml from the installed collection"
start=$SECONDS
# -vv prints every task's path: each must lie in the installed copy, none in the source tree.
run site confidential.kubernetes.site -vv
grep -o 'task path: [^:]*' "$work/site.log" | cut -d' ' -f3 | sort -u > "$work/task-files"
grep -q "^$installed/roles/init/tasks/main.yml$" "$work/task-files" || fail "site.yml did not run the installed init role"
if grep -v "^$installed/" "$work/task-files"; then fail "site.yml ran tasks from outside the installed collection"; fi
step "site.yml took $((SECONDS - start)) s; its tasks came from $(wc -l < "$work/task-files") files, all in the installed copy"

step "site.yml again: nothing may change"
start=$SECONDS
run site-again confidential.kubernetes.site
if grep -E '^[^ ]+ +: ok=[0-9]+ +changed=[1-9]' "$work/site-again.log"; then
  fail "the second run of site.yml changed something"
fi
step "site.yml again took $((SECONDS - start)) s, changed=0"

step "verify.yml"
run verify confidential.kubernetes.verify
grep -E '^ *"(cp|worker)-0 ' "$work/verify.log" | sed 's/^ *"//; s/",\{0,1\}$//'
[ "$(grep -cE '^ *"(cp-0 +control-plane|worker-0 +worker) +ok +cluster mark ' "$work/verify.log")" = 2 ] || fail "verify.yml did not pass both nodes"
step "ok"
