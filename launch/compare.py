r"""Are two runs the same run? Exit status 0 when they are, bit for bit; 1 when not.

    python -m launch.compare runs/before runs/after
    python -m launch.compare runs/before runs/after --out same.json

Compares every TensorBoard scalar but the wall-clock ones, the newest checkpoint's whole train
state (every array, byte for byte) and the reports (``eval/*.json``, ``report.json``) of two
``launch.train`` workdirs (``agentrl_jax/experiments/compare.py``). On the CPU a run is
deterministic given its config, so this is how a change that claims to move code without changing
behaviour is checked: the same config at the two commits, then this.
"""

import json
import sys

from absl import app, flags, logging

from launch import cli

_OUT = flags.DEFINE_string("out", None, "Where to write the comparison as JSON.")
# Differences listed per kind on the console (the JSON has them all).
_SHOWN = 10


def main(argv):
    if len(argv) != 3:
        cli.fail("usage: python -m launch.compare WORKDIR_A WORKDIR_B [--out FILE]")
    from agentrl_jax.experiments.compare import compare  # noqa: PLC0415 (after flag parsing)

    logging.set_verbosity(logging.ERROR)  # orbax's INFO lines per restored checkpoint

    try:
        result = compare(argv[1], argv[2])
    except FileNotFoundError as e:
        cli.fail(str(e))
    if _OUT.value:
        with open(_OUT.value, "w") as f:
            json.dump(result.to_json(), f, indent=2)
            f.write("\n")
    counts = result.counts
    print(
        f"compared {counts['scalars']} scalars, {counts['arrays']} arrays "
        f"({counts['parameters']:,} numbers) of checkpoints {result.checkpoint_steps}, "
        f"{counts['reports']} reports"
    )
    for kind in (
        "scalars_only_in_a",
        "scalars_only_in_b",
        "scalars_differ",
        "arrays_differ",
        "reports_differ",
    ):
        items = getattr(result, kind)
        if items:
            more = f" (and {len(items) - _SHOWN} more)" if len(items) > _SHOWN else ""
            print(f"{kind.replace('_', ' ')}: {len(items)}{more}")
            for item in items[:_SHOWN]:
                print(f"  {item}")
    print("the same run" if result.same else "different runs")
    sys.exit(0 if result.same else 1)


if __name__ == "__main__":
    app.run(main, flags_parser=cli.parse_flags)
