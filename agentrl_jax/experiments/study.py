"""Studies: a baseline config, variants and seeds, every (variant, seed) cell trained and evaluated.

A study file (``configs/studies/NAME.py``) defines ``get_study()`` returning a dict:

    baseline="configs/tiny_textworld.py"          # a config, as --config= names it
    overrides={"rl.epochs": 2}                    # dotted config keys, applied to every cell
    variants={"grpo": {}, "rloo": {"rl.algo": "rloo"}}   # name -> overrides (after the above)
    reference="grpo"                              # differences are to it (default: the first)
    seeds=(0, 1, 2)
    evaluation=dict(split="test", num_tasks=200, levels=("simple", "medium"),
                    decoding="constrained")       # decoding None/absent: each config's own;
                                                  # split absent: the env family's report split

``evaluation`` sets the cells' report (``env.report_levels`` on ``split``, ``num_tasks`` games per
level, ``env.num_report_tasks``): every cell's before/after numbers are on those games, greedy.
``decoding`` sets ``rollout.constrain_actions`` for the whole cell (the trainer acts and
evaluates with the same decoding). Tuning and checkpoint selection inside a cell still read the
config's ``valid`` evaluations.

Each cell runs ``launch.train`` as a subprocess on ``WORKDIR/cells/<variant>/seed-<s>/
cell_config.json`` (via ``configs/from_json.py``): a killed or crashed cell loses only itself,
its memory is returned when it ends, and rerunning resumes it from its last checkpoint.
A cell is finished when its ``done`` marker exists, written (atomically) after its
``result.json``; a rerun of the study never repeats a finished cell.

Statistics (``agentrl_jax/stats.py``): a cell's success rates have 95% Wilson intervals and its RL
gain Newcombe's paired interval (same games); a variant's mean over seeds has a Student t
interval, and its difference to the reference is paired by seed (the t interval of the per-seed
differences, over the seeds both ran).
"""

from __future__ import annotations

import copy
import dataclasses
import glob
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from agentrl_jax import stats as stats_lib
from agentrl_jax.rollout.tasks import report_levels
from agentrl_jax.run.config import load_config_file, missing_key

STUDY_KEYS = ("baseline", "overrides", "variants", "reference", "seeds", "evaluation")
EVALUATION_KEYS = ("split", "num_tasks", "levels", "decoding")
FROM_JSON = "configs/from_json.py"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class StudyError(ValueError):
    """A study file is invalid; the message names the file, the field and what was expected."""


@dataclasses.dataclass(frozen=True)
class Evaluation:
    split: str = ""  # empty: the baseline's env family's report split (its registry entry)
    num_tasks: int = 200
    levels: tuple[str, ...] = ()  # empty: the config's eval levels
    decoding: str | None = None  # "free" | "constrained" | None (the config's)


@dataclasses.dataclass(frozen=True)
class Study:
    """A validated study file (see the module docstring)."""

    path: str
    baseline: str
    overrides: dict[str, Any]
    variants: dict[str, dict[str, Any]]
    reference: str
    seeds: tuple[int, ...]
    evaluation: Evaluation

    @property
    def name(self) -> str:
        return os.path.splitext(os.path.basename(self.path))[0]

    def cells(self) -> list[tuple[str, int]]:
        """(variant, seed) in run order: seed by seed, so an early stop has every variant."""
        return [(v, s) for s in self.seeds for v in self.variants]


def load_study(path: str) -> Study:
    """Reads and validates ``configs/studies/NAME.py``; StudyError names what is wrong."""
    if not os.path.isfile(path):
        raise StudyError(f"study file {path!r} not found; expected configs/studies/NAME.py")
    spec = importlib.util.spec_from_file_location(
        "agentrl_study_" + os.path.basename(path)[:-3], path
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "get_study"):
        raise StudyError(f"{path}: defines no get_study(); expected one returning a dict")
    raw = module.get_study()
    where = f"{path}: get_study()"
    if not isinstance(raw, dict):
        raise StudyError(f"{where} returned {type(raw).__name__}; expected a dict")
    unknown = sorted(set(raw) - set(STUDY_KEYS))
    if unknown:
        raise StudyError(f"{where} has unknown key(s) {unknown}; valid keys: {list(STUDY_KEYS)}")
    if not isinstance(raw.get("baseline"), str) or not raw["baseline"]:
        raise StudyError(
            f"{where}['baseline'] is {raw.get('baseline')!r}; expected a config "
            "spec such as 'configs/tiny_textworld.py' or '...py:smoke'"
        )
    variants = raw.get("variants")
    if not isinstance(variants, dict) or not variants:
        raise StudyError(
            f"{where}['variants'] is {variants!r}; expected a non-empty dict name -> "
            "overrides, e.g. {'baseline': {}, 'rloo': {'rl.algo': 'rloo'}}"
        )
    for name, over in variants.items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise StudyError(f"{where}: variant name {name!r}; expected letters, digits, _ . -")
        _check_overrides(f"{where}['variants'][{name!r}]", over)
    overrides = raw.get("overrides", {})
    _check_overrides(f"{where}['overrides']", overrides)
    reference = raw.get("reference", next(iter(variants)))
    if reference not in variants:
        raise StudyError(f"{where}['reference'] is {reference!r}; expected one of {list(variants)}")
    seeds = raw.get("seeds")
    if (
        not isinstance(seeds, (list, tuple))
        or not seeds
        or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)
        or len(set(seeds)) != len(seeds)
    ):
        raise StudyError(
            f"{where}['seeds'] is {seeds!r}; expected distinct ints >= 0, e.g. (0, 1, 2)"
        )
    ev = dict(raw.get("evaluation", {}))
    unknown = sorted(set(ev) - set(EVALUATION_KEYS))
    if unknown:
        raise StudyError(
            f"{where}['evaluation'] has unknown key(s) {unknown}; valid keys: "
            f"{list(EVALUATION_KEYS)}"
        )
    if not ev.get("split"):
        ev["split"] = _report_split(raw["baseline"], where)
    evaluation = Evaluation(**{**ev, "levels": tuple(ev.get("levels", ()))})
    if not isinstance(evaluation.num_tasks, int) or evaluation.num_tasks < 1:
        raise StudyError(
            f"{where}['evaluation']['num_tasks'] is {evaluation.num_tasks!r}; "
            "expected games per level >= 1"
        )
    if evaluation.decoding not in (None, "free", "constrained"):
        raise StudyError(
            f"{where}['evaluation']['decoding'] is {evaluation.decoding!r}; "
            "expected 'free', 'constrained' or None (the config's own)"
        )
    return Study(
        path=path,
        baseline=raw["baseline"],
        overrides=dict(overrides),
        variants={k: dict(v) for k, v in variants.items()},
        reference=reference,
        seeds=tuple(seeds),
        evaluation=evaluation,
    )


def _check_overrides(where: str, overrides: Any) -> None:
    if not isinstance(overrides, dict) or not all(isinstance(k, str) and k for k in overrides):
        raise StudyError(
            f"{where} is {overrides!r}; expected a dict of dotted config keys, e.g. "
            "{'rl.actor_lr': 5e-4}"
        )


def _report_split(baseline: str, where: str) -> str:
    """The report split of the env family ``baseline`` (a config, as --config= names it) trains
    on, its plugins imported first (a user's family registers there)."""
    from agentrl_jax.envs import registry  # noqa: PLC0415
    from agentrl_jax.run.config import import_plugins  # noqa: PLC0415

    try:
        cd = load_config_file(baseline)
        import_plugins(tuple(cd.get("plugins", ()) or ()))
        return registry.family(cd.env.name).report_split
    except (OSError, ValueError) as e:
        raise StudyError(f"{where}['evaluation']['split'] is not set and {e}") from e


def cell_config(study: Study, variant: str, seed: int):
    """The ConfigDict a cell trains with: the baseline, the study's then the variant's overrides,
    the seed and the evaluation settings. StudyError names a key the config does not have."""
    cd = load_config_file(study.baseline)
    ev = study.evaluation
    settings = {
        **study.overrides,
        **study.variants[variant],
        "seed": seed,
        "env.num_report_tasks": ev.num_tasks,
    }
    with cd.unlocked():
        levels = ev.levels or tuple(lv.partition("@")[0] for lv in cd.env.eval_levels)
        settings["env.report_levels"] = tuple(f"{lv}@{ev.split}" for lv in levels)
        if ev.decoding:
            settings["rollout.constrain_actions"] = ev.decoding == "constrained"
        for key, value in settings.items():
            problem = missing_key(cd, key)
            if problem:
                raise StudyError(f"{study.path}: variant {variant!r}: {problem}")
            *parents, leaf = key.split(".")
            node = cd
            for part in parents:
                node = node[part]
            if isinstance(value, list):
                value = tuple(value)
            node[leaf] = copy.deepcopy(value)
    return cd


def cell_dir(workdir: str, variant: str, seed: int) -> str:
    return os.path.join(workdir, "cells", variant, f"seed-{seed}")


def is_done(workdir: str, variant: str, seed: int) -> bool:
    return os.path.isfile(os.path.join(cell_dir(workdir, variant, seed), "done"))


def cell_code() -> dict[str, str]:
    """The code a cell trains with: every file of the package but this runner's own (a change to
    the runner's tables changes no cell's run)."""
    from agentrl_jax.run.multihost import code_fingerprint  # noqa: PLC0415

    runner = __name__.replace(".", "/") + ".py"  # agentrl_jax/experiments/study.py
    return {k: v for k, v in code_fingerprint().items() if k != runner}


def reuse_cells(
    workdir: str,
    pending: Sequence[tuple[str, int]],
    sources: Sequence[str],
    code: dict[str, str] | None = None,
) -> dict[tuple[str, int], str]:
    """Fills pending cells from finished cells of other studies that ran the same thing.

    A source cell qualifies when it is done, its ``cell_config.json`` holds the same config (the
    variant's name does not matter) and its ``code.json`` the same code as this checkout's (a
    cell run by other code is never reused; ``code``: this checkout's ``cell_code()``). Its
    folder is copied whole, ``reused_from`` names it, and the ``done`` marker comes last, so a
    copy cut short is simply run.

    Returns:
      (variant, seed) -> the source cell folder, for the cells filled.
    """
    code = cell_code() if code is None else code
    donors: list[tuple[dict[str, Any], str]] = []
    for source in sources:
        for config_path in sorted(
            glob.glob(os.path.join(source, "cells", "*", "*", "cell_config.json"))
        ):
            folder = os.path.dirname(config_path)
            code_path = os.path.join(folder, "code.json")
            if not (os.path.isfile(os.path.join(folder, "done")) and os.path.isfile(code_path)):
                continue
            with open(code_path) as f:
                if json.load(f) != code:
                    continue
            with open(config_path) as f:
                donors.append((json.load(f), folder))
    filled = {}
    for cell in pending:
        folder = cell_dir(workdir, *cell)
        with open(os.path.join(folder, "cell_config.json")) as f:
            mine = json.load(f)
        source = next((d for c, d in donors if c == mine), None)
        if source is None:
            continue
        for name in os.listdir(source):
            if name in ("done", "cell_config.json"):
                continue
            src, dst = os.path.join(source, name), os.path.join(folder, name)
            if os.path.isdir(src):
                shutil.rmtree(dst, ignore_errors=True)
                shutil.copytree(src, dst, symlinks=True)
            else:
                shutil.copy2(src, dst)
        write_atomic(os.path.join(folder, "reused_from"), os.path.abspath(source) + "\n")
        write_atomic(os.path.join(folder, "done"), time.ctime() + "\n")
        filled[cell] = source
    return filled


def write_atomic(path: str, text: str) -> None:
    """Writes ``text`` to ``path`` so that a reader sees the old file or the whole new one."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# ------------------------------------------------------------------------------ one cell


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
        }
    scalars = read_scalars(os.path.join(run_dir, "tensorboard"))
    to_episodes, _ = rl_episode_axis(scalars)
    curve = [
        [to_episodes(step), value]
        for step, value in sorted(dict(scalars.get("rollout/success_rate", ())).items())
    ]
    return {"levels": out, "rl_iterations": "after_rl" in evals, "curve": curve}


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
            per_level[level] = _nulls(entry)
        out["variants"][variant] = {
            "overrides": overrides,
            "cells_done": len(mine),
            "levels": per_level,
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


# ------------------------------------------------------------------------------ the runner


def prepare(study: Study, workdir: str) -> dict[tuple[str, int], Any]:
    """Validates every cell's config (before any compute) and writes its cell_config.json.

    Returns:
      (variant, seed) -> RunConfig.
    """
    from agentrl_jax.run.config import ConfigError, from_config_dict  # noqa: PLC0415

    configs = {}
    for variant, seed in study.cells():
        cd = cell_config(study, variant, seed)
        try:
            configs[(variant, seed)] = from_config_dict(cd, num_devices=None)
        except ConfigError as e:
            raise StudyError(
                f"{study.path}: variant {variant!r}, seed {seed}: config error: {e}"
            ) from e
        folder = cell_dir(workdir, variant, seed)
        os.makedirs(folder, exist_ok=True)
        write_atomic(
            os.path.join(folder, "cell_config.json"), cd.to_json_best_effort(indent=2) + "\n"
        )
    return configs


def generate_games(configs: Sequence[Any], progress: bool = True) -> int:
    """Builds every task the cells will read, once, before they start, for the env families that
    register a ``prepare`` hook (TextWorld: cells share the game cache; two cells in parallel
    would otherwise both build the same missing games).

    Returns:
      The number of tasks the cells use (made now or found in the cache).
    """
    from agentrl_jax.envs import registry  # noqa: PLC0415
    from agentrl_jax.rollout.tasks import parse_level  # noqa: PLC0415

    need: dict[str, dict[tuple[str, str], int]] = {}

    for cfg in configs:
        env = cfg.env
        family = registry.family(env.name)
        if not family.prepare:
            continue
        counts = need.setdefault(env.name, {})

        def want(level: str, split: str, count: int, counts=counts) -> None:
            counts[(level, split)] = max(counts.get((level, split), 0), count)

        for level in cfg.curriculum.levels:
            want(level, registry.TRAIN_SPLIT, env.num_train_tasks)
        for level in env.eval_levels:
            want(*parse_level(level, family.eval_split), env.num_eval_tasks)
        for key in report_levels(
            env.name, env.report_levels, env.eval_levels, env.num_report_tasks
        ):
            want(*parse_level(key, ""), env.num_report_tasks)
    total = 0
    for name, counts in sorted(need.items()):
        jobs = [(level, split, n) for (level, split), n in sorted(counts.items())]
        registry.family(name).hook("prepare")(jobs, progress=progress)
        total += sum(counts.values())
    return total


def _train_cmd(folder: str) -> list[str]:
    config = os.path.join(folder, "cell_config.json")
    return [
        sys.executable,
        "-m",
        "launch.train",
        f"--config={FROM_JSON}:{config}",
        f"--workdir={os.path.join(folder, 'run')}",
    ]


def _die_with_parent() -> None:
    """In the cell's process: die when the runner does (Linux), so a killed runner never leaves
    a cell writing a workdir that the next runner resumes."""
    try:
        import ctypes  # noqa: PLC0415

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    except (OSError, AttributeError):
        pass


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


def run_study(
    study: Study,
    workdir: str,
    *,
    parallel: int = 1,
    log: Callable[[str], None] = print,
    repo: str | None = None,
    reuse: Sequence[str] = (),
    variants: Sequence[str] = (),
) -> dict[str, Any]:
    """Runs every unfinished cell (``parallel`` at a time), then writes results.json, results.md
    and learning_curve.png from every finished cell. Returns the results.

    ``reuse``: other studies' workdirs whose finished cells fill this study's cells that would
    run the same config with the same code (``reuse_cells``), e.g. a shared baseline.
    ``variants``: run only these variants' cells (empty: all); the results cover every finished
    cell, so a study can be run a few variants at a time into one workdir.

    Raises:
      StudyError: a cell's config is invalid (before anything runs), or a cell failed (after the
        others ran; its log is named).
    """
    if parallel < 1:
        raise StudyError(f"--parallel={parallel}: expected >= 1")
    unknown = [v for v in variants if v not in study.variants]
    if unknown:
        raise StudyError(
            f"{study.path}: --variants names {unknown}, which the study does not have; "
            f"its variants: {list(study.variants)}"
        )
    repo = repo or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    workdir = os.path.abspath(workdir)
    configs = prepare(study, workdir)
    cells = study.cells()
    done = {c for c in cells if is_done(workdir, *c)}
    pending = [c for c in cells if c not in done and (not variants or c[0] in variants)]
    code = cell_code()
    reused = reuse_cells(workdir, pending, reuse, code) if reuse and pending else {}
    pending = [c for c in pending if c not in reused]
    log(
        f"study {study.name}: {len(cells)} cells ({len(study.variants)} variants x "
        f"{len(study.seeds)} seeds), {len(done)} already done, "
        f"{len(reused)} reused, {len(pending)} to run"
        + (f" (variants {', '.join(variants)})" if variants else "")
        + f", {parallel} at a time; workdir {workdir}"
    )
    for cell, source in reused.items():
        log(f"  reused {cell[0]}/seed-{cell[1]}: the same config and code ran in {source}")
    if pending:
        n = generate_games([configs[c] for c in pending])
        if n:
            log(f"games: {n} TextWorld games ready in the cache")
    running: dict[tuple[str, int], tuple[subprocess.Popen, float, Any]] = {}
    durations: list[float] = []
    failed: list[str] = []
    queue = list(pending)
    start = time.monotonic()
    while queue or running:
        while queue and len(running) < parallel:
            cell = queue.pop(0)
            folder = cell_dir(workdir, *cell)
            write_atomic(os.path.join(folder, "code.json"), json.dumps(code, indent=0) + "\n")
            logf = open(os.path.join(folder, "train.log"), "ab")  # noqa: SIM115 - closed on exit
            logf.write(
                f"=== launch.study: cell {cell[0]}/seed-{cell[1]} started {time.ctime()}\n".encode()
            )
            logf.flush()
            with warnings.catch_warnings():
                # preexec_fn means fork then exec; JAX warns about forking once it has threads,
                # but the child only calls prctl before exec, touching no lock JAX holds.
                warnings.filterwarnings("ignore", "os.fork", RuntimeWarning)
                proc = subprocess.Popen(
                    _train_cmd(folder),
                    cwd=repo,
                    stdout=logf,
                    stderr=subprocess.STDOUT,
                    preexec_fn=_die_with_parent,
                )
            running[cell] = (proc, time.monotonic(), logf)
            log(f"  start {cell[0]}/seed-{cell[1]}")
        time.sleep(0.5)
        for cell, (proc, t0, logf) in list(running.items()):
            if proc.poll() is None:
                continue
            logf.close()
            del running[cell]
            folder = cell_dir(workdir, *cell)
            name = f"{cell[0]}/seed-{cell[1]}"
            if proc.returncode != 0:
                failed.append(f"{name} (exit {proc.returncode}; log {folder}/train.log)")
                log(f"  FAILED {name}: exit status {proc.returncode}; see {folder}/train.log")
                continue
            env = configs[cell].env
            levels = report_levels(
                env.name, env.report_levels, env.eval_levels, env.num_report_tasks
            )
            result = collect_cell(os.path.join(folder, "run"), levels)
            write_atomic(os.path.join(folder, "result.json"), json.dumps(result, indent=2) + "\n")
            write_atomic(os.path.join(folder, "done"), time.ctime() + "\n")
            durations.append(time.monotonic() - t0)
            done = sum(is_done(workdir, *c) for c in cells)
            left = len(queue) + len(running)
            eta = (
                _duration(sum(durations) / len(durations) * math.ceil(left / parallel))
                if left
                else "0m00s"
            )
            log(
                f"  done {name} in {_duration(durations[-1])}: {done}/{len(cells)} cells finished, "
                f"elapsed {_duration(time.monotonic() - start)}, ETA {eta}"
            )
    finished = {}
    for cell in cells:
        if is_done(workdir, *cell):
            with open(os.path.join(cell_dir(workdir, *cell), "result.json")) as f:
                finished[cell] = json.load(f)
    results = aggregate(study, finished)
    write_atomic(os.path.join(workdir, "results.json"), json.dumps(results, indent=2) + "\n")
    write_atomic(os.path.join(workdir, "results.md"), results_markdown(results))
    plot_study_curve(results, os.path.join(workdir, "learning_curve.png"))
    log(f"results: {workdir}/results.md, results.json, learning_curve.png")
    if failed:
        raise StudyError(f"{len(failed)} cell(s) failed: {', '.join(failed)}; rerun to retry them")
    return results


__all__ = [
    "Evaluation",
    "Study",
    "StudyError",
    "aggregate",
    "cell_code",
    "cell_config",
    "collect_cell",
    "load_study",
    "plot_study_curve",
    "results_markdown",
    "reuse_cells",
    "run_study",
]
