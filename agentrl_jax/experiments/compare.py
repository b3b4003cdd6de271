"""Are two runs the same run? Every logged scalar and the whole final train state, bit for bit.

A run is deterministic given its config on the CPU (run/trainer.py), so two runs of one config
must agree exactly: a killed and resumed run with an uninterrupted one (tests/test_train.py's
chaos test), or one commit with another when a change claims to move code without changing
behaviour (``python -m launch.compare A B``).

What is compared:
- every TensorBoard scalar but the wall-clock ones (``time/``, ``perf/``), by (tag, step): the
  last value written, since a resumed run writes again what a killed run logged after its last
  checkpoint;
- the newest checkpoint's step and every array of its train state (policy, critic, moments);
- the reports (``eval/*.json``, each evaluation's games, outcomes and rates, and ``report.json``,
  the before/after table): a report one run wrote and the other did not is a difference.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any

import numpy as np

from agentrl_jax.run.tensorboard import read_scalars

# Wall-clock tags differ between any two runs; every other scalar must repeat.
TIMING_TAGS = ("time/", "perf/")


def logged_scalars(workdir: str | os.PathLike) -> dict[tuple[str, int], float]:
    """Every scalar a run logged but the timings, by (tag, step): the last value written."""
    scalars = read_scalars(os.path.join(workdir, "tensorboard"))
    return {
        (tag, step): value
        for tag, values in scalars.items()
        if not tag.startswith(TIMING_TAGS)
        for step, value in values
    }


def final_state(
    workdir: str | os.PathLike, step: int | None = None
) -> tuple[int, dict[str, np.ndarray]]:
    """(step, {path: array}) of the whole train state in a run's newest checkpoint (or in
    checkpoint ``step``)."""
    import jax  # noqa: PLC0415 (the scalars alone need neither)
    import orbax.checkpoint as ocp  # noqa: PLC0415

    directory = pathlib.Path(workdir) / "checkpoints"
    steps = [int(p.name) for p in directory.iterdir() if p.name.isdigit()]
    if not steps:
        raise FileNotFoundError(f"{directory}: no checkpoint (expected a launch.train workdir)")
    step = max(steps) if step is None else step
    path = directory / str(step) / "state"
    with ocp.PyTreeCheckpointer() as ckpt:
        tree = ckpt.metadata(path).item_metadata.tree
        args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
        state = ckpt.restore(path, restore_args=args)
    flat = jax.tree_util.tree_leaves_with_path(state["train"])
    return step, {jax.tree_util.keystr(k): np.asarray(v) for k, v in flat}


def eval_reports(workdir: str | os.PathLike) -> dict[str, Any]:
    """The run's reports by name: each evaluation's (``eval/*.json``: the games, their outcomes,
    the rates) and the before/after table's (``report.json``), when written."""
    root = pathlib.Path(workdir)
    paths = sorted((root / "eval").glob("*.json")) + sorted(root.glob("report.json"))
    return {str(p.relative_to(root)): json.loads(p.read_text()) for p in paths}


@dataclasses.dataclass
class Comparison:
    """What differs between two runs (empty lists: the same run)."""

    scalars_only_in_a: list[str]
    scalars_only_in_b: list[str]
    scalars_differ: list[str]  # "tag@step: a vs b"
    checkpoint_steps: tuple[int, int]
    arrays_differ: list[str]  # the state's paths whose shape, dtype or any element differ
    reports_differ: list[str]
    counts: dict[str, int]

    @property
    def same(self) -> bool:
        return not (
            self.scalars_only_in_a
            or self.scalars_only_in_b
            or self.scalars_differ
            or self.arrays_differ
            or self.reports_differ
            or self.checkpoint_steps[0] != self.checkpoint_steps[1]
        )

    def to_json(self) -> dict[str, Any]:
        return {"same": self.same, **dataclasses.asdict(self)}


def _key(tag_step: tuple[str, int]) -> str:
    return f"{tag_step[0]}@{tag_step[1]}"


def _same_array(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit for bit: the shape, the dtype and every element's bytes (NaNs equal to themselves)."""
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def compare(a: str | os.PathLike, b: str | os.PathLike) -> Comparison:
    """Compares run workdirs ``a`` and ``b`` (see the module's docstring for what)."""
    want, got = logged_scalars(a), logged_scalars(b)
    both = sorted(want.keys() & got.keys())
    scalars_differ = [
        f"{_key(k)}: {want[k]!r} vs {got[k]!r}"
        for k in both
        if np.float64(want[k]).tobytes() != np.float64(got[k]).tobytes()
    ]
    (step_a, state_a), (step_b, state_b) = final_state(a), final_state(b)
    arrays_differ = sorted(state_a.keys() ^ state_b.keys()) + [
        k
        for k in sorted(state_a.keys() & state_b.keys())
        if not _same_array(state_a[k], state_b[k])
    ]
    reports_a, reports_b = eval_reports(a), eval_reports(b)
    reports_differ = sorted(
        name
        for name in reports_a.keys() | reports_b.keys()
        if reports_a.get(name) != reports_b.get(name)
    )
    return Comparison(
        scalars_only_in_a=sorted(_key(k) for k in want.keys() - got.keys()),
        scalars_only_in_b=sorted(_key(k) for k in got.keys() - want.keys()),
        scalars_differ=scalars_differ,
        checkpoint_steps=(step_a, step_b),
        arrays_differ=arrays_differ,
        reports_differ=reports_differ,
        counts={
            "scalars": len(both),
            "arrays": len(state_a.keys() & state_b.keys()),
            "parameters": int(sum(v.size for v in state_a.values())),
            "reports": len(reports_a.keys() & reports_b.keys()),
        },
    )
