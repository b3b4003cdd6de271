"""The env benchmark's plumbing, on a quick TextWorld workload and a stand-in ALFWorld hook."""

import sys
import types

import pytest

from agentrl_jax.benchmarks import envs as bench
from agentrl_jax.benchmarks.report import Row

pytestmark = pytest.mark.filterwarnings("ignore:.*is not fully supported")


def test_quick_benchmark_reports_textworld_and_the_alfworld_hook(textworld_games, monkeypatch):
    monkeypatch.setenv("AGENTRL_CACHE", str(textworld_games["root"]))  # Games already made.
    fake = types.ModuleType("fake_alfworld_bench")
    fake.bench_rows = lambda quick: [Row("alfworld steps/s", 2.0, 1.0, "steps/s")]
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    monkeypatch.setattr(bench, "ALFWORLD_HOOKS", ("no_such_module_xyz", fake.__name__))
    report = bench.run(quick=True)
    rows = {r.workload: r for r in report.rows}
    assert set(rows) == {
        "textworld simple resets/s",
        "textworld simple steps/s",
        "alfworld steps/s",
    }
    for name in ("textworld simple resets/s", "textworld simple steps/s"):
        row = rows[name]
        assert row.ours > 0 and row.reference > 0 and row.ratio == row.ours / row.reference
        assert row.extra == {"workers": 2, "envs_per_worker": 1}
    assert report.facts["cores"] >= 1
    assert report.facts["textworld simple: resets done (ours, reference)"] == "2, 2"
    assert report.facts["textworld simple: steps done (ours, reference)"] == "6, 6"
    assert report.facts["textworld simple: infrastructure failures"] == 0
    assert report.facts["alfworld"] == "rows from fake_alfworld_bench.bench_rows"
    assert "what limits the pool" in report.facts
    saved = report.to_json()["workloads"]["textworld simple steps/s"]
    assert set(saved) >= {"ours", "reference", "ratio", "unit"}


def test_alfworld_hook_failure_is_reported_not_raised(monkeypatch):
    broken = types.ModuleType("broken_alfworld_bench")

    def bench_rows(quick):
        raise FileNotFoundError("no ALFWorld data")

    broken.bench_rows = bench_rows
    monkeypatch.setitem(sys.modules, broken.__name__, broken)
    monkeypatch.setattr(bench, "ALFWORLD_HOOKS", (broken.__name__,))
    rows, status = bench._alfworld(quick=True)
    assert rows == [] and "FileNotFoundError: no ALFWorld data" in status
    monkeypatch.setattr(bench, "ALFWORLD_HOOKS", ("no_such_module_xyz",))
    assert bench._alfworld(quick=True)[1].startswith("skipped: no bench_rows")
