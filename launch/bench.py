r"""Benchmarks, measured side by side against a reference in the same run.

    python -m launch.bench sampler --out bench_sampler.json
    python -m launch.bench learner --out bench_learner.json
    python -m launch.bench advantages --out bench_advantages.json
    python -m launch.bench envs --out bench_envs.json
    python -m launch.bench swe --out bench_swe.json
    python -m launch.bench sft_data --out bench_sft_data.json
    python -m launch.bench device --out device.json   # on an accelerator (Qwen2.5 shapes, MFU)

Each prints a table and writes JSON with, per workload, ``ours``, ``reference``, ``ratio`` and
``unit``. ``--quick`` shrinks every workload (used by the tests to check the plumbing).
"""

import importlib

from absl import app, flags

BENCHMARKS = ("sampler", "learner", "advantages", "envs", "swe", "sft_data", "device")

_OUT = flags.DEFINE_string("out", None, "Where to write the JSON report.")
_QUICK = flags.DEFINE_bool("quick", False, "Shrink every workload (plumbing check only).")


def main(argv):
    if len(argv) != 2 or argv[1] not in BENCHMARKS:
        raise app.UsageError(f"usage: python -m launch.bench {{{'|'.join(BENCHMARKS)}}} --out FILE")
    module = importlib.import_module(f"agentrl_jax.benchmarks.{argv[1]}")
    report = module.run(quick=_QUICK.value)
    print(report.table())
    if _OUT.value:
        report.write(_OUT.value)
        print(f"wrote {_OUT.value}")


if __name__ == "__main__":
    app.run(main)
