"""Logit processing against transformers' own warpers, and the sampling frequencies."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from agentrl_jax.sampling import GREEDY, SamplingParams
from agentrl_jax.sampling.logits import draw, fold_in, inverse_cdf, processed_logprobs


def hf_logprobs(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The reference: Hugging Face's warpers in generate's order, then log_softmax."""
    scores = torch.from_numpy(logits)
    scores = TemperatureLogitsWarper(params.temperature)(None, scores)
    if params.top_k:
        scores = TopKLogitsWarper(params.top_k)(None, scores)
    if params.top_p < 1.0:
        scores = TopPLogitsWarper(params.top_p)(None, scores)
    return torch.log_softmax(scores, dim=-1).numpy()


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.6),
        SamplingParams(temperature=1.0, top_k=1),
        SamplingParams(temperature=0.8, top_k=7),
        SamplingParams(temperature=1.3, top_p=0.5),
        SamplingParams(temperature=0.7, top_k=20, top_p=0.9),
    ],
)
def test_processed_logprobs_match_transformers(params):
    rng = np.random.default_rng(0)
    logits = (3.0 * rng.standard_normal((6, 64))).astype(np.float32)
    ours = np.asarray(processed_logprobs(jnp.asarray(logits), params))
    ref = hf_logprobs(logits, params)
    np.testing.assert_array_equal(np.isfinite(ours), np.isfinite(ref))
    kept = np.isfinite(ref)
    np.testing.assert_allclose(ours[kept], ref[kept], rtol=0, atol=1e-5)
    if params.top_k:
        assert (kept.sum(-1) <= params.top_k).all()


def test_draw_frequencies_follow_the_processed_distribution():
    params = SamplingParams(temperature=0.9, top_k=5, top_p=0.8)
    logits_v = np.array([2.0, 1.5, 1.0, 0.5, 0.2, 0.1, -1.0, 3.0], np.float32)
    n = 40_000
    tokens, logprob, policy = jax.jit(lambda k, x: draw(k, x, params))(
        jax.random.key(0), jnp.broadcast_to(jnp.asarray(logits_v), (n, 8))
    )
    expected = np.exp(hf_logprobs(logits_v[None], params)[0])
    freq = np.bincount(np.asarray(tokens), minlength=8) / n
    # 4 standard errors of a frequency of n draws at p = 0.5.
    np.testing.assert_allclose(freq, expected, rtol=0, atol=4 * 0.5 / np.sqrt(n))
    assert freq[expected == 0].sum() == 0  # filtered tokens are never drawn
    tokens = np.asarray(tokens)
    np.testing.assert_allclose(np.asarray(logprob), np.log(expected[tokens]), rtol=0, atol=1e-5)
    ref_policy = np.asarray(jax.nn.log_softmax(jnp.asarray(logits_v)))[tokens]
    np.testing.assert_allclose(np.asarray(policy), ref_policy, rtol=0, atol=1e-6)


def test_a_row_with_its_own_key_draws_the_same_in_any_batch():
    params = SamplingParams(temperature=1.0)
    sample = jax.jit(lambda k, x: draw(k, x, params)[:2])
    logits = (2.0 * np.random.default_rng(2).standard_normal((6, 16))).astype(np.float32)
    keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(5), i))(jnp.arange(6))
    tokens, logprob = map(np.asarray, sample(keys, jnp.asarray(logits)))
    assert len(set(tokens.tolist())) > 1  # the rows' keys differ (not vacuous)
    # Rows 0..2 moved to the end of a batch whose other rows are new: they draw the same.
    other = (2.0 * np.random.default_rng(3).standard_normal((3, 16))).astype(np.float32)
    mixed_keys = jnp.concatenate([jax.random.split(jax.random.key(9), 3), keys[:3]])
    got, got_lp = map(
        np.asarray, sample(mixed_keys, jnp.asarray(np.concatenate([other, logits[:3]])))
    )
    np.testing.assert_array_equal(got[3:], tokens[:3])
    np.testing.assert_array_equal(got_lp[3:], logprob[:3])
    # Folding the step into per-row keys folds it into each: row r's key stays row r's.
    np.testing.assert_array_equal(
        jax.random.key_data(fold_in(keys, 3))[2],
        jax.random.key_data(jax.random.fold_in(keys[2], 3)),
    )


def test_greedy_draws_the_argmax():
    logits = np.random.default_rng(1).standard_normal((5, 32)).astype(np.float32)
    tokens, logprob, policy = draw(jax.random.key(0), jnp.asarray(logits), GREEDY)
    np.testing.assert_array_equal(np.asarray(tokens), logits.argmax(-1))
    assert (np.asarray(logprob) == 0).all()
    ref = np.asarray(jax.nn.log_softmax(jnp.asarray(logits)))[np.arange(5), logits.argmax(-1)]
    np.testing.assert_allclose(np.asarray(policy), ref, rtol=0, atol=1e-6)


def test_bad_sampling_params_are_clear_errors():
    with pytest.raises(ValueError, match="top_p=0.0: expected in"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="top_k=-1"):
        SamplingParams(top_k=-1)
    with pytest.raises(ValueError, match="temperature=-0.5"):
        SamplingParams(temperature=-0.5)


def test_inverse_cdf_draws_across_blocks_and_never_a_zero_probability_token():
    # 300 tokens in blocks of 16 (19 blocks, the last one padded), a third of them masked.
    rng = np.random.default_rng(4)
    logits = rng.standard_normal(300).astype(np.float32)
    logits[rng.random(300) < 0.33] = -np.inf
    probs = np.exp(logits - logits[np.isfinite(logits)].max())
    n = 200_000
    u = jax.random.uniform(jax.random.key(1), (n,))
    tokens = np.asarray(
        jax.jit(lambda u, p: inverse_cdf(u, p, block=16))(
            u, jnp.broadcast_to(jnp.asarray(probs), (n, 300))
        )
    )
    expected = probs / probs.sum()
    freq = np.bincount(tokens, minlength=300) / n
    assert freq[expected == 0].sum() == 0
    # 5 standard errors of each token's own frequency.
    np.testing.assert_array_less(np.abs(freq - expected), 5 * np.sqrt(expected / n) + 1e-12)


def test_inverse_cdf_at_the_edges_of_the_unit_interval():
    # Mass only in the middle of a block; u at 0 and just below 1 land on its first and last
    # positive tokens, never on the zero-probability tokens around them.
    probs = np.zeros((1, 64), np.float32)
    probs[0, [21, 22, 27]] = [0.25, 0.5, 0.25]
    for u, token in ((0.0, 21), (np.float32(1) - np.float32(2**-24), 27), (0.5, 22)):
        got = inverse_cdf(jnp.asarray([u], jnp.float32), jnp.asarray(probs), block=16)
        assert int(got[0]) == token, (u, int(got[0]))
    # Stress: probabilities over 30 orders of magnitude with zeros between them, and targets up
    # to the top of [0, 1): every draw lands on a token of positive probability.
    rng = np.random.default_rng(5)
    probs = (10.0 ** rng.uniform(-30, 0, (256, 4096))).astype(np.float32)
    probs[rng.random(probs.shape) < 0.5] = 0.0
    u = np.concatenate([np.full(128, np.float32(1) - np.float32(2**-24)), rng.random(128)])
    got = np.asarray(inverse_cdf(jnp.asarray(u, jnp.float32), jnp.asarray(probs)))
    assert (probs[np.arange(256), got] > 0).all()
