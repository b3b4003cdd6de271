"""The rollout benchmark's plumbing (``--quick``): every workload measured, both sides played
the same episodes."""

import pytest

from agentrl_jax.benchmarks import rollout

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:.*is not fully supported")]


def test_quick_rollout_bench_measures_every_workload_on_the_same_episodes():
    report = rollout.run(quick=True)
    rows = {r.workload: r for r in report.rows}
    assert sorted(rows) == [
        "async_iterations_per_hour",
        "async_iterations_per_hour_default_rollout",
        "env_latency_episodes_per_s",
        "env_latency_over_concurrent_waves",
    ]
    latency = rows["env_latency_episodes_per_s"]
    assert latency.extra["same_episodes"] and latency.ours > 0 and latency.reference > 0
    assert rows["env_latency_over_concurrent_waves"].ratio is not None
    # Every side's warm-up play compiles its turn programs, and no timed play compiles any.
    compiled = latency.extra["turn_programs_compiled_per_play"]
    assert sorted(compiled) == ["concurrent_waves", "ours", "reference"]
    assert compiled["ours"][0] > 0 and all(n == [n[0], 0] for n in compiled.values())
    for name in ("async_iterations_per_hour", "async_iterations_per_hour_default_rollout"):
        timed = rows[name].extra["iterations_s"]
        assert timed["ours"] and timed["reference"]  # the timed processes' steady iterations
    assert (
        "env.concurrent_steps"
        not in rows["async_iterations_per_hour_default_rollout"].extra["both"]
    )
    assert "load_average_end" in report.facts
