"""A curriculum over task complexity levels: a mixture per stage, advanced by schedule or success.

Each stage is a mixture of levels (for example simple and medium 50/50, as the multi-turn
practitioner's guide recommends, with evaluation on hard). A stage ends after a fixed number of
iterations, or - with ``advance_at`` - as soon as the rolling success rate of the stage's tasks
passes the threshold. The state is plain JSON so checkpoints carry it.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class CurriculumConfig:
    """Attributes:
    stages: per stage, a mapping level -> mixture weight (weights are normalised).
    stage_iterations: iterations per stage (None: only success advances; the last stage lasts).
    advance_at: advance when the rolling success over ``window`` episodes reaches this (or None).
    window: episodes in the rolling success rate.
    """

    stages: tuple[tuple[tuple[str, float], ...], ...]
    stage_iterations: tuple[int, ...] | None = None
    advance_at: float | None = None
    window: int = 64

    def __post_init__(self):
        if not self.stages:
            raise ValueError("curriculum.stages is empty; expected at least one stage")
        for i, stage in enumerate(self.stages):
            if not stage or any(w < 0 for _, w in stage) or sum(w for _, w in stage) <= 0:
                raise ValueError(
                    f"curriculum.stages[{i}] is {stage!r}; expected (level, weight) pairs with "
                    "non-negative weights and a positive sum"
                )
        if self.stage_iterations is not None and len(self.stage_iterations) != len(self.stages):
            raise ValueError(
                f"curriculum.stage_iterations has {len(self.stage_iterations)} entries; expected "
                f"one per stage ({len(self.stages)})"
            )
        if self.advance_at is not None and not 0.0 < self.advance_at <= 1.0:
            raise ValueError(f"curriculum.advance_at is {self.advance_at}; expected in (0, 1]")

    @property
    def levels(self) -> list[str]:
        return sorted({level for stage in self.stages for level, _ in stage})


class Curriculum:
    def __init__(self, config: CurriculumConfig):
        self.config = config
        self.stage = 0
        self.stage_iteration = 0
        self._recent: collections.deque[bool] = collections.deque(maxlen=config.window)

    def mixture(self) -> dict[str, float]:
        stage = self.config.stages[self.stage]
        total = sum(w for _, w in stage)
        return {level: w / total for level, w in stage}

    def sample_levels(self, n: int, rng: np.random.Generator) -> list[str]:
        """Levels of the next ``n`` tasks: the mixture's exact proportions, in shuffled order."""
        mix = self.mixture()
        levels = list(mix)
        counts = np.floor(np.asarray([mix[lv] for lv in levels]) * n).astype(int)
        # Largest remainders get the leftover slots, so small batches follow the mixture closely.
        remainders = np.asarray([mix[lv] for lv in levels]) * n - counts
        for i in np.argsort(-remainders, kind="stable")[: n - counts.sum()]:
            counts[i] += 1
        out = [lv for lv, c in zip(levels, counts) for _ in range(c)]
        rng.shuffle(out)
        return out

    def update(self, successes: list[bool]) -> bool:
        """Records one iteration's episode outcomes; returns True when the stage advanced."""
        self._recent.extend(bool(s) for s in successes)
        self.stage_iteration += 1
        last = self.stage == len(self.config.stages) - 1
        if last:
            return False
        by_schedule = (
            self.config.stage_iterations is not None
            and self.stage_iteration >= self.config.stage_iterations[self.stage]
        )
        by_success = (
            self.config.advance_at is not None
            and len(self._recent) == self._recent.maxlen
            and self.success_rate() >= self.config.advance_at
        )
        if by_schedule or by_success:
            self.stage += 1
            self.stage_iteration = 0
            self._recent.clear()
            return True
        return False

    def success_rate(self) -> float:
        return float(np.mean(self._recent)) if self._recent else 0.0

    def state_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "stage_iteration": self.stage_iteration,
            "recent": [int(x) for x in self._recent],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stage = int(state["stage"])
        self.stage_iteration = int(state["stage_iteration"])
        self._recent = collections.deque(
            (bool(x) for x in state["recent"]), maxlen=self.config.window
        )
