"""A benchmark report: rows measured side by side against a reference, printed and saved."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import resource
import time
from typing import Any


@dataclasses.dataclass
class Row:
    """One workload measured on our side and on the reference side, in the same run.

    ``higher_is_better`` says which way the ratio reads: ratio = ours / reference when higher is
    better (throughput), reference / ours otherwise (latency), so a ratio above 1 is always a win.
    """

    workload: str
    ours: float
    reference: float | None
    unit: str
    higher_is_better: bool = True
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        if self.reference is None or self.reference == 0 or self.ours == 0:
            return None
        if self.higher_is_better:
            return self.ours / self.reference
        return self.reference / self.ours

    def to_json(self) -> dict[str, Any]:
        return {
            "ours": self.ours,
            "reference": self.reference,
            "ratio": self.ratio,
            "unit": self.unit,
            "higher_is_better": self.higher_is_better,
            **self.extra,
        }


@dataclasses.dataclass
class Report:
    """A named list of rows plus free-form facts (machine peak, memory, core count)."""

    name: str
    rows: list[Row] = dataclasses.field(default_factory=list)
    facts: dict[str, Any] = dataclasses.field(default_factory=dict)

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        return row

    def table(self) -> str:
        header = f"{'workload':<40} {'ours':>14} {'reference':>14} {'ratio':>8}  unit"
        lines = [f"== benchmark: {self.name} ==", header, "-" * len(header)]
        for r in self.rows:
            ref = "-" if r.reference is None else f"{r.reference:14.4g}"
            ratio = "-" if r.ratio is None else f"{r.ratio:8.2f}"
            lines.append(f"{r.workload:<40} {r.ours:14.4g} {ref:>14} {ratio:>8}  {r.unit}")
        for k, v in self.facts.items():
            lines.append(f"{k}: {v}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "benchmark": self.name,
            "workloads": {r.workload: r.to_json() for r in self.rows},
            "facts": self.facts,
            "machine": machine_facts(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }

    def write(self, path: str) -> None:
        """Writes the JSON atomically (a crash never leaves half a file)."""
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.to_json(), f, indent=2, sort_keys=True)
        os.replace(tmp, path)


def machine_facts() -> dict[str, Any]:
    return {
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "peak_rss_mb": peak_rss_mb(),
    }


def peak_rss_mb() -> float:
    """Peak resident memory of this process (and waited-for children), in MiB."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) / 1024.0


def timed(fn, *, repeats: int = 3, warmup: int = 1) -> float:
    """Median wall-clock seconds of ``fn()`` over ``repeats`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]
