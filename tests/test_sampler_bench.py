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
    "decode_tokens_per_s_cache_64": "tokens/s",
    "decode_tokens_per_s_cache_128": "tokens/s",
    "decode_128_over_64": "fraction",
    "decode_128_over_64_read_bound": "fraction",
    "multi_turn_episodes_per_s": "episodes/s",
    "long_episode_episodes_per_s": "episodes/s",
    "group_first_turn_rows_per_s": "rows/s",
    "lora_merged_multi_turn_episodes_per_s": "episodes/s",
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
        if name.endswith("_read_bound"):
            # Ours only: the step at 64 slots over that step plus reading the extra slots.
            assert row["reference"] is None and 0 < row["ours"] <= 1
            assert row["ours"] == pytest.approx(
                row["step_ms_short"] / (row["step_ms_short"] + row["extra_read_ms"]), rel=1e-3
            )
            continue
        if name.startswith("decode_"):
            # t(N tokens) - t(1 token): at the quick sizes (N = 4) timing noise on a loaded
            # machine can swamp the difference, so only the plumbing is checked here.
            assert np.isfinite([row["ours"], row["reference"]]).all()
            continue
        assert row["ours"] > 0, name
        if name != "matmul_peak_gflops":
            assert row["reference"] > 0 and row["ratio"] == pytest.approx(
                row["ours"] / row["reference"]
            ), name
        if "ours_s" in row:
            # Both sides timed alternately, the same number of times.
            assert len(row["ours_s"]) == len(row["reference_s"]) == data["facts"]["repeats"]
    # The reference really ran our weights; the machine's load is on record.
    assert data["facts"]["weights_max_abs_logit_diff"] <= 1e-4
    assert data["facts"]["peak_rss_mb"] > 0
    assert len(data["facts"]["load_average_start"]) == len(data["facts"]["load_average_end"]) == 3
    assert "multi_turn_episodes_per_s" in report.table()


def test_cache_read_reads_every_layers_keys_and_values():
    """The read bound times a sum over exactly the bytes a decode step's attention reads."""
    from agentrl_jax.models.config import preset  # noqa: PLC0415

    cfg = preset("tiny", num_layers=2)
    seconds, nbytes = bench._cache_read_seconds(cfg, batch=3, slots=16)
    assert seconds > 0
    assert nbytes == 2 * 2 * 3 * cfg.num_kv_heads * 16 * cfg.head_dim * 4  # K and V, 2 layers, f32
