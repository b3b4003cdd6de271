#!/usr/bin/env bash
# Downloads, into .whl/ (git-ignored), the Python 3.12 wheels that the device image lacks, at the
# versions this project pins, for scripts/device_check.sh to install there (nothing can be
# downloaded on that machine). Run it here, from a checkout with .venv set up:
#
#   bash scripts/device_wheels.sh && du -sh .whl    # the device's carry limit is 64 MiB
#
# The image (Python 3.12, jax 0.11 with CUDA, its own flax 0.12.10, torch, tokenizers, numpy,
# networkx, etils, tensorstore, ...) lacks grain and its array-record and portpicker,
# ml-collections, and TextWorld with its engine's packages; optax, orbax-checkpoint, chex and
# transformers are carried at our pins. jericho and fast-downward-textworld have only sdists:
# they are downloaded as such and built on the machine (gcc, make). Its flax is never replaced: 0.12.8, our pin,
# does not import on jax 0.11.
set -euo pipefail
cd "$(dirname "$0")/.."
PACKAGES=(
  grain array-record portpicker ml-collections
  textworld tatsu hashids mementos termcolor prompt-toolkit wcwidth more-itertools
  optax orbax-checkpoint chex transformers
)
pin() {  # the version installed in .venv (the project's pins and their resolved needs)
  .venv/bin/pip show "$1" 2>/dev/null | awk '/^Version:/ {print $2}'
}
rm -rf .whl
mkdir -p .whl
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
  manylinux1_x86_64 manylinux_2_24_x86_64 manylinux_2_31_x86_64; do
  platforms+=(--platform "$p")
done
specs=()
for name in "${PACKAGES[@]}"; do
  version=$(pin "$name")
  [ -n "$version" ] || { echo "device_wheels: $name is not installed in .venv" >&2; exit 1; }
  specs+=("$name==$version")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${platforms[@]}" -d .whl "${specs[@]}"
for name in jericho fast-downward-textworld; do  # sdists only: built on the machine
  # --no-binary names the package alone: ':all:' would build its build needs (cmake) from source
  python3 -m pip download -q --no-deps --no-binary="$name" -d .whl "$name==$(pin "$name")"
done
du -sh .whl
