"""The SFT data benchmark's plumbing, on its quick workload."""

from agentrl_jax.benchmarks import sft_data as bench


def test_quick_benchmark_reports_pipeline_padding_and_updates():
    report = bench.run(quick=True)
    rows = {r.workload: r for r in report.rows}
    assert set(rows) == {"pipeline batches/s", "padding efficiency", "sft_step real tokens/s"}
    for row in rows.values():
        assert row.ours > 0 and row.reference > 0 and row.ratio == row.ours / row.reference
    pad = rows["padding efficiency"]
    # Bucketing pads to at most the fixed width, so it never wastes more than fixed padding.
    assert 0 < pad.reference <= pad.ours <= pad.extra["ours_group_by_length_8"] <= 1
    assert sum(pad.extra["buckets_used"].values()) == 6  # 24 demonstrations, batches of 4
    assert rows["sft_step real tokens/s"].extra["compiles_bucketed"] == len(
        pad.extra["buckets_used"]
    )
    assert report.facts["demonstrations"] == 24
