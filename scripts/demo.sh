#!/usr/bin/env bash
# The main job on the local lab: set this machine up, boot one control plane and
# two workers (each with its own swtpm), and run the site playbook against them.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bash "$repo/scripts/setup.sh"
export PATH="$repo/.venv/bin:$PATH"
export ANSIBLE_COLLECTIONS_PATH="$repo/.venv/collections"
bash "$repo/scripts/link-collection.sh"
lab_dir=${CK_LAB_DIR:-/var/tmp/confidential-kubernetes-lab}

"$repo/tests/lab/lab" up --control-planes "${CONTROL_PLANES:-1}" --workers "${WORKERS:-2}"
ansible-playbook -i "$lab_dir/inventory.yml" confidential.kubernetes.site "$@"

# What the real API server on cp-0 says: the nodes (their kubelet is the lab's stand-in) and the pods, of which only
# the control plane's static pods run (as processes); the others stay Pending, since no container runs in the lab.
"$repo/tests/lab/lab" ssh cp-0 kubectl --kubeconfig=/etc/kubernetes/admin.conf get nodes -o wide
"$repo/tests/lab/lab" ssh cp-0 kubectl --kubeconfig=/etc/kubernetes/admin.conf get pods -A

cat <<EOT

The lab is up.
  inventory:  $lab_dir/inventory.yml
  policy:     $lab_dir/measurement-policy.yml
  a node:     $repo/tests/lab/lab ssh cp-0
  re-attest:  ANSIBLE_COLLECTIONS_PATH=$ANSIBLE_COLLECTIONS_PATH $repo/.venv/bin/ansible-playbook -i $lab_dir/inventory.yml confidential.kubernetes.verify
  tear down:  $repo/tests/lab/lab down
EOT
