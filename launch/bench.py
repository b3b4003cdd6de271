r"""Benchmarks, measured side by side against a reference in the same run.

    python -m launch.bench sampler --out bench_sampler.json
    python -m launch.bench learner --out bench_learner.json
    python -m launch.bench advantages --out bench_advantages.json
    python -m launch.bench envs --out bench_envs.json  # TextWorld; ALFWorld too when installed
    python -m launch.bench swe --out bench_swe.json
    python -m launch.bench sft_data --out bench_sft_data.json
    python -m launch.bench device --out device.json   # on an accelerator (Qwen2.5 shapes, MFU)
    python -m launch.bench iteration --out iteration.json  # whole RL iterations, phase by phase
    python -m launch.bench iteration --model=qwen2.5-0.5b --out iteration.json  # accelerator
    python -m launch.bench iteration --config=configs/alfworld_tiny.py --out iteration.json
    python -m launch.bench parity --out parity.json   # bf16 logits vs transformers, vs f32
    python -m launch.bench rollout --out rollout.json # slow envs: continuous batching vs waves

Each prints a table and writes JSON with, per workload, ``ours``, ``reference``, ``ratio`` and
``unit``. ``--quick`` shrinks every workload (used by the tests to check the plumbing).
"""

import importlib

from absl import app, flags

from agentrl_jax import compile_cache
from agentrl_jax.benchmarks.iteration import setting as iteration_setting

BENCHMARKS = (
    "sampler",
    "learner",
    "advantages",
    "envs",
    "swe",
    "sft_data",
    "device",
    "iteration",
    "parity",
    "rollout",
)

_OUT = flags.DEFINE_string("out", None, "Where to write the JSON report.")
_QUICK = flags.DEFINE_bool("quick", False, "Shrink every workload (plumbing check only).")
_MODEL = flags.DEFINE_string(
    "model",
    None,
    "iteration, device, parity: the model preset (random weights), e.g. qwen2.5-1.5b or qwen3-8b.",
)
_CONFIG = flags.DEFINE_string(
    "config", None, "iteration: the config file (path[:arg]) to run, default the built-in default."
)
_SET = flags.DEFINE_multi_string(
    "set", [], "iteration: section.field=value (a Python literal) set on the config, repeatable."
)
_COMPILE_CACHE = flags.DEFINE_string(
    "compile_cache", "", "JAX's persistent compilation cache: a folder, '' (default) or 'off'."
)


def main(argv):
    if len(argv) != 2 or argv[1] not in BENCHMARKS:
        raise app.UsageError(f"usage: python -m launch.bench {{{'|'.join(BENCHMARKS)}}} --out FILE")
    compile_cache.enable(_COMPILE_CACHE.value)
    module = importlib.import_module(f"agentrl_jax.benchmarks.{argv[1]}")
    options = {}
    if _MODEL.value:
        if argv[1] not in ("iteration", "device", "parity"):
            raise app.UsageError(
                "--model is an option of the iteration, device and parity benchmarks"
            )
        options["model"] = _MODEL.value
    if _CONFIG.value or _SET.value:
        if argv[1] != "iteration":
            raise app.UsageError("--config and --set are options of the iteration benchmark")
        if _CONFIG.value:
            options["config"] = _CONFIG.value
        try:
            options["overrides"] = tuple(iteration_setting(s) for s in _SET.value)
        except ValueError as e:
            raise app.UsageError(str(e)) from e
    report = module.run(quick=_QUICK.value, **options)
    print(report.table())
    if _OUT.value:
        report.write(_OUT.value)
        print(f"wrote {_OUT.value}")


if __name__ == "__main__":
    app.run(main)
