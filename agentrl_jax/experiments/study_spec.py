"""A study's definition: the study file read and validated, and the config each cell trains with.

A study file (``configs/studies/NAME.py``) defines ``get_study()`` returning a dict:

    baseline="configs/tiny_textworld.py"          # a config, as --config= names it
    overrides={"rl.epochs": 2}                    # dotted config keys, applied to every cell
    variants={"grpo": {}, "rloo": {"rl.algo": "rloo"}}   # name -> overrides (after the above)
    reference="grpo"                              # differences are to it (default: the first)
    seeds=(0, 1, 2)
    evaluation=dict(split="test", num_tasks=200, levels=("simple", "medium"),
                    decoding="constrained")       # decoding None/absent: each config's own;
                                                  # split absent: the env family's report split
    shared_sft=("grpo", "rloo")                   # optional: these variants start RL from one
                                                  # SFT run per seed

``evaluation`` sets the cells' report (``env.report_levels`` on ``split``, or on the split a level
names, as in ``"all@valid_seen"``; ``num_tasks`` games per level, ``env.num_report_tasks``):
every cell's before/after numbers are on those games, greedy. ``decoding`` sets
``rollout.constrain_actions`` for the whole cell (the trainer acts and evaluates with the same
decoding). Tuning and checkpoint selection inside a cell still read the
config's ``valid`` evaluations.

``shared_sft`` names variants that differ in RL settings only (``rl.*`` overrides): per seed, one
SFT run (``launch.train --stop_after=sft``, in ``WORKDIR/starts/seed-<s>``) is the start every one
of them resumes from, so their SFT policy and its evaluation are the same, and an expensive SFT
phase runs once a seed instead of once a cell.

The runner is ``experiments/study.py``; the cells' numbers, the tables over seeds and the curves
are ``experiments/study_results.py``.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import os
import re
from typing import Any

from agentrl_jax.run.config import load_config_file, missing_key

STUDY_KEYS = (
    "baseline",
    "overrides",
    "variants",
    "reference",
    "seeds",
    "evaluation",
    "shared_sft",
)
EVALUATION_KEYS = ("split", "num_tasks", "levels", "decoding")
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
    shared_sft: tuple[str, ...] = ()  # variants that resume from one SFT run per seed

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
    shared = raw.get("shared_sft", ())
    if not isinstance(shared, (list, tuple)) or any(v not in variants for v in shared):
        raise StudyError(
            f"{where}['shared_sft'] is {shared!r}; expected a tuple of variant names from "
            f"{list(variants)}"
        )
    for name in shared:
        not_rl = sorted(k for k in variants[name] if not k.startswith("rl."))
        if not_rl:
            raise StudyError(
                f"{where}['shared_sft'] names {name!r}, whose overrides {not_rl} are not RL "
                "settings; expected variants that differ in rl.* keys only (they share one SFT "
                "run per seed)"
            )
    return Study(
        path=path,
        baseline=raw["baseline"],
        overrides=dict(overrides),
        variants={k: dict(v) for k, v in variants.items()},
        reference=reference,
        seeds=tuple(seeds),
        evaluation=evaluation,
        shared_sft=tuple(dict.fromkeys(shared)),
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
        # A level names its own split (``all@valid_seen``) or is on the evaluation's split.
        settings["env.report_levels"] = tuple(
            lv if "@" in lv else f"{lv}@{ev.split}" for lv in levels
        )
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


__all__ = [
    "EVALUATION_KEYS",
    "STUDY_KEYS",
    "Evaluation",
    "Study",
    "StudyError",
    "cell_config",
    "load_study",
]
