"""Multi-turn continuation: a cache kept across turns gives the same log-probs, logits and
keys/values as encoding the whole conversation at once, and inactive rows are untouched."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentrl_jax.models import KVCache
from agentrl_jax.sampling import DoneReason, Sampler, SamplingParams, StopConfig
from agentrl_jax.sampling.testing import SMALL, TeacherForcer, random_policy

TEMPERATURE = 0.8
# Chunks of at most 16 new tokens: a turn that re-encoded the history could not fit.
BUCKETS = dict(cache_buckets=[64], chunk_buckets=[16], width_buckets=[8])
# New tokens per row and turn; an empty list leaves the row inactive that turn.
TURN_LENGTHS = [[5, 12, 1, 9], [3, 0, 7, 2], [4, 6, 0, 16]]


@pytest.fixture(scope="module")
def model():
    return random_policy(seed=1)


def chunk_appender(model):
    """A jitted fn(cache, rows) -> (logits [B, 64, V], cache): rows appended in one pass."""
    graphdef, state = nnx.split(model)

    @jax.jit
    def run(state, cache, tokens, num_new):
        return nnx.merge(graphdef, state)(tokens, cache=cache, num_new_b=num_new)

    def append(cache: KVCache, rows: list[list[int]]):
        tokens = np.zeros((len(rows), 64), np.int32)
        for i, r in enumerate(rows):
            tokens[i, : len(r)] = r
        return run(state, cache, tokens, np.array([len(r) for r in rows], np.int32))

    return append


def test_multi_turn_continuation_equals_whole_conversation(model):
    params = SamplingParams(temperature=TEMPERATURE)
    # Frequent EOS ids make rows finish at different steps.
    stop = StopConfig(eos_ids=tuple(range(1, 256, 9)))
    sampler = Sampler(model, sampling=params, stop=stop, **BUCKETS)
    forcer = TeacherForcer(model, batch=4, length=64)
    rng = np.random.default_rng(0)
    conversation = [[] for _ in range(4)]
    cache = sampler.start(4, 64)
    reasons = set()
    for turn, lengths in enumerate(TURN_LENGTHS):
        new = [rng.integers(1, SMALL.vocab_size, n).tolist() for n in lengths]
        inactive = [b for b, n in enumerate(lengths) if n == 0]
        before = {b: (np.asarray(cache.k[:, b]), np.asarray(cache.v[:, b])) for b in inactive}
        lengths_before = np.asarray(cache.lengths)
        out = sampler.step_turn(cache, new, 6, jax.random.key(turn))
        cache = out.cache
        gens = out.token_lists()
        reasons.update(np.asarray(out.done_reason).tolist())

        logits = forcer.logits([c + n + g for c, n, g in zip(conversation, new, gens)])
        for b in range(4):
            prompt = conversation[b] + new[b]
            pos = np.arange(len(prompt) - 1, len(prompt) - 1 + len(gens[b]))
            scaled = jnp.asarray(logits[b, pos])
            np.testing.assert_allclose(
                np.asarray(out.policy_logprobs[b, : len(gens[b])]),
                np.asarray(jax.nn.log_softmax(scaled, axis=-1))[np.arange(len(pos)), gens[b]],
                rtol=0,
                atol=1e-5,
                err_msg=f"turn {turn} row {b}",
            )
            np.testing.assert_allclose(
                np.asarray(out.logprobs[b, : len(gens[b])]),
                np.asarray(jax.nn.log_softmax(scaled / TEMPERATURE, axis=-1))[
                    np.arange(len(pos)), gens[b]
                ],
                rtol=0,
                atol=1e-5,
                err_msg=f"turn {turn} row {b}",
            )
            conversation[b] = prompt + gens[b]
        for b in inactive:
            assert gens[b] == [] and int(out.done_reason[b]) == DoneReason.INACTIVE
            assert int(cache.lengths[b]) == lengths_before[b]
            np.testing.assert_array_equal(np.asarray(cache.k[:, b]), before[b][0])
            np.testing.assert_array_equal(np.asarray(cache.v[:, b]), before[b][1])
        assert np.asarray(cache.lengths).tolist() == [len(c) for c in conversation]
    assert {DoneReason.EOS, DoneReason.MAX_NEW_TOKENS, DoneReason.INACTIVE} <= reasons

    # The next chunk's logits after three turns equal teacher forcing on the whole conversation.
    tail = [rng.integers(1, SMALL.vocab_size, n).tolist() for n in (3, 1, 2, 5)]
    kept_k, kept_v = np.asarray(cache.k), np.asarray(cache.v)
    append = chunk_appender(model)
    logits, _ = append(cache, tail)
    whole = forcer.logits([c + t for c, t in zip(conversation, tail)])
    for b, (c, t) in enumerate(zip(conversation, tail)):
        np.testing.assert_allclose(
            np.asarray(logits[b, : len(t)]), whole[b, len(c) : len(c) + len(t)], rtol=0, atol=1e-5
        )

    # The keys and values kept across turns equal those of one pass over the conversation.
    fresh = KVCache.create(SMALL, 4, 64)
    _, encoded = append(fresh, conversation)
    for b, c in enumerate(conversation):
        for kept, ref in ((kept_k, encoded.k), (kept_v, encoded.v)):
            np.testing.assert_allclose(
                kept[:, b, : len(c)], np.asarray(ref[:, b, : len(c)]), rtol=0, atol=1e-5
            )
