"""Sampler throughput against transformers' PyTorch ``generate``, same weights, same run.

    python -m launch.bench sampler --out bench_sampler.json

Workloads (tiny preset, f32, batch 32, sampling at temperature 1 with no EOS on either side so
both generate exactly the requested number of tokens):

- ``prefill_tokens_per_s``: one forward pass over 32 x 128 prompt tokens into a fresh cache
  (ours: ``step_turn`` with max_new_tokens=0; reference: the model call ``generate`` makes
  first, ``model(ids, use_cache=True, logits_to_keep=1)``).
- ``decode_tokens_per_s``: 32 rows x 32 new tokens after a 16-token prompt; decode time is
  t(32 tokens) - t(1 token) on each side, so prefill is not counted.
- ``multi_turn_episodes_per_s``: 32 episodes of 8 turns, each 64 observation tokens then 16
  action tokens. Ours keeps the cache and prefills only the new observation; the reference
  passes the whole conversation to ``generate`` every turn, as a user of ``generate`` would.
- ``matmul_peak_gflops``: a jitted 2048^3 f32 matmul, this machine's practical peak, and
  ``prefill_fraction_of_peak``: prefill model FLOPs per second over that peak.

The reference model is transformers' Qwen2ForCausalLM loaded from a checkpoint of our weights
written by ``save_hf_checkpoint``; the run fails if its logits differ from ours by over 1e-4.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from agentrl_jax.benchmarks.report import Report, Row, peak_rss_mb, timed
from agentrl_jax.models.config import ModelConfig, preset
from agentrl_jax.sampling import Sampler, SamplingParams
from agentrl_jax.sampling.testing import random_policy


@dataclasses.dataclass(frozen=True)
class Sizes:
    num_layers: int = 4  # the tiny preset's
    batch: int = 32
    prefill_len: int = 128
    decode_prompt: int = 16
    decode_new: int = 32
    turns: int = 8
    obs_len: int = 64
    action_len: int = 16
    matmul_n: int = 2048
    repeats: int = 2  # timed runs of our side (median); the slower reference runs once


QUICK = Sizes(
    num_layers=1,
    batch=4,
    prefill_len=16,
    decode_prompt=8,
    decode_new=4,
    turns=2,
    obs_len=8,
    action_len=4,
    matmul_n=256,
    repeats=1,
)


def run(quick: bool) -> Report:
    sizes = QUICK if quick else Sizes()
    cfg = preset("tiny", num_layers=sizes.num_layers)
    policy = random_policy(cfg, std=0.02)
    reference = _reference_model(policy)
    sampler = Sampler(policy, sampling=SamplingParams(temperature=1.0))
    rng = np.random.default_rng(0)
    report = Report("sampler")
    report.facts["weights_max_abs_logit_diff"] = _check_same_weights(policy, reference, cfg, rng)

    peak = _matmul_peak_gflops(sizes.matmul_n)
    report.add(Row("matmul_peak_gflops", peak, None, "GFLOP/s", extra={"n": sizes.matmul_n}))

    prefill_s, prefill_ref_s = _prefill(sampler, reference, cfg, sizes, rng)
    tokens = sizes.batch * sizes.prefill_len
    report.add(
        Row(
            "prefill_tokens_per_s",
            tokens / prefill_s,
            tokens / prefill_ref_s,
            "tokens/s",
            extra={"batch": sizes.batch, "prompt_len": sizes.prefill_len},
        )
    )
    flops = tokens * _prefill_flops_per_token(cfg, sizes.prefill_len)
    report.add(
        Row(
            "prefill_fraction_of_peak",
            flops / prefill_s / (peak * 1e9),
            flops / prefill_ref_s / (peak * 1e9),
            "fraction",
            extra={"target": 0.4, "model_gflop": flops / 1e9},
        )
    )

    ours_s, ref_s = _decode(sampler, reference, cfg, sizes, rng)
    tokens = sizes.batch * (sizes.decode_new - 1)
    report.add(
        Row(
            "decode_tokens_per_s",
            tokens / ours_s,
            tokens / ref_s,
            "tokens/s",
            extra={"batch": sizes.batch, "new_tokens": sizes.decode_new},
        )
    )

    ours_s, ref_s = _multi_turn(sampler, reference, cfg, sizes, rng)
    report.add(
        Row(
            "multi_turn_episodes_per_s",
            sizes.batch / ours_s,
            sizes.batch / ref_s,
            "episodes/s",
            extra={
                "batch": sizes.batch,
                "turns": sizes.turns,
                "obs_len": sizes.obs_len,
                "action_len": sizes.action_len,
                "target_ratio": 2.0,
            },
        )
    )
    import torch  # noqa: PLC0415 - torch is the test extra's; imported where it is needed

    report.facts.update(
        {
            "preset": "tiny" if not quick else "tiny (1 layer, quick)",
            "model_params": cfg.num_params,
            "jax_backend": jax.default_backend(),
            "torch_threads": torch.get_num_threads(),
            "compilations": sampler.num_traces,
            "peak_rss_mb": round(peak_rss_mb(), 1),
        }
    )
    return report


def _reference_model(policy):
    """transformers' Qwen2ForCausalLM from a checkpoint of the same weights."""
    import transformers  # noqa: PLC0415

    from agentrl_jax.models.hf_checkpoint import save_hf_checkpoint  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as tmp:
        save_hf_checkpoint(policy, tmp)
        model = transformers.Qwen2ForCausalLM.from_pretrained(tmp, local_files_only=True)
    return model.eval()


def _check_same_weights(policy, reference, cfg: ModelConfig, rng) -> float:
    import torch  # noqa: PLC0415

    tokens = rng.integers(0, cfg.vocab_size, (2, 24))
    ours = np.asarray(policy(jnp.asarray(tokens, jnp.int32))[0])
    with torch.inference_mode():
        ref = reference(torch.from_numpy(tokens)).logits.float().numpy()
    diff = float(np.abs(ours - ref).max())
    if diff > 1e-4:
        raise RuntimeError(
            f"reference logits differ from ours by {diff} > 1e-4: not the same model"
        )
    return diff


def _matmul_peak_gflops(n: int) -> float:
    a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n), np.float32))
    matmul = jax.jit(lambda x, y: x @ y)
    seconds = timed(lambda: matmul(a, a).block_until_ready(), repeats=5, warmup=2)
    return 2 * n**3 / seconds / 1e9


def _prefill_flops_per_token(cfg: ModelConfig, prompt_len: int) -> float:
    """Model FLOPs per prompt token: projections and MLP, plus causal attention (the average
    token attends to (P + 1) / 2 keys). The LM head is not counted: prefill does not need it."""
    d, f, n, k, h = (
        cfg.hidden_size,
        cfg.intermediate_size,
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.head_dim,
    )
    matmul_params = 2 * d * n * h + 2 * d * k * h + 3 * d * f
    attention = 2 * 2 * n * h * (prompt_len + 1) / 2
    return cfg.num_layers * (2 * matmul_params + attention)


def _random_rows(rng, cfg: ModelConfig, batch: int, length: int) -> np.ndarray:
    return rng.integers(0, cfg.vocab_size, (batch, length)).astype(np.int32)


def _generate_ref(reference, ids_np, new_tokens: int):
    import torch  # noqa: PLC0415

    ids = torch.from_numpy(ids_np.astype(np.int64))
    with torch.inference_mode():
        return reference.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            pad_token_id=0,
            eos_token_id=None,
        )


def _prefill(sampler: Sampler, reference, cfg, sizes: Sizes, rng) -> tuple[float, float]:
    import torch  # noqa: PLC0415

    prompts = _random_rows(rng, cfg, sizes.batch, sizes.prefill_len)
    key = jax.random.key(0)

    def ours():
        cache = sampler.start(sizes.batch, sizes.prefill_len)
        sampler.step_turn(cache, prompts, 0, key).cache.k.block_until_ready()

    ids = torch.from_numpy(prompts.astype(np.int64))

    def ref():
        with torch.inference_mode():
            reference(ids, attention_mask=torch.ones_like(ids), use_cache=True, logits_to_keep=1)

    return timed(ours, repeats=sizes.repeats), timed(ref, repeats=1)


def _decode(sampler: Sampler, reference, cfg, sizes: Sizes, rng) -> tuple[float, float]:
    prompts = _random_rows(rng, cfg, sizes.batch, sizes.decode_prompt)
    size = sizes.decode_prompt + sizes.decode_new

    def ours(new):
        def fn():
            cache = sampler.start(sizes.batch, size)
            sampler.step_turn(cache, prompts, new, jax.random.key(new)).tokens.block_until_ready()

        return timed(fn, repeats=sizes.repeats)

    def ref(new):
        return timed(lambda: _generate_ref(reference, prompts, new), repeats=1, warmup=0)

    _generate_ref(reference, prompts, 1)  # warm-up: torch's first call allocates

    return ours(sizes.decode_new) - ours(1), ref(sizes.decode_new) - ref(1)


def _multi_turn(sampler: Sampler, reference, cfg, sizes: Sizes, rng) -> tuple[float, float]:
    obs = [_random_rows(rng, cfg, sizes.batch, sizes.obs_len) for _ in range(sizes.turns)]
    size = sizes.turns * (sizes.obs_len + sizes.action_len)

    def ours(turns):
        cache = sampler.start(sizes.batch, size)
        for turn in range(turns):
            out = sampler.step_turn(cache, obs[turn], sizes.action_len, jax.random.key(turn))
            np.asarray(out.tokens)  # the actions go to the environments on the host
            cache = out.cache

    def ref():
        conversation = np.zeros((sizes.batch, 0), np.int32)
        for turn in range(sizes.turns):
            conversation = np.concatenate([conversation, obs[turn]], axis=1)
            conversation = _generate_ref(reference, conversation, sizes.action_len).numpy()

    ours(1)  # compiles: every turn has the same shape buckets
    ours_s = timed(lambda: ours(sizes.turns), repeats=sizes.repeats, warmup=0)
    t0 = time.perf_counter()
    ref()  # one episode: the reference is slow and needs no warm-up compilation
    return ours_s, time.perf_counter() - t0
