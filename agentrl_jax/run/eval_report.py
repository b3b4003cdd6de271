"""Reports of held-out evaluations: a result's JSON and markdown files, and the run's
before/after table (success after SFT alone and after RL, with RL's paired gain).

    write_report(result, workdir / "eval", "simple_after_rl")   # .json + .md
    print(before_after_table([("simple (training complexity)", sft_simple, rl_simple),
                              ("medium (next harder)", sft_medium, rl_medium)]))

``evaluate_sets`` plays a run's evaluation and writes its reports. The results themselves, and
how they are measured: ``run/evaluation.py``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Sequence
from typing import Any

import jax
from absl import logging

from agentrl_jax import stats as stats_lib
from agentrl_jax.envs.base import Task
from agentrl_jax.rollout.rollout import RolloutWorker
from agentrl_jax.run import multihost
from agentrl_jax.run.evaluation import EvalResult, Stats, evaluate, paired_gain
from agentrl_jax.run.logs import episode_bar


def evaluate_policy(
    worker: RolloutWorker,
    config: Any,
    eval_tasks: dict[str, Sequence[Task]],
    *,
    name: str,
    workdir: str,
    report_tasks: dict[str, Sequence[Task]] | None = None,
    keep_episodes: bool = False,
) -> tuple[dict[str, float], dict[str, EvalResult]]:
    """How a policy is evaluated, the one way (the trainer's evaluations and ``launch.eval``):
    the policy the worker's sampler holds plays every held-out level of ``eval_tasks``
    (``eval/<level>/*``, and ``eval/success_rate``, the first level's: the
    checkpoint-selection metric) and, given ``report_tasks``, the report split's sets
    (``report/<level@split>/*``, kept apart so that nothing selects on them); a report per set
    under ``workdir/eval`` (from the primary process). Returns the metrics and the results by
    level (with ``keep_episodes``, each holding its played episodes: ``EvalResult.episodes``).

    ``config``: the run's ``RunConfig`` (its seed and ``env.num_transcripts``).
    """
    sets = [("eval", level, tasks) for level, tasks in eval_tasks.items()]
    sets += [("report", key, tasks) for key, tasks in (report_tasks or {}).items()]
    metrics, results = evaluate_sets(
        worker,
        sets,
        name=name,
        out_dir=os.path.join(workdir, "eval"),
        seed=config.seed,
        transcripts=config.env.num_transcripts,
        write=multihost.is_primary(),
        keep_episodes=keep_episodes,
    )
    metrics["eval/success_rate"] = metrics[f"eval/{next(iter(eval_tasks))}/success_rate"]
    return metrics, results


def evaluate_sets(
    worker: RolloutWorker,
    sets: Sequence[tuple[str, str, Sequence[Task]]],
    *,
    name: str,
    out_dir: str | os.PathLike,
    seed: int,
    transcripts: int,
    write: bool = True,
    keep_episodes: bool = False,
) -> tuple[dict[str, float], dict[str, EvalResult]]:
    """A run's evaluation ``name``: one greedy episode per task of each ``(prefix, level,
    tasks)`` set, with the policy the worker's sampler holds (the trainer's evaluations and
    ``launch.eval`` both play them so).

    Writes a report per set under ``out_dir`` (``<name>_<level>``, ``@`` as ``_``; when
    ``write``: the primary process) and returns the metrics ``<prefix>/<level>/{success_rate,
    mean_steps, mean_return}`` and the results by level (with ``keep_episodes``, their played
    episodes). A set equal to one already played is not played again.
    """
    logging.info(
        "evaluation %s: %s",
        name,
        ", ".join(f"{level} ({len(tasks)} games)" for _, level, tasks in sets),
    )
    metrics, results, played = {}, {}, {}
    for prefix, level, tasks in sets:
        ids = tuple((t.split, t.id) for t in tasks)
        if ids not in played:
            with episode_bar(f"evaluate {level}", len(tasks)) as progress:
                played[ids] = evaluate(
                    worker,
                    tasks,
                    jax.random.key(0),
                    greedy=True,
                    seed=seed,
                    transcripts=transcripts,
                    keep_episodes=keep_episodes,
                    progress=progress,
                )
        result = results[level] = played[ids]
        if write:
            write_report(result, out_dir, f"{name}_{level.replace('@', '_')}")
        overall = result.overall
        metrics[f"{prefix}/{level}/success_rate"] = overall.success_rate
        metrics[f"{prefix}/{level}/mean_steps"] = overall.mean_steps
        metrics[f"{prefix}/{level}/mean_return"] = overall.mean_return
    summary = [
        f"{level} success {r.success_rate:.2f} ({r.overall.wins}/{r.overall.episodes}, "
        f"{r.overall.mean_steps:.1f} steps, {r.overall.infra_failures} infra failures)"
        for level, r in results.items()
    ]
    logging.info("evaluation %s done: %s", name, "; ".join(summary))
    return metrics, results


def write_report(result: EvalResult, out_dir: str | os.PathLike, name: str) -> tuple[str, str]:
    """Writes ``<out_dir>/<name>.json`` and ``<out_dir>/<name>.md`` (and, when the result kept
    transcripts, ``<out_dir>/<name>_transcripts.md``); returns the report's two paths."""
    if not name or os.sep in name or name.startswith("."):
        raise ValueError(f"report name {name!r}: expected a plain file stem such as 'eval_simple'")
    os.makedirs(out_dir, exist_ok=True)
    json_path = os.path.join(out_dir, f"{name}.json")
    md_path = os.path.join(out_dir, f"{name}.md")
    with open(json_path, "w") as f:
        json.dump({"name": name, **result.to_json()}, f, indent=2, allow_nan=False)
        f.write("\n")
    with open(md_path, "w") as f:
        f.write(f"# Evaluation: {name}\n\n{markdown_table(result)}\n")
    if result.transcripts:
        with open(os.path.join(out_dir, f"{name}_transcripts.md"), "w") as f:
            n = len(result.transcripts)
            first = f"first {n} episodes" if n > 1 else "first episode"
            f.write(
                f"# Transcripts: {name}\n\nThe {first} ({result.protocol}).\n\n"
                + "\n".join(result.transcripts)
            )
    return json_path, md_path


def markdown_table(result: EvalResult) -> str:
    """One row per task type, then the overall row."""
    lines = [
        "| task type | episodes | success | 95% CI | mean steps | mean return | invalid actions "
        "| loop steps | infra failures |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    rows = [*result.per_type.items(), ("**all**", result.overall)]
    for label, s in rows:
        lines.append(
            f"| {label} | {s.episodes} | {_pct(s.success_rate)} "
            f"| {stats_lib.fmt_interval(*s.interval)} | {_num(s.mean_steps)} "
            f"| {_num(s.mean_return, 3)} | {_pct(s.invalid_action_rate)} | {_pct(s.loop_rate)} "
            f"| {s.infra_failures} |"
        )
    lines.append(f"\n{result.protocol}; {_interval_note([result])}.")
    return "\n".join(lines)


def _interval_note(results: Sequence[EvalResult]) -> str:
    """What the intervals are: Wilson's, clustered by game where a game has several episodes."""
    clustered = [r.overall for r in results if r.overall.design_effect != 1.0]
    if not clustered:
        return "95% Wilson intervals"
    counts = sorted({f"{s.episodes} episodes of {s.games} games" for s in clustered})
    return f"95% Wilson intervals, clustered by game ({'; '.join(counts)})"


def _gain(sft: EvalResult, rl: EvalResult) -> stats_lib.PairedDifference:
    """``paired_gain``; for reports written before outcomes were kept, the plain difference of
    the rates without an interval."""
    gain = paired_gain(sft, rl)
    if sft.outcomes and rl.outcomes:
        return gain
    diff = rl.success_rate - sft.success_rate
    return dataclasses.replace(gain, diff=diff, low=float("nan"), high=float("nan"))


def _rate_json(s: Stats) -> dict[str, Any]:
    """``stats.rate_json`` of a Stats, with its interval clustered by game."""
    return stats_lib.rate_json(s.wins, s.episodes, design_effect=s.design_effect)


def before_after_rows(rows: Sequence[tuple[str, EvalResult, EvalResult]]) -> list[dict[str, Any]]:
    """The before/after comparison as JSON rows: each result's rate with its Wilson interval,
    RL's gain on the games both counted with its paired (Newcombe) interval, and each result's
    episodes lost to infrastructure failures (``infra_failures``: after_sft, after_rl)."""
    out = []
    for label, sft, rl in rows:
        gain = _gain(sft, rl)
        out.append(
            {
                "set": label,
                "split": rl.split,
                "num_tasks": rl.num_tasks,
                "decoding": rl.decoding,
                "greedy": rl.greedy,
                "temperature": rl.temperature,
                "seed": rl.seed,
                "after_sft": _rate_json(sft.overall),
                "after_rl": _rate_json(rl.overall),
                "gain": gain.to_json(),
                # Episodes lost to the actor pool, left out of every rate above.
                "infra_failures": {
                    "after_sft": sft.overall.infra_failures,
                    "after_rl": rl.overall.infra_failures,
                },
            }
        )
    return out


def before_after_table(rows: Sequence[tuple[str, EvalResult, EvalResult]]) -> str:
    """The main job's table: held-out success after SFT alone and after RL, per evaluation set.

    Args:
      rows: (label, result after SFT, result after RL), e.g. the training complexity, then the
        next harder one, both on the same games.

    Returns:
      A markdown table with 95% Wilson intervals; then RL's gain in percentage points on the
      games both results counted and its paired interval (Newcombe); the last column counts the
      episodes lost to infrastructure failures (after SFT / after RL), left out of the rates;
      then a line per protocol (split, games, decoding, temperature, seed).
    """
    if not rows:
        raise ValueError("before_after_table got no rows; expected (label, sft, rl) tuples")
    lines = [
        "| held-out set | episodes | after SFT | 95% CI | after RL | 95% CI | RL gain "
        "| 95% CI (paired) | infra failures |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, sft, rl in rows:
        gain = _gain(sft, rl)
        episodes = (
            str(sft.overall.episodes)
            if sft.overall.episodes == rl.overall.episodes
            else f"{sft.overall.episodes} / {rl.overall.episodes}"
        )
        lines.append(
            f"| {label} | {episodes} | {_pct(sft.success_rate)} "
            f"| {stats_lib.fmt_interval(*sft.overall.interval)} | {_pct(rl.success_rate)} "
            f"| {stats_lib.fmt_interval(*rl.overall.interval)} "
            f"| {'n/a' if math.isnan(gain.diff) else f'{100 * gain.diff:+.1f} pts'} "
            f"| {stats_lib.fmt_interval(gain.low, gain.high)} "
            f"| {sft.overall.infra_failures} / {rl.overall.infra_failures} |"
        )
    protocols = sorted({r.protocol for _, sft, rl in rows for r in (sft, rl)})
    results = [r for _, sft, rl in rows for r in (sft, rl)]
    lines.append(
        f"\n{'; '.join(protocols)}. {_interval_note(results)}; the gain's interval is "
        "Newcombe's for paired outcomes on the same games."
    )
    return "\n".join(lines)


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{100.0 * x:.1f}%"


def _num(x: float, digits: int = 2) -> str:
    return "n/a" if math.isnan(x) else f"{x:.{digits}f}"


__all__ = [
    "before_after_rows",
    "before_after_table",
    "markdown_table",
    "write_report",
]
