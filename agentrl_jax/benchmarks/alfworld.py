"""ALFWorld rows of the env benchmark: one process sequential against the actor pool.

``bench_rows(quick)`` returns ``Row``s (``agentrl_jax.benchmarks.report``) that
``agentrl_jax/benchmarks/envs.py`` adds to its report (``python -m launch.bench envs``; this
module is not a benchmark of its own):

- ``alfworld reset, pool vs 1 process`` (resets/s): ``ours`` = ``ActorPool`` with one worker per
  core resetting a batch of distinct tasks; ``reference`` = one env resetting them one by one.
- ``alfworld step, pool vs 1 process`` (steps/s): the same episodes stepped with the expert's
  actions, batched through the pool vs one env.
- ``alfworld step, fast engine vs stock`` (steps/s, one process) and ``alfworld reset of the same
  task, fast engine vs stock`` (resets/s; a GRPO group resets one task many times):
  ``alfworld_speedups`` against TextWorld's own code, on the same episode (identical transcripts
  are tested in tests/test_alfworld.py).

Every timed reset of the pool rows loads a game that env does not hold and whose PDDL translation
is not cached in that process, on both sides.

Tasks: the first valid_unseen tasks of the real pack when ``$ALFWORLD_DATA`` or ../shared has it
(full run), else the demo room (``alfworld_scenes``; always in quick mode, which only checks the
plumbing). Workers: ``os.cpu_count()``. What limits the pool: each reset and step is pure-Python
CPU work (fast-downward grounding, grammar rendering), so the ideal is the core count; the
parent's pickling of observations (the admissible-command lists) and whatever else runs on the
machine take the rest.
"""

from __future__ import annotations

import os
import pathlib
import tempfile
import time
from typing import Any

from agentrl_jax.benchmarks.report import Row
from agentrl_jax.envs.alfworld import data as alfworld_data
from agentrl_jax.envs.alfworld import scenes as alfworld_scenes
from agentrl_jax.envs.alfworld import speedups as alfworld_speedups
from agentrl_jax.envs.alfworld.env import ALFWorldEnv
from agentrl_jax.envs.base import Task

ENV_PATH = "agentrl_jax.envs.alfworld.env:ALFWorldEnv"
_SHARED_PACK = pathlib.Path(__file__).resolve().parents[3] / "shared" / "data" / "alfworld"


def bench_rows(quick: bool) -> list[Row]:
    """Measures ALFWorld resets/s and steps/s, pool against one process (see module doc)."""
    workers = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="alfworld-bench-") as tmp:
        env_kwargs, tasks, source = _setup(quick, workers, pathlib.Path(tmp))
        steps = 4 if quick else 12
        env = ALFWorldEnv(**env_kwargs)
        try:
            for task in tasks:  # Build every game once, so neither side pays for it.
                env.reset(task)
            ref_reset = _sequential_resets(env, tasks)
            ref_step = _sequential_steps(env, tasks, steps)
            fast, stock = _fast_vs_stock(env, tasks[0], steps)
        finally:
            env.close()
        pool_reset, pool_step = _pool(env_kwargs, tasks, steps, workers)
    facts = {
        "cores": workers,
        "workers": workers,
        "episodes": len(tasks),
        "tasks": source,
        "steps_per_episode": steps,
    }
    single = {"tasks": source, "processes": 1, "task": tasks[0].id}
    return [
        Row("alfworld reset, pool vs 1 process", pool_reset, ref_reset, "resets/s", extra=facts),
        Row("alfworld step, pool vs 1 process", pool_step, ref_step, "steps/s", extra=facts),
        Row("alfworld step, fast engine vs stock", fast[1], stock[1], "steps/s", extra=single),
        Row(
            "alfworld reset of the same task, fast engine vs stock",
            fast[0],
            stock[0],
            "resets/s",
            extra=single,
        ),
    ]


def _setup(quick: bool, workers: int, tmp: pathlib.Path) -> tuple[dict, list[Task], str]:
    episodes = 2 * workers if quick else 4 * workers
    root = None
    if not quick:
        for candidate in (os.environ.get("ALFWORLD_DATA"), _SHARED_PACK):
            try:
                root = alfworld_data.resolve_data_dir(candidate) if candidate else None
            except alfworld_data.MissingDataError:
                root = None
            if root is not None:
                break
    if root is not None:
        ids = alfworld_data.list_task_ids(root, "valid_unseen")[:episodes]
        split, source = "valid_unseen", f"valid_unseen[:{episodes}] of {root}"
    else:
        root = tmp / "demo"
        demo = alfworld_scenes.write_demo_tasks(root)
        ids = [demo[i % len(demo)] for i in range(episodes)]
        split, source = "train", "demo room (alfworld_scenes)"
    kwargs: dict[str, Any] = {
        "data_dir": str(root),
        "split": split,
        "max_steps": 200,
        "cache_dir": str(tmp / "cache"),
    }
    return kwargs, [Task("alfworld", split, i) for i in ids], source


def _sequential_resets(env: ALFWorldEnv, tasks: list[Task]) -> float:
    t0 = time.perf_counter()
    for task in tasks:
        env._loaded = None  # Every reset loads its game, as for a task the env did not hold,
        alfworld_speedups.clear_translation_cache()  # translated afresh, as in a pool worker.
        env.reset(task)
    return len(tasks) / (time.perf_counter() - t0)


def _expert_or_look(info: dict[str, Any]) -> str:
    return info.get("expert_action") or "look"


def _sequential_steps(env: ALFWorldEnv, tasks: list[Task], steps: int) -> float:
    total, elapsed = 0, 0.0
    for task in tasks:
        env.reset(task)
        info = env.last_info
        t0 = time.perf_counter()
        for _ in range(steps):
            _, _, done, info = env.step(_expert_or_look(info))
            total += 1
            if done:
                break
        elapsed += time.perf_counter() - t0
    return total / elapsed


def _fast_vs_stock(env: ALFWorldEnv, task: Task, steps: int) -> list[tuple[float, float]]:
    """[(resets/s, steps/s) with alfworld_speedups, (resets/s, steps/s) with stock code]."""
    rates = []
    for fast in (True, False):
        (alfworld_speedups.install if fast else alfworld_speedups.uninstall)()
        env.fast_engine = fast
        env.reset(task)  # Loaded and, when fast, translated: the timed resets are repeats.
        repeats = 3
        t0 = time.perf_counter()
        for _ in range(repeats):
            env.reset(task)
        rates.append((repeats / (time.perf_counter() - t0), _sequential_steps(env, [task], steps)))
    env.fast_engine = True
    alfworld_speedups.install()
    return rates


def _pool(env_kwargs: dict, tasks: list[Task], steps: int, workers: int) -> tuple[float, float]:
    from agentrl_jax.envs.actors import ActorPool

    per_worker = -(-len(tasks) // workers)
    with ActorPool(ENV_PATH, env_kwargs, num_workers=workers, envs_per_worker=per_worker) as pool:
        # Warm-up (imports, first engine), with the tasks shifted by one so that the timed reset
        # gives every env a game it does not hold: each timed reset loads its game, as in the
        # reference.
        pool.reset(tasks[1:] + tasks[:1])
        t0 = time.perf_counter()
        results = pool.reset(tasks)
        reset_rate = len(tasks) / (time.perf_counter() - t0)
        failed = [r.error for r in results if r.infra_failure]
        if failed:
            raise RuntimeError(f"ALFWorld bench: pool resets failed: {failed[:3]}")
        actions: list[str | None] = [_expert_or_look(r.info) for r in results]
        total, t0 = 0, time.perf_counter()
        for _ in range(steps):
            out = pool.step(actions)
            total += sum(r is not None for r in out)
            actions = [None if r is None or r.done else _expert_or_look(r.info) for r in out]
        step_rate = total / (time.perf_counter() - t0)
    return reset_rate, step_rate
