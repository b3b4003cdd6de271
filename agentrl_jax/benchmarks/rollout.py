r"""Rollouts of slow environments: continuous batching with overlapped env steps against
synchronous waves, in the same run, interleaved.

    python -m launch.bench rollout --out bench_rollout.json

Workload ``env_latency_episodes_per_s``: the built-in default's policy (``configs/
tiny_textworld.py``: its model shape, its tokenizer built here from the games' expert
playthroughs, random weights) plays 64 episodes, 16 simple TextWorld games x 4, of up to 8
turns (``max_steps=8``), with RL's sampling (temperature 1) and constrained decoding. Every env
step waits 200 ms (``env.kwargs.step_latency_s=0.2``), standing in for a slow or remote env. The
actor pool is the default's, 2 workers x 16 envs: 32 episodes at once.

- ``ours``: ``rollout.batching='continuous'`` (two cohorts of 16 rows: one decodes while the
  other's envs step; an episode's rows are refilled by the next group as soon as it ends) with
  ``env.concurrent_steps=True`` (a worker's envs step side by side).
- ``reference``: today's synchronous waves (``batching='waves'``, envs stepped one after
  another in each worker): 2 waves of 32 episodes.

Row ``env_latency_over_concurrent_waves`` splits the gain: ours against synchronous waves whose
workers do step their envs side by side. Its ratio is what continuous batching and the overlap
add on their own.

Every side plays the same 64 episodes (each draws with its own keys); the report records that
they agreed, token for token (``same_episodes``). Each side is warmed up once (compilation),
then the sides run alternately, ``repeats`` times each; rows report medians, with every run's
seconds, and the load average at the start and the end. ``turn_programs_compiled_per_play``
counts, per side and play (the warm-up first), the sampler's turn programs the play compiled
(``Sampler.num_traces``): a count that the machine's load does not move. After the warm-up
every side should compile none: continuous batching's cohorts run fixed turn shapes
(``sampling.TurnShapes``), so the order in which the env replies come back does not matter.

Workload ``async_iterations_per_hour``: whole RL iterations of the default (``launch.bench
iteration``'s run, SFT off) with the same slow envs, continuous batching and concurrent steps on
both sides: ``ours`` asynchronous (``rl.max_staleness=1``, TIS), the reference on-policy.
``async_iterations_per_hour_default_rollout``: the same with the default's own rollout (waves,
envs stepped in turn) on both sides.
On 2 CPU cores the update's compute and the rollout's cannot overlap; the env latency is what
the background rollout hides.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time

import jax

from agentrl_jax.benchmarks.report import Report, Row, peak_rss_mb
from agentrl_jax.benchmarks.sampler import Runs, _row

CONFIG = "configs/tiny_textworld.py"


@dataclasses.dataclass(frozen=True)
class Sizes:
    tasks: int = 16
    group: int = 4
    turns: int = 8
    latency_s: float = 0.2
    workers: int = 2
    envs_per_worker: int = 16
    repeats: int = 3


QUICK = Sizes(tasks=2, group=2, turns=2, latency_s=0.05, envs_per_worker=2, repeats=1)


def run(quick: bool) -> Report:
    sizes = QUICK if quick else Sizes()
    load_start = os.getloadavg()
    from agentrl_jax.envs.actors import ActorPool  # noqa: PLC0415
    from agentrl_jax.run import build  # noqa: PLC0415
    from agentrl_jax.run.config import from_config_dict, load_config_file  # noqa: PLC0415

    cd = load_config_file(CONFIG + (":test" if quick else ""))
    cd.env.update(
        num_train_tasks=sizes.tasks,
        num_workers=sizes.workers,
        envs_per_worker=sizes.envs_per_worker,
        concurrent_steps=True,
    )
    cd.env.kwargs.update(max_steps=sizes.turns, step_latency_s=sizes.latency_s)
    cd.rollout.update(max_turns=sizes.turns, group_size=sizes.group, batching="continuous")
    cd.rl.task_pool = "all"  # no demonstrations here: the first games are the ones played
    if quick:  # the longest admissible command fits, at either tokenizer's vocabulary
        cd.rollout.max_new_tokens = 32
    config = from_config_dict(cd)
    report = Report("rollout")
    with tempfile.TemporaryDirectory() as workdir:
        parts = build.build(config, workdir)
        sequential = ActorPool(
            config.env.name,
            dict(config.env.kwargs),
            num_workers=sizes.workers,
            envs_per_worker=sizes.envs_per_worker,
        )
        try:
            tasks = [t for level in parts.train_tasks.values() for t in level][: sizes.tasks]
            ours = parts.worker
            waves = dataclasses.replace(config.rollout, batching="waves")
            concurrent_waves = ours.with_config(waves)
            reference = ours.with_config(waves)
            reference.pool = sequential
            sampling = build.rl_sampling(config)
            played = {}
            compiled = {}  # per side, per play: turn programs the play compiled

            def side(name, worker):
                def play() -> float:
                    traces = parts.sampler.num_traces
                    t0 = time.perf_counter()
                    played[name] = worker.run(tasks, jax.random.key(0), sampling=sampling)
                    seconds = time.perf_counter() - t0
                    compiled.setdefault(name, []).append(parts.sampler.num_traces - traces)
                    return seconds

                return play

            sides = {
                "ours": side("ours", ours),
                "reference": side("reference", reference),
                "concurrent_waves": side("concurrent_waves", concurrent_waves),
            }
            seconds = {name: [] for name in sides}
            for play in sides.values():
                play()  # warm-up: every program compiles
            for _ in range(sizes.repeats):
                for name, play in sides.items():
                    seconds[name].append(play())
            same = {
                name: [_key(t) for t in trajs] == [_key(t) for t in played["ours"]]
                for name, trajs in played.items()
            }
        finally:
            sequential.close()
            parts.close()
    runs = {name: Runs(s) for name, s in seconds.items()}
    episodes = sizes.tasks * sizes.group
    steps = sum(len(t.steps) for t in played["ours"])
    shape = {
        "episodes": episodes,
        "max_turns": sizes.turns,
        "env_steps": steps,
        "step_latency_s": sizes.latency_s,
        "pool": f"{sizes.workers} workers x {sizes.envs_per_worker} envs",
        "ours_is": "batching=continuous (2 cohorts), env.concurrent_steps=True",
        "same_episodes": same["reference"] and same["concurrent_waves"],
        # Load-independent: the turn programs each play compiled, the warm-up play first (the
        # waves sides share theirs). A timed play that compiles pays seconds of compilation.
        "turn_programs_compiled_per_play": compiled,
    }
    report.add(
        _row(
            "env_latency_episodes_per_s",
            episodes,
            runs["ours"],
            runs["reference"],
            "episodes/s",
            reference_is="synchronous waves, each worker stepping its envs in turn (today's)",
            target_ratio=2.0,
            **shape,
        )
    )
    report.add(
        _row(
            "env_latency_over_concurrent_waves",
            episodes,
            runs["ours"],
            runs["concurrent_waves"],
            "episodes/s",
            reference_is="synchronous waves, each worker stepping its envs side by side",
            turn_programs_compiled_per_play=compiled,
        )
    )
    report.add(_async_iterations(quick, SLOW_ENVS, "async_iterations_per_hour"))
    report.add(_async_iterations(quick, LATENCY, "async_iterations_per_hour_default_rollout"))
    report.facts.update(
        {
            "config": CONFIG + (":test" if quick else ""),
            "repeats": sizes.repeats,
            "compilations": parts.sampler.num_traces,
            "peak_rss_mb": round(peak_rss_mb(), 1),
            "load_average_start": [round(x, 2) for x in load_start],
            "load_average_end": [round(x, 2) for x in os.getloadavg()],
        }
    )
    return report


# Both sides of ``async_iterations_per_hour``: the default's RL with every env step 200 ms,
# played with continuous batching and envs stepped side by side.
LATENCY = (("env.kwargs.step_latency_s", 0.2),)  # the default's own rollout otherwise
SLOW_ENVS = LATENCY + (("env.concurrent_steps", True), ("rollout.batching", "continuous"))
ASYNC = (("rl.max_staleness", 1), ("rl.off_policy_correction", "tis"))
ASYNC_REPEATS = 3  # timed processes per side, alternating, after one warm-up process each


def _async_iterations(quick: bool, both, workload: str) -> Row:
    """Whole RL iterations (``launch.bench iteration``'s run: the default, SFT off, 5
    iterations, a checkpoint every 2, the last evaluating): asynchronous (ours) against
    on-policy, each a process of its own on one compilation cache. Each side runs once to warm
    the cache, then ``ASYNC_REPEATS`` times, the sides alternating; the row is iterations per
    hour from the median of the timed processes' iterations, each one's first (compiling) left
    out. ``both``: the config fields both sides run with (``SLOW_ENVS``, or ``LATENCY``: the
    default's own rollout)."""
    from agentrl_jax.benchmarks import iteration  # noqa: PLC0415

    base = tempfile.mkdtemp(prefix="agentrl_bench_async_")
    cache = os.path.join(base, "compile_cache")
    sides = {"ours": both + ASYNC, "reference": both}
    profiles = {name: [] for name in sides}
    phases = ["warm"] + [f"timed{i}" for i in range(1 if quick else ASYNC_REPEATS)]
    for phase in phases:
        for name, overrides in sides.items():
            workdir = os.path.join(base, f"{phase}_{name}")
            spec = iteration.Spec(workdir, cache, quick=quick, overrides=overrides)
            out = iteration._spawn(spec, workdir + ".json")  # noqa: SLF001
            if phase != "warm":
                profiles[name] += iteration.steady(out["profiles"])
    summary = {name: iteration.summarize(p) for name, p in profiles.items()}
    per_hour = {name: 3600.0 / s["median_s"] for name, s in summary.items()}
    return Row(
        workload,
        per_hour["ours"],
        per_hour["reference"],
        "iterations/h",
        extra={
            "ours_is": "rl.max_staleness=1, rl.off_policy_correction=tis",
            "reference_is": "on-policy (max_staleness=0)",
            "both": {path: value for path, value in both},
            "iterations_s": {n: [round(p["wall_s"], 3) for p in ps] for n, ps in profiles.items()},
            "phases_s": {n: s["phases_s"] for n, s in summary.items()},
            "target_ratio": 1.3,
        },
    )


def _key(traj):
    """What must agree between two plays of an episode: its tokens, rewards and ending."""
    steps = [(s.prompt_ids, s.action_ids, s.reward, s.done) for s in traj.steps]
    return traj.group, traj.won, traj.truncated, traj.infra_failure, steps
