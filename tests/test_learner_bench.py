"""The learner benchmark's plumbing, on its quick workload (the `:test` config's shapes)."""

import pytest

from agentrl_jax.benchmarks import learner as bench


@pytest.mark.slow  # compiles the update twice over (ours and the reference); plumbing only
def test_quick_benchmark_times_the_real_update_against_one_program():
    report = bench.run(quick=True)
    row, lora, long = report.rows
    assert row.workload == "rl_update_tokens_per_s"
    assert row.ours > 0 and row.reference > 0 and row.ratio == row.ours / row.reference
    # Both sides ran the same number of minibatch steps over the same padded rows.
    assert row.extra["updates"] == row.extra["minibatch_steps"] > 0
    assert 0 < row.extra["real_tokens"] < row.extra["padded_tokens"]
    assert row.extra["episodes"] == 4  # 2 tasks x 2 rollouts
    # The LoRA update against the full one, on the same episodes: adapters alone trained.
    assert lora.workload == "lora_rl_update_tokens_per_s"
    assert lora.ours > 0 and lora.reference > 0 and lora.ratio == lora.ours / lora.reference
    assert lora.extra["lora_rank"] == bench.LORA_RANK and lora.extra["lora_targets"] == "all"
    assert 0 < lora.extra["trained_params"] < lora.extra["full_params"]
    assert lora.extra["updates"] == lora.extra["full_updates"] == row.extra["updates"]
    assert long.workload == "long_teacher_forcing_tokens_per_s"  # its own test below


@pytest.mark.slow  # compiles a 2,048-token forward and backward pass twice
def test_quick_long_row_times_causal_bands_against_one_pass():
    long = bench._long_row(quick=True)
    assert long.workload == "long_teacher_forcing_tokens_per_s"
    assert long.ours > 0 and long.reference > 0 and long.ratio == long.ours / long.reference
    assert long.extra["rows"] * long.extra["row_length"] == 2048
    # A 2,048-token row's queries go in 4 chunks of 512: 4 bands, one chunk each, attending
    # (4 + 1) / (2 * 4) = 10/16 of the (query, key) pairs one pass attends.
    assert long.extra["causal_bands"] == 4
    assert long.extra["keys_attended_ratio"] == 10 / 16
    # The same loss and gradients on both sides, up to f32 rounding.
    assert long.extra["loss_diff"] <= 1e-6
    assert long.extra["max_abs_grad_diff"] <= 1e-6


def test_synthetic_episodes_have_the_default_runs_shape():
    trajs = bench.synthetic_episodes(16, 4, vocab=1024, max_steps=6)
    assert len(trajs) == 64 and {t.group for t in trajs} == set(range(16))
    assert max(t.num_tokens for t in trajs) <= 768  # the default's context
    for t in trajs:
        assert 2 <= len(t.steps) <= 3 if t.won else len(t.steps) == 6
        for s in t.steps:
            assert all(a in allowed for a, allowed in zip(s.action_ids, s.action_allowed))
