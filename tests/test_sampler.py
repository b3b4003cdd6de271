"""Single-turn sampler tests: log-probs vs teacher forcing, greedy vs a naive re-encoding loop,
per-row stopping, bad input, and compilation counts.

Compiling is the slow part on 2 shared cores, so tests share one greedy sampler and keep its
shapes (batch 4, cache 32 or 64, chunk 16, width 16) the same wherever they can.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.sampling import GREEDY, DoneReason, Sampler, SamplingParams, StopConfig
from agentrl_jax.sampling.logits import processed_logprobs
from agentrl_jax.sampling.testing import SMALL, TeacherForcer, random_policy

PAD = 0
BUCKETS = dict(cache_buckets=[32, 64], chunk_buckets=[16], width_buckets=[16])


@pytest.fixture(scope="module")
def model():
    return random_policy()


@pytest.fixture(scope="module")
def forcer(model):
    return TeacherForcer(model, batch=4, length=64)


@pytest.fixture(scope="module")
def greedy(model):
    return Sampler(model, sampling=GREEDY, pad_id=PAD, **BUCKETS)


def prompts(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, SMALL.vocab_size, n).tolist() for n in lengths]


def positions(prompt, generated):
    """Positions whose logits predict each generated token."""
    return np.arange(len(prompt) - 1, len(prompt) - 1 + len(generated))


def test_sampled_logprobs_equal_teacher_forcing(model, forcer):
    params = SamplingParams(temperature=0.7, top_k=40, top_p=0.9)
    sampler = Sampler(model, sampling=params, pad_id=PAD, **BUCKETS)
    ps = prompts([5, 16, 1, 11])
    out = sampler.generate(ps, [12, 7, 16, 3], jax.random.key(1))
    gens = out.token_lists()
    assert [len(g) for g in gens] == [12, 7, 16, 3]
    assert (np.asarray(out.done_reason) == DoneReason.MAX_NEW_TOKENS).all()
    logits = forcer.logits([p + g for p, g in zip(ps, gens)])
    policy = np.asarray(jax.nn.log_softmax(jnp.asarray(logits), axis=-1))
    flat = jnp.asarray(logits.reshape(-1, SMALL.vocab_size))
    processed = np.asarray(processed_logprobs(flat, params)).reshape(logits.shape)
    for b, (p, g) in enumerate(zip(ps, gens)):
        pos = positions(p, g)
        np.testing.assert_allclose(
            np.asarray(out.policy_logprobs[b, : len(g)]), policy[b, pos, g], rtol=0, atol=1e-5
        )
        np.testing.assert_allclose(
            np.asarray(out.logprobs[b, : len(g)]), processed[b, pos, g], rtol=0, atol=1e-5
        )
        assert np.isfinite(processed[b, pos, g]).all()  # every token was inside the support
        assert (np.asarray(out.tokens[b, len(g) :]) == PAD).all()
        assert (np.asarray(out.logprobs[b, len(g) :]) == 0).all()
    # The filters really bit: some step kept only part of the vocabulary.
    assert (~np.isfinite(processed[0, positions(ps[0], gens[0])])).any()
    # The cache holds the prompt and every generated token, the last one included.
    assert np.asarray(out.cache.lengths).tolist() == [len(p) + len(g) for p, g in zip(ps, gens)]


def test_greedy_matches_naive_reencoding_loop(greedy, forcer):
    ps = prompts([3, 9, 6, 1], seed=1)
    out = greedy.generate(ps, 10, jax.random.key(0), cache_size=64)
    seqs = [list(p) for p in ps]
    for _ in range(10):  # the reference: re-encode everything each step, take the argmax
        logits = forcer.logits(seqs)
        for b, s in enumerate(seqs):
            s.append(int(np.argmax(logits[b, len(s) - 1])))
    assert out.token_lists() == [s[len(p) :] for s, p in zip(seqs, ps)]
    assert (np.asarray(out.logprobs) == 0).all()  # greedy: a point mass


def test_per_row_stop_on_eos_and_stop_sequences(model, greedy):
    ps = prompts([4, 8, 5, 2], seed=2)
    free = greedy.generate(ps, 12, jax.random.key(0), cache_size=64).token_lists()
    eos = free[0][3]
    stop_seq = tuple(free[1][4:6])
    stop = StopConfig(eos_ids=(eos, 255), stop_sequences=((254, 253, 252), stop_seq))
    sampler = Sampler(model, sampling=GREEDY, stop=stop, pad_id=PAD, **BUCKETS)
    out = sampler.generate(ps, 12, jax.random.key(0), cache_size=64)
    for b, (gen, full) in enumerate(zip(out.token_lists(), free)):
        # Reference: scan the unconstrained greedy continuation for the first stop.
        expected = (12, DoneReason.MAX_NEW_TOKENS)
        for i, tok in enumerate(full):
            if tok in stop.eos_ids:
                expected = (i + 1, DoneReason.EOS)
                break
            if any(tuple(full[: i + 1][-len(s) :]) == s for s in stop.stop_sequences):
                expected = (i + 1, DoneReason.STOP_SEQUENCE)
                break
        assert (len(gen), int(out.done_reason[b])) == expected, b
        assert gen == full[: len(gen)], b
        assert int(out.cache.lengths[b]) == len(ps[b]) + len(gen)
    assert int(out.done_reason[0]) == DoneReason.EOS and out.token_lists()[0][-1] == eos
    assert int(out.done_reason[1]) in (DoneReason.EOS, DoneReason.STOP_SEQUENCE)


def test_choices_constrain_rows_to_their_sequences_and_leave_free_rows_alone(model, forcer):
    """Constrained rows write one of their choices; every draw is from the policy masked to
    the ids that continue a choice (checked against teacher forcing); free rows are unchanged."""
    params = SamplingParams(temperature=0.8, top_k=3)
    sampler = Sampler(model, sampling=params, stop=StopConfig(eos_ids=(7,)), pad_id=PAD, **BUCKETS)
    ps = prompts([5, 16, 1, 11], seed=3)
    choices = [
        None,
        [[11, 12, 7], [11, 13, 14, 7], [20, 7], [21, 22, 23, 24, 25, 7]],
        [[30, 31, 7]],
        [[40, 7], [40, 41, 7], [42, 43, 7]],
    ]
    seen = {b: set() for b in range(4)}
    for key in range(6):
        free = sampler.generate(ps, 8, jax.random.key(key))
        out = sampler.step_turn(sampler.start(4, 64), ps, 8, jax.random.key(key), choices=choices)
        gens = out.token_lists()
        assert gens[0] == free.token_lists()[0]  # same key, no choices: the same draw
        assert out.allowed_lists()[0] is None
        logits = forcer.logits([p + g for p, g in zip(ps, gens)])
        for b in (1, 2, 3):
            assert gens[b] in choices[b], (b, gens[b])
            seen[b].add(tuple(gens[b]))
            allowed = out.allowed_lists()[b]
            for i, (tok, pos) in enumerate(zip(gens[b], positions(ps[b], gens[b]))):
                ids = sorted({c[i] for c in choices[b] if c[:i] == gens[b][:i]})
                assert sorted(allowed[i]) == ids
                # Reference: temperature, then the mask, then top-k over the allowed ids.
                z = logits[b, pos, ids] / 0.8
                kept = np.sort(z)[::-1][: min(3, len(ids))][-1]
                z = np.where(z >= kept, z, -np.inf)
                expected = z[ids.index(tok)] - np.log(np.sum(np.exp(z - z.max()))) - z.max()
                np.testing.assert_allclose(float(out.logprobs[b, i]), expected, atol=1e-5)
    assert len(seen[1]) > 1 and len(seen[3]) > 1  # sampling really chose between choices
    with pytest.raises(ValueError, match=r"choices\[2\]\[0\] = \[\]: expected a non-empty"):
        sampler.step_turn(
            sampler.start(4, 64), ps, 8, jax.random.key(0), choices=[None, None, [[]], None]
        )
    with pytest.raises(ValueError, match="choices has 2 rows; the cache has batch 4"):
        sampler.step_turn(sampler.start(4, 64), ps, 8, jax.random.key(0), choices=[None, [[1]]])


def test_prefill_only_and_inactive_rows(greedy):
    out = greedy.step_turn(
        greedy.start(4, 64), [[5, 6, 7], [], [8], [9, 9]], [0, 4, 2, 16], jax.random.key(0)
    )
    assert np.asarray(out.lengths).tolist() == [0, 0, 2, 16]
    assert np.asarray(out.done_reason).tolist() == [
        DoneReason.MAX_NEW_TOKENS,
        DoneReason.INACTIVE,
        DoneReason.MAX_NEW_TOKENS,
        DoneReason.MAX_NEW_TOKENS,
    ]
    assert np.asarray(out.cache.lengths).tolist() == [3, 0, 3, 18]


def test_prompt_longer_than_cache_is_a_clear_error(greedy):
    cache = greedy.start(4, 32)
    rows = [[1] * 4, [1] * 16, [], [2]]
    with pytest.raises(
        ValueError, match=r"row 1 does not fit in the KV cache.*= 33 > cache size 32"
    ):
        greedy.step_turn(cache, rows, 17, jax.random.key(0))
    # The check runs before the cache is donated: it is still usable.
    out = greedy.step_turn(cache, rows, 16, jax.random.key(0))
    assert np.asarray(out.cache.lengths).tolist() == [20, 32, 0, 17]
    with pytest.raises(ValueError, match="cache_size=65 exceeds the largest bucket 64"):
        greedy.start(4, 65)
    with pytest.raises(ValueError, match="prompt chunk length=17 exceeds the largest bucket 16"):
        greedy.step_turn(greedy.start(4, 64), [[1] * 17, [], [], []], 1, jax.random.key(0))
    with pytest.raises(ValueError, match=r"new_tokens\[1\] holds id 256, outside the vocabulary"):
        greedy.step_turn(out.cache, [[], [256], [], []], 1, jax.random.key(0))
    with pytest.raises(ValueError, match="new_tokens has 3 rows; the cache has batch 4"):
        greedy.step_turn(out.cache, [[1], [2], [3]], 1, jax.random.key(0))
    three = jax.random.split(jax.random.key(0), 3)
    with pytest.raises(ValueError, match=r"rng has shape \(3,\): expected one key or 4 per-row"):
        greedy.step_turn(out.cache, [[1], [2], [3], [4]], 1, three)


def test_grow_keeps_the_conversation(greedy):
    ps, replies = prompts([6, 3, 1, 4], seed=3), [[9, 9], [9], [], [7, 7]]
    small = greedy.step_turn(greedy.start(4, 32), ps, 8, jax.random.key(0))
    big = greedy.step_turn(greedy.grow(small.cache, 64), replies, 16, jax.random.key(0))
    whole = [p + g + r if r else [] for p, g, r in zip(ps, small.token_lists(), replies)]
    ref = greedy.step_turn(greedy.start(4, 64), whole, 16, jax.random.key(0))
    assert big.token_lists() == ref.token_lists()
    assert big.cache.size == 64


def test_shape_buckets_bound_compilations(model):
    sampler = Sampler(model, chunk_buckets=[16, 32], width_buckets=[8, 16], cache_buckets=[128])
    cache = sampler.start(2, 128)
    key = jax.random.key(0)
    # Chunks of 5, 9 and 16 tokens and 3..8 new tokens share one bucket: one compilation,
    # also after new weights are swapped in.
    for turn, (n, new) in enumerate([(5, 3), (9, 8), (16, 5)]):
        if turn == 2:
            sampler.set_state(jax.tree.map(lambda x: x * 1.01, sampler.state))
        cache = sampler.step_turn(cache, prompts([n, n - 1], seed=turn), new, key).cache
    assert sampler.num_traces == 1
    cache = sampler.step_turn(cache, prompts([17, 2]), 4, key).cache  # chunk bucket 32
    assert sampler.num_traces == 2
    cache = sampler.step_turn(cache, prompts([20, 31]), 4, key).cache
    assert sampler.num_traces == 2
    sampler.step_turn(cache, prompts([3, 3]), 9, key)  # width bucket 16
    assert sampler.num_traces == 3


def test_cache_is_donated(greedy):
    cache = greedy.start(4, 64)
    out = greedy.step_turn(cache, [[1, 2], [3], [4], [5]], 3, jax.random.key(0))
    assert all(x.is_deleted() for x in (*cache.keys, *cache.values))
    assert not any(x.is_deleted() for x in (*out.cache.keys, *out.cache.values))
