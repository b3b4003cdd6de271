"""The accelerator check (`launch.bench device`): its FLOP counts and, on the CPU, its plumbing."""

import jax
import pytest

from agentrl_jax.benchmarks import device as bench
from agentrl_jax.models.config import preset


@pytest.mark.parametrize("name", ["qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b"])
def test_matmul_parameters_are_the_models_parameters_less_embedding_norms_and_biases(name):
    cfg = preset(name)
    trunk, head = bench.matmul_params(cfg)
    d, kv, hd, h = cfg.hidden_size, cfg.num_kv_heads, cfg.head_dim, cfg.num_heads
    norms_and_biases = cfg.num_layers * (2 * d + (h + 2 * kv) * hd) + d
    embeddings = cfg.vocab_size * d * (1 if cfg.tie_word_embeddings else 2)
    assert trunk == cfg.num_params - embeddings - norms_and_biases
    assert head == cfg.vocab_size * d  # tied or not, the head is a [d, V] matmul


def test_flop_counts_by_hand():
    cfg = preset("tiny").replace(num_layers=1, num_heads=2, head_dim=4, vocab_size=10)
    trunk, head = bench.matmul_params(cfg)
    # One row of 2 tokens, 1 epoch, no KL: (1 old-logprob forward + 3) x the row's forward.
    forward = 2 * 2 * (trunk + head) + 4 * 1 * 2 * 4 * (1 + 2)
    assert bench.update_flops(cfg, [2], epochs=1, kl=False) == 4 * forward
    assert bench.update_flops(cfg, [2], epochs=2, kl=True) == 8 * forward
    # One turn of 1 observation + 2 action tokens: 3 tokens through the trunk attending to
    # 1, 2, 3 keys, the head on 2 of them (the observation's last token and the first action).
    sizes = bench.DeviceSizes(batch=1, turns=1, obs_len=1, action_len=2)
    assert bench.sampler_flops(cfg, sizes) == 3 * 2 * trunk + 4 * 2 * 4 * 6 + 2 * 2 * head


def test_chip_peaks_come_from_the_device_kind():
    class Chip:
        device_kind = "NVIDIA H200"

    assert bench.chip_peak_tflops(Chip()) == 989.0
    assert bench.chip_peak_tflops(jax.devices("cpu")[0]) is None


@pytest.mark.slow  # ~30 s: compiles a sampler turn and an RL update of the tiny model
def test_quick_run_measures_both_workloads_with_their_mfu():
    report = bench.run(quick=True)
    rows = {r.workload: r for r in report.rows}
    sampler, update = rows["tiny/sampler_tokens_per_s"], rows["tiny/rl_update_tokens_per_s"]
    assert sampler.ours > 0 and sampler.reference > 0  # the reference ran on the CPU
    assert sampler.extra["mfu"] > 0 and update.extra["mfu"] > 0
    assert update.extra["updates"] > 0 and update.extra["episodes"] == 4
    assert report.facts["peak_from"] == "measured bf16 matmul"


def test_sampler_roofline_by_hand():
    cfg = preset("tiny").replace(num_layers=1, num_heads=2, num_kv_heads=1, head_dim=4)
    trunk, head = bench.matmul_params(cfg)
    sizes = bench.DeviceSizes(batch=1, turns=1, obs_len=1, action_len=2)
    # Prefill of 1 token (1 key) and the head on it, at 1 TFLOP/s; then one decode step (the
    # second action token, 2 keys): weights in bf16 plus 2 tokens of bf16 keys and values, at
    # 1 TB/s, or its FLOPs where those take longer (here they do not: 1 row).
    prefill = (2 * trunk + 4 * 2 * 4 * 1 + 2 * head) / 1e12
    decode_bytes = 2 * (trunk + head) + 2 * 2 * (1 * 4) * 2  # bf16 x (k, v) x kv x hd x keys
    decode_flops = 2 * (trunk + head) + 4 * 2 * 4 * 2
    expected = prefill + max(decode_bytes, decode_flops) / 1e12
    assert bench.sampler_roofline_s(cfg, sizes, 1.0, 1.0) == pytest.approx(expected)
    # A chip with a thousand times the FLOP/s is bound by the bytes alone in the decode step.
    fast = bench.sampler_roofline_s(cfg, sizes, 1000.0, 1.0)
    assert fast == pytest.approx(prefill / 1000 + decode_bytes / 1e12)


def test_hbm_bandwidth_comes_from_the_device_kind():
    class Chip:
        device_kind = "NVIDIA H200"

    assert bench.chip_hbm_tbps(Chip()) == 4.8
    assert bench.chip_hbm_tbps(jax.devices("cpu")[0]) is None
