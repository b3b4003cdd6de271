#!/usr/bin/env bash
# One-time setup from a fresh clone: system packages the project names, a virtualenv in .venv,
# and the package with its test extra. Safe to rerun: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages: bubblewrap (the SWE sandbox). Installed when we are root and it is missing;
# the sandbox falls back to unshare/setpriv when it cannot be had.
APT_PACKAGES=(bubblewrap)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "setup: installing ${missing[*]} with apt-get"
  apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.agentrl_jax_installed
if [ ! -f "$stamp" ] || [ setup.py -nt "$stamp" ]; then
  .venv/bin/pip install -q -e '.[test]'
  touch "$stamp"
fi
echo "setup: ready (.venv)"
