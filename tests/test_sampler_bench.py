"""The sampler benchmark's plumbing, on its quick sizes."""

import json

import numpy as np
import pytest

pytest.importorskip("torch")

from agentrl_jax.benchmarks import sampler as bench  # noqa: E402

WORKLOADS = {
    "matmul_peak_gflops": "GFLOP/s",
    "prefill_tokens_per_s": "tokens/s",
    "prefill_fraction_of_peak": "fraction",
    "decode_tokens_per_s": "tokens/s",
    "multi_turn_episodes_per_s": "episodes/s",
}


def test_quick_benchmark_reports_every_workload(tmp_path):
    report = bench.run(quick=True)
    path = tmp_path / "bench.json"
    report.write(str(path))
    data = json.loads(path.read_text())
    assert set(data["workloads"]) == set(WORKLOADS)
    for name, unit in WORKLOADS.items():
        row = data["workloads"][name]
        assert row["unit"] == unit
        if name == "decode_tokens_per_s":
            # t(N tokens) - t(1 token): at the quick sizes (N = 4) timing noise on a loaded
            # machine can swamp the difference, so only the plumbing is checked here.
            assert np.isfinite([row["ours"], row["reference"]]).all()
            continue
        assert row["ours"] > 0, name
        if name != "matmul_peak_gflops":
            assert row["reference"] > 0 and row["ratio"] == pytest.approx(
                row["ours"] / row["reference"]
            ), name
    # The reference really ran our weights.
    assert data["facts"]["weights_max_abs_logit_diff"] <= 1e-4
    assert data["facts"]["peak_rss_mb"] > 0
    assert "multi_turn_episodes_per_s" in report.table()
