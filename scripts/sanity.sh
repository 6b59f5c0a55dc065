#!/usr/bin/env bash
# ansible-test needs the collection under ansible_collections/<ns>/<name>: test a copy of the tracked files.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
dest="$work/ansible_collections/confidential/kubernetes"
mkdir -p "$dest"
git -C "$repo" ls-files -co --exclude-standard -z | (cd "$repo" && xargs -0 cp --parents -t "$dest")
cd "$dest"
git init -q && git add -A && git -c user.email=ci@localhost -c user.name=ci commit -qm sanity
# ansible-test pins its own linters: keep them in a venv of their own. (--venv would
# download pip from a host that is not a package registry, so use --local there.)
venv="$repo/.venv-sanity"
[ -x "$venv/bin/ansible-test" ] || { python3 -m venv "$venv" && "$venv/bin/pip" install -q "$(grep -E '^ansible-core' "$repo/requirements.txt")"; }
# Each sanity test gets a venv that ansible-test seeds with a get-pip script from a host
# outside the package registries; seed it with a stand-in that uses ensurepip and PyPI.
pip_version=$("$venv/bin/python" - <<'PY'
import inspect, re
from ansible_test._internal import python_requirements
print(re.search(r"pip='([0-9.]+)'", inspect.getsource(python_requirements.get_venv_packages)).group(1))
PY
)
cache="$HOME/.ansible/test/cache/get_pip_${pip_version//./_}.py"
mkdir -p "$(dirname "$cache")"
cat > "$cache" <<'PY'
"""Stand-in for get-pip.py: bootstrap the bundled pip, then pip-install what was asked for."""
import ensurepip
import os
import subprocess
import sys
import sysconfig

# ansible-test runs pip with a scrubbed environment, which loses this host's CA
# bundle; every python of this venv gets it back through sitecustomize.
bundle = "/etc/ssl/certs/ca-certificates.crt"
if os.path.exists(bundle):
    with open(os.path.join(sysconfig.get_paths()["purelib"], "sitecustomize.py"), "w") as hook:
        hook.write(f"import os\nos.environ.setdefault('PIP_CERT', {bundle!r})\nos.environ.setdefault('SSL_CERT_FILE', {bundle!r})\n")
    os.environ.setdefault("PIP_CERT", bundle)
    os.environ.setdefault("SSL_CERT_FILE", bundle)
ensurepip.bootstrap(upgrade=True)
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
sys.exit(subprocess.call([sys.executable, "-m", "pip", "install"] + args))
PY
"$venv/bin/ansible-test" sanity --local --requirements --python 3.11 --color no "$@"
