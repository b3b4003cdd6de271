"""The before/after table the main job prints: held-out success after SFT alone and after RL."""

from __future__ import annotations

from typing import Any


def before_after_markdown(evals: dict[str, Any]) -> str:
    """A markdown table, one row per evaluation level, from the trainer's ``meta['evals']``."""
    before, after = evals.get("after_sft", {}), evals.get("after_rl", {})
    levels = list(dict.fromkeys([*before, *after]))
    lines = [
        "| held-out level | episodes | success after SFT | success after SFT + RL | change |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for level in levels:
        b = before.get(level, {}).get("success_rate")
        a = after.get(level, {}).get("success_rate")
        n = (after.get(level) or before.get(level) or {}).get("episodes", 0)
        change = "" if a is None or b is None else f"{100 * (a - b):+.1f} pts"
        lines.append(f"| {level} | {n} | {_pct(b)} | {_pct(a)} | {change} |")
    return "\n".join(lines)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"
