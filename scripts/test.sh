#!/usr/bin/env bash
# The whole test suite: unit tests (real swtpm), the lab's own test, ansible-doc,
# ansible-lint, ansible-test sanity, the molecule scenarios on the lab, and a lab run of the collection as
# installed from its Galaxy tarball.
# Set SKIP_SANITY=1 or SKIP_MOLECULE=1 to leave a stage out while iterating (with SKIP_MOLECULE=1, pytest and the
# security suites run on their own instead of in the second lab lane).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

# Each stage's time, printed at the end (also when a stage fails: the table then ends with it).
suite_started=$(date +%s)
# The whole suite's targets on a 2-core machine of CI's kind with the caches a machine keeps (apt, pip, the
# Kubernetes build, the lab's base, the VM's guest image): 45 minutes (issue 43's, so that a machine 1.8 times slower
# still finishes inside CI's limit), and CI's own limit, 90 minutes. A fresh machine adds the builds once (target: 70
# minutes).
suite_target=2700
ci_target=5400
stage_names=()
stage_starts=()
stage_cpu=()
# CPU seconds per stage, not only wall time (issue 43): each lane runs in a cgroup of its own in the cpu and cpuacct
# hierarchies (cgroup v1, as on this kind of machine; where they cannot be made the CPU column reads "-"), and so does
# the VM node's stage, whose guest under TCG is the one CPU-bound part of the suite: its cgroup has four times a lane's
# CPU weight and its QEMU runs on the second core only (vm_lab below), so that it is not slowed by sharing the cores
# with lane 1's lab stages (mostly waiting on SSH, the API server and swtpm), while whatever the VM leaves idle still
# goes to them. The lab's nodes, swtpm and qemu stay in the
# cgroup of the stage that started them (nspawn runs with --keep-unit).
cgroups=/sys/fs/cgroup
cgroup_suite=ck-suite-$$
# cgroup_enter NAME [SHARES]: moves this shell, and what it starts from now on, into the suite's cgroup NAME.
cgroup_enter() {
  local name=$1 shares=${2:-1024} hierarchy dir
  for hierarchy in cpu cpuacct; do
    dir=$cgroups/$hierarchy/$cgroup_suite/$name
    { mkdir -p "$dir" && echo "$BASHPID" >"$dir/cgroup.procs"; } 2>/dev/null || return 0
  done
  echo "$shares" >"$cgroups/cpu/$cgroup_suite/$name/cpu.shares" 2>/dev/null || true
}
# cgroup_cpu NAME: the CPU seconds that cgroup NAME's processes used so far, or - where it has no accounting.
cgroup_cpu() {
  local usage
  usage=$(cat "$cgroups/cpuacct/$cgroup_suite/$1/cpuacct.usage" 2>/dev/null) || {
    echo -
    return
  }
  echo "$((usage / 1000000000))"
}
cgroup_remove() {
  local hierarchy dir
  for hierarchy in cpu cpuacct; do
    echo "$BASHPID" >"$cgroups/$hierarchy/cgroup.procs" 2>/dev/null || true
    for dir in "$cgroups/$hierarchy/$cgroup_suite"/*/ "$cgroups/$hierarchy/$cgroup_suite"; do
      [ ! -d "$dir" ] || rmdir "$dir" 2>/dev/null || true
    done
  done
}
# The elapsed time since the suite started, printed at every stage so that a slow machine shows where it is.
elapsed() {
  echo "$(($(date +%s) - suite_started))"
}
stage() {
  stage_names+=("$*")
  stage_starts+=("$(date +%s)")
  stage_cpu+=("$(cgroup_cpu lane1)")
  printf '\n=== [%ss] %s ===\n' "$(elapsed)" "$*"
}
# CPU seconds between two readings of cgroup_cpu, or - where either is missing.
cpu_between() {
  case "$1$2" in *-*) echo - ;; *) echo "$(($2 - $1))" ;; esac
}
# The lanes beside this one (see start_lane below): each one's pid while it runs and its output; their rows of the
# stage times, in one file.
lane_pids=()
lane_logs=()
lane_numbers=()
lane_rows=
# Each lab of the other lanes: its own index and directory, named once for starting its lane and for stopping it.
# Lane 2's fault and hygiene suites.
lane_lab=(CK_LAB_INDEX=2 CK_LAB_DIR=/var/tmp/ck-lane-lab)
# Lane 3's molecule scenarios, one after another, then its pytest (whose two workers use indexes 6 and 7).
molecule_lab=(CK_LAB_INDEX=6 CK_LAB_DIR=/var/tmp/ck-molecule-lab)
# The VM node's lab (index 4), in lane 2 after the fault and hygiene suites. Its QEMU (one vCPU) runs
# on the second core only (CK_LAB_VM_CPUS), where its cgroup's weight (below) puts it ahead of the lanes' processes,
# which the kernel then moves to the first: the guest under TCG, the one CPU-bound part of the suite, keeps a core of
# its own without leaving that core idle while the guest waits.
vm_lab=(CK_LAB_INDEX=4 CK_LAB_DIR=/var/tmp/ck-vm-lab CK_LAB_VM_CPUS=1)
installed_collections=
stage_times() {
  local rc=$? now i next
  now=$(date +%s)
  stop_lanes
  [ -z "$installed_collections" ] || rm -rf "$installed_collections"
  printf '\n=== stage times (exit %s) ===\n' "$rc"
  local cpu_now
  cpu_now=$(cgroup_cpu lane1)
  printf '%7s %8s  %s\n' wall CPU stage
  for i in "${!stage_names[@]}"; do
    next=${stage_starts[$((i + 1))]:-$now}
    printf '%6ss %7ss  %s\n' "$((next - stage_starts[i]))" \
      "$(cpu_between "${stage_cpu[$i]}" "${stage_cpu[$((i + 1))]:-$cpu_now}")" "${stage_names[$i]:0:100}"
  done
  [ -z "$lane_rows" ] || cat "$lane_rows"
  local total=$((now - suite_started)) verdict=met ci_verdict=met
  [ "$total" -le "$suite_target" ] || verdict=MISSED
  [ "$total" -le "$ci_target" ] || ci_verdict=MISSED
  printf '%6ss  total (with the caches a machine keeps: target <= %s s, %s; CI limit %s s, %s)\n' \
    "$total" "$suite_target" "$verdict" "$ci_target" "$ci_verdict"
  [ -z "$lane_rows" ] || rm -f "$lane_rows"
  cgroup_remove
}
# A stage that fails while other lanes still run: stop them (their process groups, then their labs) and show what
# each printed so far.
stop_lanes() {
  local i
  [ "${#lane_pids[@]}" -gt 0 ] || return 0
  for i in "${!lane_pids[@]}"; do
    kill -- "-${lane_pids[$i]}" 2>/dev/null || true
    wait "${lane_pids[$i]}" 2>/dev/null || true
  done
  env "${lane_lab[@]}" tests/lab/lab down >/dev/null 2>&1 || true
  env "${vm_lab[@]}" tests/lab/lab down >/dev/null 2>&1 || true
  env "${molecule_lab[@]}" tests/lab/lab down >/dev/null 2>&1 || true
  for i in "${!lane_pids[@]}"; do
    printf '\n=== lane %s, stopped early: its output so far ===\n' "${lane_numbers[$i]}"
    tail -n 40 "${lane_logs[$i]}" || true
    rm -f "${lane_logs[$i]}"
  done
  lane_pids=()
}
# start_lane NUMBER FUNCTION ENV...: runs FUNCTION (below) as lane NUMBER, in the background, in a session of its own
# (setsid: a failure elsewhere stops it and every process it started) and a cgroup of its own, with the variables ENV
# (its lab). Its output is printed when it ends; its steps' times are rows of their own.
start_lane() {
  local number=$1 function=$2 log
  shift 2
  log=$(mktemp "/tmp/ck-lane$number-output.XXXXXX")
  env "$@" LANE="$number" LANE_ROWS="$lane_rows" PYTEST_STAGE="$PYTEST_STAGE" VM_GUEST_STAGE="$VM_GUEST_STAGE" \
    VM_STAGE="$VM_STAGE" setsid bash -c "$(declare -p vm_lab cgroups cgroup_suite suite_started); $(declare -f \
      lab_lane molecule_lane lane_step run_pytest vm_node_guest vm_node_scenario cgroup_enter cgroup_cpu \
      cpu_between); cgroup_enter lane$number; $function" 3>&1 >"$log" 2>&1 &
  lane_pids+=("$!")
  lane_logs+=("$log")
  lane_numbers+=("$number")
  printf '\n=== lane %s (pid %s) started: %s ===\n' "$number" "$!" "$function"
}
# wait_lanes: waits for every lane still running, prints its output, and fails with the first that failed.
wait_lanes() {
  local i rc failed=0
  for i in "${!lane_pids[@]}"; do
    rc=0
    wait "${lane_pids[$i]}" || rc=$?
    printf '\n=== lane %s: its output (exit %s) ===\n' "${lane_numbers[$i]}" "$rc"
    cat "${lane_logs[$i]}"
    rm -f "${lane_logs[$i]}"
    [ "$rc" = 0 ] || [ "$failed" != 0 ] || failed=$rc
  done
  lane_pids=()
  [ "$failed" = 0 ] || {
    echo "a lane failed (exit $failed): its output is above" >&2
    exit "$failed"
  }
}
# The unit tests and the security suites: in the second lane beside the lab stages, or on their own with
# SKIP_MOLECULE=1. Two pytest workers (pytest-xdist): most tests wait on processes (ansible-playbook, helm, the API
# server, swtpm) about half of the time; each worker has its own real control plane and its own lab index
# (CK_LAB_INDEX + worker number). A module's tests stay on one worker (--dist loadscope), so that a module's lab or
# control plane (a module-scoped fixture) is set up once, not once on each worker that draws one of its tests.
run_pytest() {
  python -m pytest -p no:cacheprovider -q -n 2 --dist loadscope --durations=15 tests/unit tests/faults/test_faults.py
}
PYTEST_STAGE="pytest: unit tests on real swtpm, the real API server, helm and kubeadm, and the lab tool"
# The VM node (issue 28): a QEMU guest (UEFI measured boot, a TPM device, a dm-crypt state disk) joins a real control
# plane through site.yml, runs pods (logs, exec), re-runs with changed=0, survives a real reboot and is refused on
# another kernel command line. Its guest image is built once per machine (minutes on a fresh one), in its own row.
vm_node_guest() {
  env "${vm_lab[@]}" tests/lab/lab guest
}
vm_node_scenario() {
  env "${vm_lab[@]}" CK_LAB_VM_TEST=1 python -m pytest -p no:cacheprovider -q --durations=8 tests/unit/lab/test_vm_join.py
}
VM_GUEST_STAGE="the VM node's guest image (built once per machine, verified by sha256 before use; tests/lab/lab guest)"
VM_STAGE="the VM node: join through site.yml, pods, logs and exec, re-run, real reboot, tamper (tests/unit/lab/test_vm_join.py)"
# One step of a lane (LANE): runs the rest of its arguments and appends its time and exit status to LANE_ROWS.
# Its start is also printed to the suite's own output (descriptor 3) with the suite's elapsed time. A step given as
# "--cgroup NAME SHARES" first runs in a cgroup of its own with that CPU weight (the VM node's).
lane_step() {
  local name=$1 started rc=0 group=lane$LANE cpu_before
  shift
  if [ "$1" = --cgroup ]; then
    group=$2
    cgroup_enter "$group" "$3"
    shift 3
  fi
  started=$(date +%s)
  cpu_before=$(cgroup_cpu "$group")
  local banner
  banner=$(printf '=== [%ss] lane %s: %s ===' "$((started - suite_started))" "$LANE" "$name")
  printf '\n%s\n' "$banner"
  { printf '\n%s\n' "$banner" >&3; } 2>/dev/null || true
  "$@" || rc=$?
  printf '%6ss %7ss  %s, exit %s\n' "$(($(date +%s) - started))" "$(cpu_between "$cpu_before" "$(cgroup_cpu "$group")")" \
    "(lane $LANE) $name" "$rc" >>"${LANE_ROWS:?}"
  [ "$group" = "lane$LANE" ] || cgroup_enter "lane$LANE"
  return "$rc"
}
# The second lab lane, on a lab of its own (index 2): the fault and hygiene suites, then on the VM node's lab (index 4)
# its guest image and scenario. It stops at the first step that fails. (The Kubernetes upgrade on 1 control plane + 2 workers - the API gap of a single API server - runs with
# `tests/drills/run --control-planes 1 --workers 2 upgrade` and bench/day2.py; the drills' 3 + 2 lab upgrades the HA
# shape in CI.)
lab_lane() {
  set -uo pipefail
  lane_step "fault (kill -9) and secret hygiene suites (tests/faults/run, CI subset)" tests/faults/run || return
  lane_step "$VM_GUEST_STAGE" vm_node_guest || return
  lane_step "$VM_STAGE" --cgroup vm 4096 vm_node_scenario
}
# The third lane, on a lab of its own (index 6): every molecule scenario, one after another (each brings up the lab
# it needs and tears it down), then pytest (its workers use lab indexes 6 and 7). It starts after the static checks,
# whose ansible-lint must not see the copy of the collection molecule installs.
molecule_lane() {
  set -uo pipefail
  local scenario
  for scenario in extensions/molecule/*/; do
    lane_step "molecule test -s $(basename "$scenario") (lab scenario)" molecule test -s "$(basename "$scenario")" || return
  done
  lane_step "$PYTEST_STAGE" run_pytest
}
trap stage_times EXIT
cgroup_enter lane1

stage "set-up: Debian packages and the project venv (scripts/setup.sh)"
bash scripts/setup.sh
export PATH="$repo/.venv/bin:$PATH"
export ANSIBLE_COLLECTIONS_PATH="$repo/.venv/collections"
bash scripts/link-collection.sh


stage "real Kubernetes v1.20.2 for the lab and the tests (built once per machine, verified by sha256 before use)"
tests/lab/lab kubernetes
# Tests that need the real control plane fail, rather than skip, when it is missing.
export CK_REQUIRE_KUBERNETES=1

# molecule installs the collection into ~/.ansible/collections; a copy left by an
# earlier run would shadow the tree under test for ansible-lint and molecule.
rm -rf "$HOME/.ansible/collections/ansible_collections/confidential/kubernetes"

if [ "${SKIP_MOLECULE:-0}" != 1 ]; then
  # Beside the static checks and the lab stages of the default lab (the drills, the security suites, the load suite),
  # a second lane (lab_lane above) runs the fault and hygiene suites on lab 2, then the VM node on lab 4; it starts as
  # soon as the Kubernetes build is there. A third (molecule_lane) runs the molecule scenarios on lab 6 once the static
  # checks are done, then pytest. A lab stage keeps less than a core busy, mostly waiting on SSH, the API server and
  # swtpm; the lanes share the two cores (the VM's QEMU keeps the second for itself while it runs).
  lane_rows=$(mktemp /tmp/ck-lane-rows.XXXXXX)
  start_lane 2 lab_lane "${lane_lab[@]}"
fi

stage "ansible-doc renders every module"
for module in plugins/modules/*.py; do
  name=$(basename "$module" .py)
  ansible-doc "confidential.kubernetes.$name" >/dev/null
  echo "ok: confidential.kubernetes.$name"
done

stage "generated gRPC code matches joinservice.proto"
bash scripts/gen-proto.sh --check

stage "generated docs match their sources (versions table, argument specs)"
python scripts/gen-docs-versions.py --check
python scripts/variables-page.py --check

stage "ruff: Python formatted (ruff format --check) and linted (ruff check)"
ruff format --check --quiet .
ruff check --quiet .

stage "ansible-lint (production profile)"
ansible-lint --profile production --offline -q roles playbooks extensions/molecule

if [ "${SKIP_SANITY:-0}" != 1 ]; then
  stage "ansible-test sanity"
  bash scripts/sanity.sh
fi

if [ "${SKIP_MOLECULE:-0}" != 1 ]; then
  stage "the collection as installed from its Galaxy tarball: build, contents, install (scripts/installed-collection.sh)"
  installed_collections=$(mktemp -d /tmp/ck-installed-collection.XXXXXX)
  bash scripts/installed-collection.sh "$installed_collections"

  start_lane 3 molecule_lane "${molecule_lab[@]}"

  stage "quick start and day-2 drills on one 3 + 2 lab, from the installed collection (tests/drills/run)"
  ANSIBLE_COLLECTIONS_PATH="$installed_collections" tests/drills/run
else
  stage "$PYTEST_STAGE"
  run_pytest
fi

stage "security suites: fuzzing (atheris), protocol attacks, the init/join race (tests/security)"
tests/security/run

stage "load: 2000 joins by 64 clients with a service restart and a policy change (tests/load)"
python tests/load/join_load.py

if [ "${#lane_pids[@]}" -gt 0 ]; then
  stage "waiting for lanes 2 (fault and hygiene suites, the VM node) and 3 (molecule, pytest) (rows below)"
  wait_lanes
fi
