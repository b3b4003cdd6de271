#!/usr/bin/env bash
# The accelerator check: one command from a bare device machine to results.
#
#   bash scripts/device_check.sh             # on the device image (python3 with jax[cuda], flax)
#   bash scripts/device_check.sh --dry-run   # the same steps, shrunk (--quick), on this CPU venv
#
# It installs only what the image lacks, from wheels carried beside the checkout in .whl/
# (scripts/device_wheels.sh downloads them; sdists there are built on the machine), into a
# fresh folder on PYTHONPATH; the package itself runs from the checkout. Then, each step with a
# time limit, so steps 1-4 fit 8 minutes on one H200 and step 5 at most 6 more:
#   1. versions.json   the Python, jax, flax, torch, transformers it ran with;
#   2. iteration.json  `launch.bench iteration --model=qwen2.5-0.5b`: whole RL iterations on
#                      TextWorld, phase by phase, cold and warm compilation cache;
#   3. parity.json     `launch.bench parity`: our bf16 logits and transformers' against f32;
#   4. device.json     `launch.bench device --model=qwen2.5-1.5b`: the sampler (with its
#                      roofline fraction) against transformers' generate, the RL update (MFU);
#                      profile.tar.gz: jax.profiler traces of one sampler run and one update;
#   5. families.json   steps 3 and 4 on each other family's smallest preset (qwen3-0.6b,
#                      llama3.2-1b, gemma3-1b; FAMILIES="..." names others, FAMILIES="" skips
#                      them): the parity bar per family and its sampler's and update's speed,
#                      each report under "parity/<preset>" and "device/<preset>" (one file: 8
#                      come back from a device). Not in --dry-run (the quick forms are the same
#                      code on the CPU).
# Every step's JSON and the whole log (device_check.log) go to $OUT (default runs/device_check),
# with summary.json (each step's exit code and seconds). It exits non-zero if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."

dry_run=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) dry_run=1 ;;
    *) echo "usage: bash scripts/device_check.sh [--dry-run]" >&2; exit 2 ;;
  esac
done
out=${OUT:-runs/device_check}
mkdir -p "$out"
out=$(cd "$out" && pwd)
log="$out/device_check.log"
: >"$log"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if [ "$dry_run" = 1 ]; then
  py=${PYTHON:-.venv/bin/python}
  quick=(--quick)
  model=()
  device_model=()
  limits=(600 300 300)  # the CPU compiles slower; the test suite's run is bounded by pytest
  families=()
else
  py=${PYTHON:-python3}
  quick=()
  model=(--model=qwen2.5-0.5b)
  device_model=(--model=qwen2.5-1.5b)  # the 1.5B sampler's roofline and update MFU
  limits=(270 60 140)
  read -r -a families <<<"${FAMILIES-qwen3-0.6b llama3.2-1b gemma3-1b}"
  site=/tmp/agentrl_site
  rm -rf "$site"  # a warm machine keeps the last run's files
  shopt -s nullglob
  wheels=(.whl/*.whl)
  sdists=(.whl/*.tar.gz)
  if [ ${#wheels[@]} -gt 0 ]; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
      "${wheels[@]}" 2>&1 | tee -a "$log" || exit 1
  fi
  for sdist in "${sdists[@]}"; do  # jericho, fast-downward-textworld: sdists, built here
    PYTHONPATH="$site" "$py" -m pip install -q --no-index --no-deps --no-build-isolation \
      --target "$site" "$sdist" 2>&1 | tee -a "$log" || exit 1
  done
  export PYTHONPATH="$PYTHONPATH:$site"
  export AGENTRL_CACHE=${AGENTRL_CACHE:-/tmp/agentrl_cache}
fi

summary="$out/summary.json"
echo "{" >"$summary"
failed=0
step() {  # step NAME LIMIT_S COMMAND...: runs it, logs it, records its exit code and seconds
  local name=$1 limit=$2
  shift 2
  echo "== $name: $* (limit ${limit}s)" | tee -a "$log"
  local t0=$SECONDS
  timeout "$limit" "$@" 2>&1 | tee -a "$log"
  local rc=${PIPESTATUS[0]}
  echo "== $name: exit $rc in $((SECONDS - t0)) s" | tee -a "$log"
  [ "$rc" = 0 ] || failed=1
  printf '  "%s": {"rc": %d, "seconds": %d},\n' "$name" "$rc" "$((SECONDS - t0))" >>"$summary"
}

step versions 60 "$py" -c "
import json, platform, sys
import flax, jax
versions = {'python': platform.python_version(), 'jax': jax.__version__,
            'flax': flax.__version__, 'backend': jax.default_backend(),
            'devices': [d.device_kind for d in jax.devices()]}
for name in ('torch', 'transformers', 'optax', 'orbax.checkpoint', 'grain', 'textworld'):
    try:
        versions[name] = __import__(name, fromlist=['_']).__version__
    except Exception as e:  # noqa: BLE001 - reported, not fatal here
        versions[name] = f'missing: {e}'
json.dump(versions, open('$out/versions.json', 'w'), indent=2)
print(json.dumps(versions))
"
step iteration "${limits[0]}" "$py" -m launch.bench iteration "${quick[@]}" "${model[@]}" \
  --out "$out/iteration.json"
step parity "${limits[1]}" "$py" -m launch.bench parity "${quick[@]}" --out "$out/parity.json"
export AGENTRL_PROFILE_DIR="$out/profile"  # jax.profiler traces of a sampler run and an update
step device "${limits[2]}" "$py" -m launch.bench device "${quick[@]}" "${device_model[@]}" \
  --out "$out/device.json"
for m in "${families[@]}"; do  # each family's parity bar and speed (issue #42)
  mkdir -p "$out/families"
  step "parity_$m" 45 "$py" -m launch.bench parity --model="$m" --out "$out/families/parity_$m"
  step "device_$m" 75 env -u AGENTRL_PROFILE_DIR "$py" -m launch.bench device --model="$m" \
    --out "$out/families/device_$m"  # no profile: the packed traces stay one preset's
done
if [ -d "$out/families" ]; then  # one file: {"parity/<preset>": report, "device/<preset>": ...}
  "$py" -c "
import json, pathlib, sys
folder = pathlib.Path(sys.argv[1])
reports = [p for p in sorted(folder.iterdir()) if not p.name.endswith('.tmp')]
merged = {p.name.replace('_', '/', 1): json.loads(p.read_text()) for p in reports}
(folder.parent / 'families.json').write_text(json.dumps(merged, indent=2))
" "$out/families" && rm -rf "$out/families"
fi
if [ -d "$out/profile" ]; then  # one file comes back from a device ($OUT: 8 files, 16 MiB each)
  tar -czf "$out/profile.tar.gz" -C "$out" profile && rm -rf "$out/profile"
  du -h "$out/profile.tar.gz" | tee -a "$log"
fi
printf '  "failed": %d\n}\n' "$failed" >>"$summary"
echo "device_check: results in $out (failed: $failed)" | tee -a "$log"
exit "$failed"
