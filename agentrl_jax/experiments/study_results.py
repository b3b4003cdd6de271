"""A study's results: each finished cell's numbers, the tables over seeds and the curves.

Statistics (``agentrl_jax/stats.py``): a cell's success rates have 95% Wilson intervals and its RL
gain Newcombe's paired interval (same games); a variant's mean over seeds has a Student t
interval, and its difference to the reference is paired by seed (the t interval of the per-seed
differences, over the seeds both ran).

    results = aggregate(study, {(variant, seed): collect_cell(run_dir, levels), ...})
    results_markdown(results)                     # results.md
    plot_study_curve(results, "learning_curve.png")
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
from collections.abc import Sequence
from typing import Any

from agentrl_jax import stats as stats_lib
from agentrl_jax.experiments.study_spec import Study


def collect_cell(run_dir: str, levels: Sequence[str]) -> dict[str, Any]:
    """A finished ``launch.train`` workdir's numbers: per report set in ``levels`` (the cell's
    ``level@split`` keys) the success after SFT and at the end (after RL; after SFT when the cell
    had no RL) with Wilson intervals, the RL gain with its paired interval; and the sampled
    success per RL iteration against episodes."""
    from agentrl_jax.experiments.evaluate import rl_episode_axis  # noqa: PLC0415
    from agentrl_jax.run import evaluation  # noqa: PLC0415
    from agentrl_jax.run.tensorboard import read_scalars  # noqa: PLC0415

    with open(os.path.join(run_dir, "report.json")) as f:
        evals = json.load(f)["evals"]
    before = evals.get("after_sft", {})
    final = evals.get("after_rl") or before
    out = {}
    for key in levels:  # the report sets, e.g. simple@test
        b = evaluation.EvalResult.from_json(before[key])
        a = evaluation.EvalResult.from_json(final[key])
        out[key] = {
            "protocol": {
                "split": a.split,
                "num_tasks": a.num_tasks,
                "decoding": a.decoding,
                "greedy": a.greedy,
                "temperature": a.temperature,
                "seed": a.seed,
            },
            "after_sft": stats_lib.rate_json(
                b.overall.wins, b.overall.episodes, design_effect=b.overall.design_effect
            ),
            "final": stats_lib.rate_json(
                a.overall.wins, a.overall.episodes, design_effect=a.overall.design_effect
            ),
            "gain": evaluation.paired_gain(b, a).to_json(),
            # Per task type (ALFWorld's six, TextWorld's level): wins of episodes, before / after.
            "per_type": {
                t: {
                    "after_sft": [b.per_type[t].wins, b.per_type[t].episodes]
                    if t in b.per_type
                    else None,
                    "final": [s.wins, s.episodes],
                }
                for t, s in a.per_type.items()
            },
        }
    scalars = read_scalars(os.path.join(run_dir, "tensorboard"))
    to_episodes, _ = rl_episode_axis(scalars)
    curve = [
        [to_episodes(step), value]
        for step, value in sorted(dict(scalars.get("rollout/success_rate", ())).items())
    ]
    # Wall seconds per RL iteration (its rollout, update, logs; an evaluation's when it had
    # one), the median over the iterations after the first, which compiles.
    walls = [v for _, v in sorted(dict(scalars.get("time/iteration_s", ())).items())]
    walls = walls[1:] or walls
    return {
        "levels": out,
        "rl_iterations": "after_rl" in evals,
        "curve": curve,
        "iteration_s": statistics.median(walls) if walls else None,
    }


# ------------------------------------------------------------------------------ aggregation


def aggregate(study: Study, cells: dict[tuple[str, int], dict[str, Any]]) -> dict[str, Any]:
    """results.json: per variant and report level, the final success over seeds (mean, t interval)
    and the difference to the reference paired by seed, plus every cell's numbers."""
    ev = study.evaluation
    out: dict[str, Any] = {
        "study": study.name,
        "baseline": study.baseline,
        "reference": study.reference,
        "seeds": list(study.seeds),
        "evaluation": {**dataclasses.asdict(ev), "levels": list(ev.levels), "greedy": True},
        "confidence": stats_lib.CONFIDENCE,
        "variants": {},
        "cells": {f"{v}/seed-{s}": c for (v, s), c in sorted(cells.items())},
    }
    for variant, overrides in study.variants.items():
        mine = {s: cells[(variant, s)] for s in study.seeds if (variant, s) in cells}
        ref = {s: cells[(study.reference, s)] for s in study.seeds if (study.reference, s) in cells}
        levels = sorted({k for c in mine.values() for k in c["levels"]})
        per_level = {}
        for level in levels:
            rates = {
                s: c["levels"][level]["final"]["rate"]
                for s, c in mine.items()
                if level in c["levels"]
            }
            rates = {s: r for s, r in rates.items() if r is not None}
            mean, low, high = stats_lib.t_interval(list(rates.values()))
            # A success rate lies in [0, 1]; the t interval of a mean near 0 would reach below.
            low, high = max(low, 0.0), min(high, 1.0)
            entry = {
                "seeds": sorted(rates),
                "per_seed": {str(s): r for s, r in sorted(rates.items())},
                "mean": mean,
                "low": low,
                "high": high,
            }
            # The RL gain over the same cell's after-SFT policy (same games, same demonstrations),
            # over the seeds whose cell played RL.
            played = [
                c["levels"][level]
                for c in mine.values()
                if c["rl_iterations"] and level in c["levels"]
            ]
            if played:
                g_mean, g_low, g_high = stats_lib.t_interval([c["gain"]["diff"] for c in played])
                entry["rl_gain"] = {
                    "seeds": len(played),
                    "after_sft_mean": sum(c["after_sft"]["rate"] for c in played) / len(played),
                    "final_mean": sum(c["final"]["rate"] for c in played) / len(played),
                    "mean": g_mean,
                    "low": g_low,
                    "high": g_high,
                }
            if variant != study.reference:
                deltas = {
                    s: r - ref[s]["levels"][level]["final"]["rate"]
                    for s, r in rates.items()
                    if s in ref
                    and ref[s]["levels"].get(level, {}).get("final", {}).get("rate") is not None
                }
                d_mean, d_low, d_high = stats_lib.t_interval(list(deltas.values()))
                entry["vs_reference"] = {
                    "seeds": sorted(deltas),
                    "mean": d_mean,
                    "low": d_low,
                    "high": d_high,
                }
            # Final success per task type: the mean over seeds of each seed's rate.
            types = sorted(
                {t for c in mine.values() for t in c["levels"].get(level, {}).get("per_type", {})}
            )
            entry["per_type"] = {}
            for t in types:
                finals = [
                    c["levels"][level]["per_type"][t]["final"]
                    for c in mine.values()
                    if t in c["levels"].get(level, {}).get("per_type", {})
                ]
                rates = [w / n for w, n in finals if n]
                entry["per_type"][t] = {
                    "seeds": len(rates),
                    "episodes": sum(n for _, n in finals),
                    "mean": sum(rates) / len(rates) if rates else None,
                }
            per_level[level] = _nulls(entry)
        walls = [c["iteration_s"] for c in mine.values() if c.get("iteration_s") is not None]
        cell_walls = [c["wall_s"] for c in mine.values() if c.get("wall_s") is not None]
        start_walls = [c["sft_start_s"] for c in mine.values() if c.get("sft_start_s")]
        out["variants"][variant] = {
            "overrides": overrides,
            "cells_done": len(mine),
            "levels": per_level,
            # The seeds' median RL iteration, averaged; wall time on the machine that ran it.
            "iteration_s": sum(walls) / len(walls) if walls else None,
            # A cell's wall time from start to end, averaged over the seeds (a shared_sft cell's
            # own: its seed's SFT start is sft_start_s, paid once for the seed's shared cells).
            "cell_s": sum(cell_walls) / len(cell_walls) if cell_walls else None,
            "sft_start_s": sum(start_walls) / len(start_walls) if start_walls else None,
        }
    return out


def _nulls(d: dict[str, Any]) -> dict[str, Any]:
    """JSON has no NaN: NaN bounds (one seed) become null."""
    return {
        k: _nulls(v)
        if isinstance(v, dict)
        else (None if isinstance(v, float) and math.isnan(v) else v)
        for k, v in d.items()
    }


def _pct(x: float | None, sign: bool = False) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{100 * x:+.1f}" if sign else f"{100 * x:.1f}%"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    minutes = round(seconds / 60)
    return f"{minutes // 60}h{minutes % 60:02d}" if minutes >= 60 else f"{minutes} min"


def _ci(low: float | None, high: float | None) -> str:
    if low is None or high is None:
        return "n/a"
    return stats_lib.fmt_interval(low, high)


def results_markdown(results: dict[str, Any]) -> str:
    """results.md: the per-variant table, then every cell's before/after numbers."""
    ev = results["evaluation"]
    decoding = ev["decoding"] or "each config's"
    lines = [
        f"# Study: {results['study']}",
        "",
        f"Baseline config `{results['baseline']}`; seeds {results['seeds']}; evaluation: "
        f"{ev['num_tasks']} {ev['split']} games per level, {decoding} decoding, greedy. "
        f"Success is the final policy's (after RL; after SFT for a cell without RL). Mean over "
        f"seeds with its 95% t interval; the difference to `{results['reference']}` is paired "
        "by seed (95% t interval of the per-seed differences; n/a with one seed).",
        "",
        f"| variant | level | seeds | success (mean) | 95% CI "
        f"| vs {results['reference']} (pts) | 95% CI |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for variant, v in results["variants"].items():
        for level, e in v["levels"].items():
            vs = e.get("vs_reference")
            diff = (
                f"{_pct(vs['mean'], sign=True)} | {_ci(vs['low'], vs['high'])}"
                if vs
                else "(reference) |"
            )
            lines.append(
                f"| {variant} | {level} | {len(e['seeds'])} | {_pct(e['mean'])} "
                f"| {_ci(e['low'], e['high'])} | {diff} |"
            )
    lines += [
        "",
        "RL gain: the final policy against the same cell's policy after SFT, on the same games "
        "(mean over the seeds whose cell played RL, 95% t interval).",
        "",
        "| variant | level | seeds | after SFT (mean) | final (mean) | RL gain (pts) | 95% CI |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for variant, v in results["variants"].items():
        for level, e in v["levels"].items():
            g = e.get("rl_gain")
            if g:
                lines.append(
                    f"| {variant} | {level} | {g['seeds']} | {_pct(g['after_sft_mean'])} "
                    f"| {_pct(g['final_mean'])} | {_pct(g['mean'], sign=True)} "
                    f"| {_ci(g['low'], g['high'])} |"
                )
    walls = {v: e.get("iteration_s") for v, e in results["variants"].items()}
    if any(w is not None for w in walls.values()):
        lines += [
            "",
            "Wall-clock per RL iteration (each seed's median iteration after the first, averaged "
            "over the seeds; the machine's, under whatever else it ran):",
            "",
            "| variant | seconds per iteration |",
            "|---|---:|",
        ]
        lines += [f"| {v} | {'n/a' if w is None else f'{w:.1f}'} |" for v, w in walls.items()]
    cells = {v: (e.get("cell_s"), e.get("sft_start_s")) for v, e in results["variants"].items()}
    if any(c is not None for c, _ in cells.values()):
        lines += [
            "",
            "Wall time per cell (mean over the seeds; a `shared_sft` cell's own, then its seed's "
            "SFT start, which the seed's shared cells share):",
            "",
            "| variant | cell | its SFT start |",
            "|---|---:|---:|",
        ]
        lines += [
            f"| {v} | {_duration(c)} | {_duration(start) if start else '(in the cell)'} |"
            for v, (c, start) in cells.items()
        ]
    per_type = [
        (variant, level, t, e)
        for variant, v in results["variants"].items()
        for level, lv in v["levels"].items()
        for t, e in lv.get("per_type", {}).items()
    ]
    if len({t for *_, t, _ in per_type}) > 1:
        lines += [
            "",
            "Final success per task type (mean over seeds of each seed's rate; episodes summed):",
            "",
            "| variant | level | task type | seeds | episodes | success (mean) |",
            "|---|---|---|---:|---:|---:|",
        ]
        lines += [
            f"| {variant} | {level} | {t} | {e['seeds']} | {e['episodes']} | {_pct(e['mean'])} |"
            for variant, level, t, e in per_type
        ]
    lines += [
        "",
        "## Cells",
        "",
        "95% Wilson intervals; the gain is on the same games, with Newcombe's paired interval.",
        "",
        "| cell | level | after SFT | 95% CI | final | 95% CI | gain (pts) | 95% CI |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, cell in results["cells"].items():
        for level, c in cell["levels"].items():
            b, f, g = c["after_sft"], c["final"], c["gain"]
            lines.append(
                f"| {name} | {level} | {_pct(b['rate'])} | {_ci(b['low'], b['high'])} "
                f"| {_pct(f['rate'])} | {_ci(f['low'], f['high'])} "
                f"| {_pct(g['diff'], sign=True)} | {_ci(g['low'], g['high'])} |"
            )
    return "\n".join(lines) + "\n"


def plot_study_curve(results: dict[str, Any], out_png: str) -> None:
    """Sampled success against RL episodes: per variant the mean over seeds and the band from the
    lowest to the highest seed (at the iterations every seed reached)."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(7, 4))
    for variant in results["variants"]:
        curves = [
            c["curve"]
            for name, c in results["cells"].items()
            if name.rpartition("/seed-")[0] == variant
        ]
        curves = [c for c in curves if c]
        if not curves:
            continue
        n = min(len(c) for c in curves)
        xs = [curves[0][i][0] for i in range(n)]
        ys = [[c[i][1] for c in curves] for i in range(n)]
        mean = [sum(y) / len(y) for y in ys]
        (line,) = ax.plot(xs, mean, marker="o", ms=3, label=f"{variant} ({len(curves)} seeds)")
        if len(curves) > 1:
            ax.fill_between(
                xs, [min(y) for y in ys], [max(y) for y in ys], alpha=0.2, color=line.get_color()
            )
    ax.set_xlabel("RL episodes")
    ax.set_ylabel("sampled success (rollout/success_rate)")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    ax.set_title(f"study {results['study']}: mean over seeds, band min..max")
    fig.tight_layout()
    fig.savefig(out_png, format="png", dpi=100)
    plt.close(fig)


__all__ = [
    "aggregate",
    "collect_cell",
    "plot_study_curve",
    "results_markdown",
]
