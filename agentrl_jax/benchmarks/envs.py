"""Env throughput: one sequential process (the reference) against the actor pool.

    python -m launch.bench envs --out bench_envs.json

For each env family, the same batch of B = workers x envs_per_worker episodes is reset and
stepped twice: once by B envs in this process, one after another (``reference``), and once by
the pool (``ours``). Both sides play the same tasks with the same actions; game files are made
before the clock starts. Rows: ``<env> resets/s`` and ``<env> steps/s``. The core count and
what limits the pool go into the report's facts.

ALFWorld plugs in through ``bench_rows(quick) -> list[Row]`` in
``agentrl_jax.benchmarks.alfworld`` (imported by name, so a machine without ALFWorld's packages
still gets TextWorld's rows); ``measure_env`` below is the shared measurement to build those rows
with.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import psutil

from agentrl_jax.benchmarks.report import Report, Row
from agentrl_jax.envs import registry
from agentrl_jax.envs.actors import ActorPool
from agentrl_jax.envs.base import Observation, Task

Policy = Callable[[Observation, int, int], str]  # (observation, episode, turn) -> action
ALFWORLD_HOOKS = ("agentrl_jax.benchmarks.alfworld",)


def cheap_walk(obs: Observation, episode: int, turn: int) -> str:
    """A deterministic walk over look/inventory/examine/go: it moves but never ends a game."""
    safe = [
        c
        for c in obs.admissible_commands or ("look",)
        if c.startswith(("look", "inventory", "examine", "go "))
    ]
    return safe[(7 * turn + 3 * episode) % len(safe)] if safe else "look"


class _Clock:
    """Wall and CPU seconds of one side; CPU counts this process plus the given worker pids."""

    def __init__(self):
        self.wall = {"reset": 0.0, "step": 0.0}
        self.cpu = {"reset": 0.0, "step": 0.0}
        self.count = {"reset": 0, "step": 0}

    def measure(self, kind: str, fn: Callable[[], int], pids: Sequence[int] = ()) -> None:
        cpu0, wall0 = _cpu_seconds(pids), time.perf_counter()
        self.count[kind] += fn()
        self.wall[kind] += time.perf_counter() - wall0
        self.cpu[kind] += _cpu_seconds(pids) - cpu0


def _cpu_seconds(pids: Sequence[int]) -> float:
    total = time.process_time()
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):  # A worker restarted mid-measure.
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
    return total


def measure_env(
    label: str,
    env_name: str,
    env_kwargs: dict[str, Any],
    tasks: Sequence[Task],
    policy: Policy,
    *,
    workers: int,
    envs_per_worker: int,
    rounds: int,
    steps: int,
) -> tuple[list[Row], dict[str, Any]]:
    """Resets/s and steps/s of B envs, sequential in this process vs the pool.

    Round ``r`` resets episode ``i`` to ``tasks[(r * B + i) % len(tasks)]`` and steps every
    episode ``steps`` times (an episode that ends is left out of later steps of the round). The
    two sides take turns round by round (alternating who goes first), so both see the same
    background load on a shared machine.

    Returns:
      The two rows and facts (batch size, pool start-up, work done, CPU time per reset/step).
    """
    batch = workers * envs_per_worker
    schedule = [[tasks[(r * batch + i) % len(tasks)] for i in range(batch)] for r in range(rounds)]
    envs = [registry.make_env(env_name, **env_kwargs) for _ in range(batch)]
    t0 = time.perf_counter()
    pool = ActorPool(env_name, env_kwargs, num_workers=workers, envs_per_worker=envs_per_worker)
    start_s = time.perf_counter() - t0
    ref, ours = _Clock(), _Clock()

    def reference_round(round_tasks):
        obs = [None] * batch

        def reset():
            for i, (env, task) in enumerate(zip(envs, round_tasks)):
                obs[i] = env.reset(task)
            return batch

        def play():
            live, n = [True] * batch, 0
            for turn in range(steps):
                for i, env in enumerate(envs):
                    if live[i]:
                        obs[i], _, done, _ = env.step(policy(obs[i], i, turn))
                        live[i], n = not done, n + 1
            return n

        ref.measure("reset", reset)
        ref.measure("step", play)

    def pool_round(round_tasks):
        obs, live, pids = [None] * batch, [True] * batch, pool.worker_pids()

        def reset():
            for i, r in enumerate(pool.reset(round_tasks)):
                obs[i], live[i] = r.observation, not r.infra_failure
            return batch

        def play():
            n = 0
            for turn in range(steps):
                actions = [policy(o, i, turn) if live[i] else None for i, o in enumerate(obs)]
                for i, r in enumerate(pool.step(actions)):
                    if r is not None:
                        obs[i], live[i], n = r.observation, not r.done, n + 1
            return n

        ours.measure("reset", reset, pids)
        ours.measure("step", play, pids)

    with pool:
        for r, round_tasks in enumerate(schedule):
            sides = (reference_round, pool_round) if r % 2 == 0 else (pool_round, reference_round)
            for side in sides:
                side(round_tasks)
        failures = int(pool.metrics["infra_failures"])
    for env in envs:
        env.close()

    extra = {"workers": workers, "envs_per_worker": envs_per_worker}
    rows, facts = (
        [],
        {
            f"{label}: batch (episodes at once)": batch,
            f"{label}: pool start-up s (not timed)": round(start_s, 2),
            f"{label}: infrastructure failures": failures,
        },
    )
    for kind in ("reset", "step"):
        rows.append(
            Row(
                f"{label} {kind}s/s",
                ours.count[kind] / ours.wall[kind],
                ref.count[kind] / ref.wall[kind],
                f"{kind}s/s",
                extra=extra,
            )
        )
        facts[f"{label}: {kind}s done (ours, reference)"] = f"{ours.count[kind]}, {ref.count[kind]}"
        facts[f"{label}: CPU ms per {kind} (ours incl. parent, reference)"] = (
            f"{1e3 * ours.cpu[kind] / ours.count[kind]:.1f}, "
            f"{1e3 * ref.cpu[kind] / ref.count[kind]:.1f}"
        )
    return rows, facts


def _textworld(quick: bool, workers: int) -> tuple[list[Row], dict[str, Any]]:
    from agentrl_jax.envs.textworld import games  # noqa: PLC0415

    n_games = 2 if quick else 16  # Full: two rounds of 8 distinct games (a reset loads a file).
    t0 = time.perf_counter()
    tasks = games.make_tasks("simple", "train", n_games, progress=not quick)
    made_s = time.perf_counter() - t0
    rows, facts = measure_env(
        "textworld simple",
        "textworld",
        {"max_steps": 1000},
        tasks,
        cheap_walk,
        workers=workers,
        envs_per_worker=1 if quick else 4,
        rounds=1 if quick else 2,
        steps=3 if quick else 40,
    )
    facts["textworld: game files found or made first, s (not timed)"] = round(made_s, 1)
    return rows, facts


def _alfworld(quick: bool) -> tuple[list[Row], str]:
    """Rows from the ALFWorld module's hook, or why there are none."""
    for name in ALFWORLD_HOOKS:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        hook = getattr(module, "bench_rows", None)
        if hook is None:
            continue
        try:
            return list(hook(quick)), f"rows from {name}.bench_rows"
        except Exception as e:  # noqa: BLE001 - ALFWorld's absence must not sink TextWorld's rows.
            return [], f"skipped: {name}.bench_rows raised {type(e).__name__}: {e}"
    return [], f"skipped: no bench_rows(quick) in {' or '.join(ALFWORLD_HOOKS)}"


def run(quick: bool) -> Report:
    """Measures TextWorld (and ALFWorld, through its hook) sequentially and in the pool."""
    cores = os.cpu_count() or 1
    workers = 2 if quick else cores
    report = Report("envs")
    report.facts["cores"] = cores
    report.facts["pool workers"] = workers
    rows, facts = _textworld(quick, workers)
    for row in rows:
        report.add(row)
    report.facts.update(facts)
    rows, status = _alfworld(quick)
    for row in rows:
        report.add(row)
    report.facts["alfworld"] = status
    report.facts["what limits the pool"] = (
        f"at most {min(workers, cores)}x: the workers share {cores} cores with this process "
        "(which pickles every observation and admissible-command list both ways) and with "
        "anything else running, and each batch waits for its slowest worker. The 'CPU ms per' "
        "facts give the pool's own overhead (ours includes the parent); the rest of the gap to "
        "the core count is CPU taken by other processes"
    )
    return report
