"""The advantages benchmark runs end to end (quick sizes) and its rows agree with the loops."""

import json
import math

from agentrl_jax.benchmarks import advantages


def test_quick_benchmark_rows(tmp_path):
    report = advantages.run(quick=True)
    names = [r.workload.split(" ")[0] for r in report.rows]
    assert names == ["grpo", "rloo", "gigpo", "gagpo", "gae", "reinforce_pp"]
    for row in report.rows:
        assert row.ours > 0 and row.reference > 0 and row.ratio > 0, row
        assert row.unit == "ms per batch" and not row.higher_is_better
        # Ours and the Python loop computed the same advantages.
        assert row.extra["max_abs_diff_vs_reference"] <= 1e-5, row
        assert row.extra["fraction_of_memory_bandwidth"] > 0 and row.extra["bytes_moved"] > 0
        # The reference is the loop as papers print it, and the JSON says so.
        assert "numpy arrays" in row.extra["reference_form"], row
    assert report.facts["memory_bandwidth_GBps"] > 0
    out = tmp_path / "bench.json"
    report.write(str(out))
    data = json.loads(out.read_text())
    row = data["workloads"]["gagpo (256x16 steps)"]
    assert {"ours", "reference", "ratio", "unit"} <= set(row)
    assert math.isclose(row["ratio"], row["reference"] / row["ours"])
