"""The failure breakdown's lost episodes against the same games after SFT (``failures.sft_start``):
which of them RL's policy lost that SFT's had lost already (``experiments/failures.py``)."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class SftStart:
    """The lost episodes against the same games after SFT.

    Attributes:
      per_category: per category (and ``all``): ``lost_after_sft`` (SFT's policy had lost the
        game too), ``won_after_sft`` (RL lost a game SFT had won), ``not_evaluated`` (no
        after-SFT outcome for the game).
    """

    per_category: dict[str, dict[str, int]]

    def to_json(self) -> dict[str, Any]:
        return {c: dict(v) for c, v in self.per_category.items()}

    def markdown(self) -> str:
        lines = [
            "| category | lost after SFT too | won after SFT | not evaluated after SFT |",
            "|---|---:|---:|---:|",
        ]
        for c, v in self.per_category.items():
            if c == "all" or any(v.values()):
                label = "**all**" if c == "all" else c
                lines.append(
                    f"| {label} | {v['lost_after_sft']} | {v['won_after_sft']} "
                    f"| {v['not_evaluated']} |"
                )
        return "\n".join(lines)
