r"""Whole RL iterations of a real config, end to end: where the wall time goes, and compilation.

    python -m launch.bench iteration --out iteration.json                       # the tiny default
    python -m launch.bench iteration --model=qwen2.5-0.5b --out iteration.json  # an accelerator
    python -m launch.bench iteration --config=configs/alfworld_tiny.py --out iteration.json
    python -m launch.bench iteration --config=configs/alfworld_tiny.py \
        --set=rollout.show_admissible=True --out iteration.json   # one setting changed

The run is ``launch.train``'s: ``Trainer.run`` on the built-in default's TextWorld games
(``configs/tiny_textworld.py``: simple games, 16 tasks x 4 episodes an iteration in episode
contexts, constrained decoding, GRPO, two epochs; ``--config`` another config's, on 64 of its
train tasks, evaluating on 16 of its first held-out level's), its SFT budget set to 0 so that the RL
iterations start at once from the untrained policy (whose episodes, mostly failures, run to the
turn limit: the costliest). ``ITERATIONS`` iterations, a checkpoint every second one and after the
last, which also evaluates on the valid games.

- ``--model=tiny`` (the default): the default's own tiny policy and tokenizer, on the CPU.
- ``--model=qwen2.5-0.5b`` / ``qwen2.5-1.5b`` / ``qwen3-0.6b`` / ``qwen3-1.7b`` /
  ``llama3.2-1b`` / ``gemma3-1b`` (``MODELS``): a checkpoint directory of that shape and family
  with random weights, written once by ``save_hf_checkpoint`` in bfloat16, with a byte-level BPE
  tokenizer trained here on the games' text (Qwen's special tokens, ChatML, whatever the family):
  nothing is downloaded. The run loads it as a user's checkpoint (``model.checkpoint``), computes
  in bfloat16 with scanned, rematerialised layers, microbatches of 8, and the checkpoint's own
  (ChatML) chat template.
- ``--quick``: the ``:test`` config, 3 iterations, a 1-layer checkpoint of the tiny preset: the
  plumbing, in the test suite.

The run happens twice, each in a process of its own sharing one fresh compilation cache
(``agentrl_jax/compile_cache.py``): the cold process compiles every program and the warm one
loads them. Workloads:

- ``iteration_seconds``: ``ours`` is the warm process's median wall seconds of an iteration, the
  first iteration left out (it compiles). Extra fields: ``phases_s`` (each phase's seconds per
  iteration, the mean over the same iterations, so checkpoints and the evaluation count at their
  share), ``phase_coverage`` (the phases' sum over the wall time), ``device_busy_fraction``
  (device programs' seconds over the wall time, ``agentrl_jax/timing.py``), the rollout and
  update tokens/s, the sampler/learner log-prob mismatch, the compilations, the peak device
  memory and every iteration's breakdown. No reference: the phases are the measurement.
- ``compile_seconds``: XLA compilation seconds of a whole process (compiling, or loading from the
  cache). ``ours`` is the warm process's, ``reference`` the cold one's; the ratio is cold over
  warm. Tracing and lowering run in both and are not counted.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from agentrl_jax.benchmarks.report import Report, Row

ITERATIONS = 5
QUICK_ITERATIONS = 3
CONFIG = "configs/tiny_textworld.py"
# The presets a single accelerator runs whole iterations of (issue #42: each family's small ones).
MODELS = (
    "tiny",
    "qwen2.5-0.5b",
    "qwen2.5-1.5b",
    "qwen3-0.6b",
    "qwen3-1.7b",
    "llama3.2-1b",
    "gemma3-1b",
)


@dataclasses.dataclass(frozen=True)
class Spec:
    """One process's run: where, on which model, with which compilation cache."""

    workdir: str
    cache: str
    model: str = "tiny"
    checkpoint: str = ""  # the model's checkpoint directory ("" for the tiny default's)
    quick: bool = False
    # Config fields set last, ("rl.max_staleness", 1) ... (another bench's variants).
    overrides: tuple[tuple[str, Any], ...] = ()
    config: str = CONFIG  # the config file (``path[:arg]``) whose iterations are measured

    @property
    def iterations(self) -> int:
        return QUICK_ITERATIONS if self.quick else ITERATIONS


def bench_config(spec: Spec):
    """The run's ``RunConfig``: the default (or ``:test``) with SFT off and the model's settings."""
    from agentrl_jax.run.config import from_config_dict, load_config_file  # noqa: PLC0415

    cd = load_config_file(spec.config + (":test" if spec.quick else ""))
    per_iteration = cd.rl.tasks_per_iteration * cd.rollout.group_size
    cd.budget = dict(total=spec.iterations * per_iteration, sft_fraction=0.0)
    cd.rl.task_pool = "all"  # no demonstration takes tasks away
    cd.checkpoint.every = 2
    cd.eval_every = 0  # the last iteration evaluates
    cd.compile_cache = spec.cache
    if spec.quick:  # the longest admissible command fits, at either tokenizer's vocabulary
        cd.rollout.max_new_tokens = 32
    else:
        # 64 train tasks; the evaluation: the first held-out level's first 16 tasks.
        cd.env.update(num_train_tasks=64, eval_levels=cd.env.eval_levels[:1], num_eval_tasks=16)
        cd.env.num_report_tasks = 0
    if spec.checkpoint:
        cd.model.update(checkpoint=spec.checkpoint, template="checkpoint")  # its own ChatML
        if not spec.quick:
            cd.model.update(dtype="bfloat16", remat="full", scan_layers=True)
            cd.rl.microbatch_size = 8
    for path, value in spec.overrides:
        *sections, name = path.split(".")
        node = cd
        for section in sections:
            node = node[section]
        node[name] = value
    return from_config_dict(cd)


def write_checkpoint(spec: Spec, directory: str) -> None:
    """A ``spec.model``-shaped checkpoint (its family's) with random weights and a tokenizer
    trained on the games' text (ChatML, Qwen's special tokens), written once into ``directory``."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    from flax import nnx  # noqa: PLC0415

    from agentrl_jax.envs.actors import ActorPool  # noqa: PLC0415
    from agentrl_jax.models import preset, registry  # noqa: PLC0415
    from agentrl_jax.models.hf_checkpoint import save_hf_checkpoint  # noqa: PLC0415
    from agentrl_jax.models.tokenizer import build_tokenizer  # noqa: PLC0415
    from agentrl_jax.run import build  # noqa: PLC0415
    from agentrl_jax.sharding import create_sharded_model  # noqa: PLC0415

    config = bench_config(dataclasses.replace(spec, checkpoint=""))
    env = config.env
    tasks = [t for level in build.train_tasks(config).values() for t in level]
    pool = ActorPool(env.name, dict(env.kwargs), num_workers=env.num_workers)
    try:
        texts = build.expert_texts(pool, tasks, config.rollout)
    finally:
        pool.close()
    tokenizer = build_tokenizer(texts, 2048 if not spec.quick else 1024, directory)
    name = "tiny" if spec.quick else spec.model
    overrides = dict(num_layers=1) if spec.quick else {}
    cfg = preset(name, param_dtype=jnp.bfloat16 if not spec.quick else jnp.float32, **overrides)
    policy = registry.family(cfg).policy
    model = create_sharded_model(lambda: policy(cfg, rngs=nnx.Rngs(0)), None)
    save_hf_checkpoint(model, directory, tokenizer=tokenizer)
    del model
    jax.clear_caches()


def child(spec: Spec, out: str) -> None:
    """One process's run (``python -m agentrl_jax.benchmarks.iteration --spec ...``)."""
    import jax  # noqa: PLC0415

    from agentrl_jax import compile_cache, timing  # noqa: PLC0415
    from agentrl_jax.run.tensorboard import read_scalars  # noqa: PLC0415
    from agentrl_jax.run.trainer import Trainer  # noqa: PLC0415

    compile_cache.enable(spec.cache)
    timing.install_listeners()
    jax.config.update("jax_threefry_partitionable", True)
    t0 = time.perf_counter()
    trainer = Trainer(bench_config(spec), spec.workdir)
    try:
        trainer.run()
    finally:
        trainer.close()
    scalars = read_scalars(os.path.join(spec.workdir, "tensorboard"))
    device = jax.local_devices()[0]
    stats = device.memory_stats() or {}
    result = {
        "seconds": time.perf_counter() - t0,
        "profiles": [dataclasses.asdict(p) for p in trainer.profiles],
        "compile": dataclasses.asdict(timing.TOTALS),
        "scalars": {
            k: [v for _, v in scalars.get(k, [])]
            for k in (
                "perf/rollout_tokens_per_s",
                "perf/update_tokens_per_s",
                "rollout/logprob_mismatch",
            )
        },
        "peak_device_bytes": stats.get("peak_bytes_in_use"),
        "device_kind": getattr(device, "device_kind", "unknown"),
        "backend": jax.default_backend(),
        "jax_version": jax.__version__,
    }
    with open(out, "w") as f:
        json.dump(result, f)


def _spawn(spec: Spec, out: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "agentrl_jax.benchmarks.iteration", "--out", out]
    cmd += ["--spec", json.dumps(dataclasses.asdict(spec))]
    subprocess.run(cmd, check=True)
    with open(out) as f:
        return json.load(f)


def steady(profiles: list[dict]) -> list[dict]:
    """The iterations after the first (which compiles), or all when there is one."""
    return profiles[1:] or profiles


def summarize(profiles: list[dict]) -> dict[str, Any]:
    """Median wall seconds, mean phase seconds, coverage and busy fraction of the iterations."""
    from agentrl_jax.timing import IterationProfile  # noqa: PLC0415

    walls = [p["wall_s"] for p in profiles]
    names = sorted({name for p in profiles for name in p["phases"]})
    phases = {n: statistics.fmean(p["phases"].get(n, 0.0) for p in profiles) for n in names}
    background = statistics.fmean(p.get("background_busy_s", 0.0) for p in profiles)
    mean = IterationProfile(0, statistics.fmean(walls), phases, 0, 0, background)  # the mean
    return {
        "median_s": statistics.median(walls),
        "mean_s": mean.wall_s,
        "phases_s": {n: round(s, 4) for n, s in phases.items()},
        "phase_coverage": mean.coverage,
        "device_busy_fraction": mean.device_busy_fraction,
    }


def run(
    quick: bool,
    model: str = "tiny",
    config: str = CONFIG,
    overrides: tuple[tuple[str, Any], ...] = (),
) -> Report:
    """``config``'s iterations (``--config``; ``--quick``: the default's ``:test`` only), with
    ``overrides`` (``--set=section.field=value``) set last."""
    if model not in MODELS:
        raise ValueError(f"--model={model!r}: expected one of {', '.join(MODELS)}")
    if quick and config != CONFIG:
        raise ValueError(f"--quick runs {CONFIG}:test; --config={config!r} has no quick size")
    base = tempfile.mkdtemp(prefix="agentrl_bench_iteration_")
    cache = os.path.join(base, "compile_cache")  # fresh: the first process is cold
    checkpoint = ""
    if model != "tiny" or quick:
        checkpoint = os.path.join(base, "checkpoint")
        spec = Spec(
            workdir=os.path.join(base, "prepare"),
            cache=cache,
            model=model,
            quick=quick,
            overrides=overrides,
            config=config,
        )
        cmd = [sys.executable, "-m", "agentrl_jax.benchmarks.iteration", "--prepare", checkpoint]
        subprocess.run([*cmd, "--spec", json.dumps(dataclasses.asdict(spec))], check=True)
    runs = {}
    for name in ("cold", "warm"):
        spec = Spec(os.path.join(base, name), cache, model, checkpoint, quick, overrides, config)
        runs[name] = _spawn(spec, os.path.join(base, f"{name}.json"))
    cold, warm = runs["cold"], runs["warm"]
    summary = summarize(steady(warm["profiles"]))
    report = Report("iteration")
    scalars = warm["scalars"]
    report.add(
        Row(
            f"{model}/iteration_seconds",
            summary["median_s"],
            None,
            "s",
            higher_is_better=False,
            extra={
                **{k: v for k, v in summary.items() if k != "median_s"},
                "iterations": len(warm["profiles"]),
                "rollout_tokens_per_s": _median(scalars["perf/rollout_tokens_per_s"][1:]),
                "update_tokens_per_s": _median(scalars["perf/update_tokens_per_s"][1:]),
                "logprob_mismatch_max": max(scalars["rollout/logprob_mismatch"], default=None),
                "compilations_per_iteration": [p["compilations"] for p in warm["profiles"]],
                "peak_device_bytes": warm["peak_device_bytes"],
                "profiles": warm["profiles"],
                "cold_first_iteration_s": cold["profiles"][0]["wall_s"],
                "cold_steady": summarize(steady(cold["profiles"])),
            },
        )
    )
    report.add(
        Row(
            f"{model}/compile_seconds",
            warm["compile"]["seconds"],
            cold["compile"]["seconds"],
            "s",
            higher_is_better=False,
            extra={
                "cold": cold["compile"],
                "warm": warm["compile"],
                "cold_process_s": cold["seconds"],
                "warm_process_s": warm["seconds"],
            },
        )
    )
    report.facts.update(
        config=config,
        overrides={path: value for path, value in overrides},
        backend=warm["backend"],
        device_kind=warm["device_kind"],
        jax_version=warm["jax_version"],
        workdir=base,
        load_average=os.getloadavg(),
    )
    return report


def setting(text: str) -> tuple[str, Any]:
    """``--set=section.field=value`` as (path, value): the value a Python literal, else text."""
    path, sep, value = text.partition("=")
    if not sep or not path:
        raise ValueError(f"--set={text!r}: expected section.field=value")
    try:
        return path, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return path, value


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, help="Spec as JSON")
    parser.add_argument("--out", help="child: where to write its measurements")
    parser.add_argument("--prepare", help="write the model's checkpoint into this directory")
    args = parser.parse_args()
    fields = json.loads(args.spec)
    fields["overrides"] = tuple(tuple(o) for o in fields.get("overrides", ()))
    spec = Spec(**fields)
    if args.prepare:
        write_checkpoint(spec, args.prepare)
    else:
        child(spec, args.out)


if __name__ == "__main__":
    main()
