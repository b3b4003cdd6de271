#!/usr/bin/env bash
# The test command: lint, format check, then the default (fast) test suite.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m slow`.
# Two pytest workers (most cases compile on one core), each taking whole files so a module's
# fixtures are built once; the slowest cases are listed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
# The TPU compiler for launch.plan --topology's test, beside the venv rather than in it (a venv
# with libtpu makes every JAX start probe for TPU chips); the pin is setup.py's tpu_plan extra.
if [ ! -d .venv/tpu_plan/libtpu ]; then
  .venv/bin/pip install -q --no-deps --target .venv/tpu_plan "libtpu==0.0.42.*"
fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/python -m pytest -q -n 2 --dist=loadfile --durations=20 -m "not slow" "$@"
