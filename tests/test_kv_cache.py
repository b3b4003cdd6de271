"""The KV cache's layout and its slots allocated as a conversation grows.

The cache is kept between turns in the layout attention reads (one array per layer, keys
slot-minor), and a sampler allocates its slots a power of two at a time: a turn attends over the
allocated slots only. These tests check that what a caller sees does not depend on how many slots
happen to be allocated, and that the allocation follows the conversation.
"""

import jax
import numpy as np
import pytest

from agentrl_jax.models import KVCache, decoder
from agentrl_jax.sampling import Sampler, SamplingParams
from agentrl_jax.sampling.testing import SMALL, random_policy

# Two samplers over the same 512 reserved slots: one allocates them as the conversation grows
# (from 32), the other holds all of them from the start (its first bucket is the cache size).
GROWING = dict(cache_buckets=[32, 512], chunk_buckets=[16, 32], width_buckets=[8])
WHOLE = dict(cache_buckets=[512], chunk_buckets=[16, 32], width_buckets=[8])


@pytest.fixture(scope="module")
def model():
    return random_policy()


def play(sampler, turns, seed=0):
    """Four episodes of ``turns`` turns; per turn the outputs and the cache's allocated slots."""
    rng = np.random.default_rng(seed)
    cache = sampler.start(4, 300)
    outs = []
    for turn in range(turns):
        new = [rng.integers(1, SMALL.vocab_size, n).tolist() for n in (9, 30, 1, 17)]
        out = sampler.step_turn(cache, new, 8, jax.random.key(turn))
        cache = out.cache
        outs.append((out.token_lists(), np.asarray(out.policy_logprobs), cache.slots))
    return outs, cache


def test_slots_are_allocated_a_power_of_two_at_a_time_and_change_nothing_a_caller_sees(model):
    sampling = SamplingParams(temperature=1.0)
    growing, grown = play(Sampler(model, sampling=sampling, **GROWING), turns=6)
    whole, full = play(Sampler(model, sampling=sampling, **WHOLE), turns=6)
    # Rows fill up to 38 slots a turn (30 new + 8 generated): 32 -> 64 -> 128 -> 256 slots.
    assert [slots for *_, slots in growing] == [64, 128, 128, 256, 256, 256]
    assert {slots for *_, slots in whole} == {512}
    assert (grown.size, full.size) == (512, 512)
    for (tokens, logprobs, _), (ref_tokens, ref_logprobs, _) in zip(growing, whole):
        assert tokens == ref_tokens
        np.testing.assert_allclose(logprobs, ref_logprobs, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(grown.lengths), np.asarray(full.lengths))
    # The inspection views have the reserved size whatever is allocated, and the same content.
    for name in ("k", "v"):
        got, ref = np.asarray(getattr(grown, name)), np.asarray(getattr(full, name))
        assert got.shape == ref.shape == (SMALL.num_layers, 4, 512, SMALL.num_kv_heads, 16)
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5)


def test_layout_and_allocation_errors():
    cache = KVCache.create(SMALL, batch=3, size=128, slots=32)
    kh = (SMALL.num_kv_heads, SMALL.head_dim)
    assert [k.shape for k in cache.keys] == [(3, *kh, 32)] * SMALL.num_layers
    assert [v.shape for v in cache.values] == [(3, kh[0], 32, kh[1])] * SMALL.num_layers
    assert (cache.size, cache.slots, cache.batch) == (128, 32, 3)
    grown = cache.with_slots(96)
    assert (grown.size, grown.slots) == (128, 96)
    with pytest.raises(ValueError, match=r"slots=16, expected in \[32, capacity=128\]"):
        cache.with_slots(16)
    with pytest.raises(ValueError, match=r"slots=256, expected in \[32, capacity=128\]"):
        cache.with_slots(256)
    with pytest.raises(ValueError, match=r"slots=0, expected in \[1, size=128\]"):
        KVCache.create(SMALL, batch=3, size=128, slots=0)


def test_grow_reserves_more_without_copying(model):
    sampler = Sampler(model, **GROWING)
    cache = sampler.step_turn(sampler.start(2, 32), [[1, 2, 3], [4]], 4, jax.random.key(0)).cache
    grown = sampler.grow(cache, 400)
    assert (grown.size, grown.slots) == (512, cache.slots)
    assert all(a is b for a, b in zip(grown.keys, cache.keys))
    with pytest.raises(ValueError, match="smaller than the cache"):
        sampler.grow(grown, 30)


def test_a_long_prefill_attends_in_query_chunks_equal_to_one_pass(model, monkeypatch):
    rng = np.random.default_rng(1)
    first = [rng.integers(1, SMALL.vocab_size, n).tolist() for n in (20, 3, 32, 11)]
    second = [rng.integers(1, SMALL.vocab_size, n).tolist() for n in (32, 7, 1, 25)]

    def two_turns():
        sampler = Sampler(model, sampling=SamplingParams(temperature=1.0), **GROWING)
        cache = sampler.start(4, 300)
        cache = sampler.step_turn(cache, first, 8, jax.random.key(0)).cache
        out = sampler.step_turn(cache, second, 8, jax.random.key(1))
        return out.token_lists(), np.asarray(out.policy_logprobs), np.asarray(out.cache.k)

    whole = two_turns()
    # 32-token chunks over 64 and then 128 slots go in query chunks of 16 (the smallest).
    monkeypatch.setattr(decoder, "_SCORES_PER_CHUNK", 8 * 64)
    chunks = []
    lax_map = jax.lax.map
    monkeypatch.setattr(
        jax.lax, "map", lambda f, xs: chunks.append(xs[0].shape[0]) or lax_map(f, xs)
    )
    chunked = two_turns()
    # Both turns' prefills, every layer but the last (whose one query per row needs no chunks).
    assert chunks == [2] * 2 * (SMALL.num_layers - 1)
    assert chunked[0] == whole[0]
    for got, ref in zip(chunked[1:], whole[1:]):
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5)
