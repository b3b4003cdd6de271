r"""Builds SWE tasks offline from pure-Python packages with their own pytest suites.

    # pinned sdists from PyPI (sha256-checked), see agentrl_jax.envs.swe.build.PINNED_SDISTS
    python -m launch.make_swe_tasks --package=parse --package=cachetools --out=swe_tasks
    # an unpacked package tree
    python -m launch.make_swe_tasks --package_dir=path/to/pkg --out=swe_tasks

Writes ``<out>/tasks.jsonl`` (SWE-Gym schema), the task repositories in ``<out>/repos`` and the
build cache in ``<out>/cache`` (a rerun reuses it). Progress goes to stdout.
"""

import os

from absl import app, flags

from agentrl_jax.envs.swe import build

_PACKAGE = flags.DEFINE_multi_string("package", [], "Pinned sdist name (see PINNED_SDISTS).")
_PACKAGE_DIR = flags.DEFINE_multi_string("package_dir", [], "Unpacked package source tree.")
_OUT = flags.DEFINE_string("out", "swe_tasks", "Output folder.")
_MAX_F2P = flags.DEFINE_integer("max_f2p", 10, "Most FAIL_TO_PASS tests per task.")
_MAX_SUITE_S = flags.DEFINE_float("max_suite_s", 60.0, "Suites must run under this many seconds.")
_MAX_MUTATIONS = flags.DEFINE_integer("max_mutations", 40, "Mutations tried per package.")
_MAX_TASKS = flags.DEFINE_integer("max_tasks", 10, "Tasks kept per package.")
_SEED = flags.DEFINE_integer("seed", 0, "Mutation sampling seed.")
_BACKEND = flags.DEFINE_enum("backend", None, ["bwrap", "unshare"], "Sandbox backend.")
_VALIDATE = flags.DEFINE_bool("validate", True, "Check that each gold patch resolves its task.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    if not _PACKAGE.value and not _PACKAGE_DIR.value:
        raise app.UsageError("give --package=NAME or --package_dir=PATH (repeatable)")
    unknown = [n for n in _PACKAGE.value if n not in build.PINNED_SDISTS]
    if unknown:
        pinned = sorted(build.PINNED_SDISTS)
        raise app.UsageError(f"--package {unknown} not pinned; pinned: {pinned}")
    missing = [d for d in _PACKAGE_DIR.value if not os.path.isdir(d)]
    if missing:
        raise app.UsageError(f"--package_dir {missing}: not a directory")
    config = build.BuildConfig(
        max_f2p=_MAX_F2P.value,
        max_suite_s=_MAX_SUITE_S.value,
        max_mutations=_MAX_MUTATIONS.value,
        max_tasks=_MAX_TASKS.value,
        seed=_SEED.value,
        backend=_BACKEND.value,
        validate=_VALIDATE.value,
    )
    out = os.path.abspath(_OUT.value)
    os.makedirs(out, exist_ok=True)
    sources = [(None, d) for d in _PACKAGE_DIR.value]
    sources += [(n, build.fetch_sdist(n, os.path.join(out, "sdists"))) for n in _PACKAGE.value]
    tasks = []
    for name, src in sources:
        try:
            tasks += build.build_tasks(src, out, name=name, config=config, progress=_print)
        except build.BuildError as e:
            _print(f"skipped: {e}")
    path = os.path.join(out, "tasks.jsonl")
    build.write_tasks(path, tasks)
    _print(f"wrote {len(tasks)} task(s) to {path}")


def _print(line: str) -> None:
    print(line, flush=True)


if __name__ == "__main__":
    app.run(main)
