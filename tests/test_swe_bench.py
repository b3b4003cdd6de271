"""The SWE benchmark runs (quick) and reports ours / reference / ratio / unit per workload."""

from agentrl_jax.benchmarks import swe


def test_swe_benchmark_quick():
    report = swe.run(quick=True)
    rows = {r.workload: r for r in report.rows}
    assert "evaluations_per_minute" in rows
    assert any(name.startswith("sandbox_overhead_") for name in rows)
    for row in report.rows:
        assert row.ours > 0 and row.reference > 0 and row.ratio is not None
        js = row.to_json()
        assert {"ours", "reference", "ratio", "unit"} <= set(js)
    for name, row in rows.items():
        if name.startswith("sandbox_overhead_"):
            assert row.unit == "ms/command" and not row.higher_is_better
            assert row.extra["overhead_ms"] == row.ours - row.reference
    ev = rows["evaluations_per_minute"]
    assert ev.unit == "evaluations/min" and ev.higher_is_better
    assert ev.ours <= ev.reference * 1.5  # the sandboxed evaluation does strictly more work
