"""Single-turn sampler tests: log-probs vs teacher forcing, greedy vs a naive loop, stopping,
bad input, and compilation counts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentrl_jax.models import ModelConfig, Qwen2ForCausalLM
from agentrl_jax.sampling import GREEDY, DoneReason, Sampler, SamplingParams, StopConfig
from agentrl_jax.sampling.logits import processed_logprobs

CFG = ModelConfig(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    rope_theta=10_000.0,
)
PAD = 0


@pytest.fixture(scope="module")
def model():
    """A small random policy whose weights are scaled so its distributions are peaked (a
    near-uniform model would make the top-k/top-p and stopping checks vacuous)."""
    graphdef, state = nnx.split(Qwen2ForCausalLM(CFG, rngs=nnx.Rngs(0)))
    return nnx.merge(graphdef, jax.tree.map(lambda x: 4.0 * x, state))


def prompts(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, CFG.vocab_size, n).tolist() for n in lengths]


def teacher_forced_logits(model, sequences):
    """[B, T, V] logits of one padded teacher-forced pass over whole sequences."""
    t = max(len(s) for s in sequences)
    tokens = np.zeros((len(sequences), t), np.int32)
    mask = np.zeros((len(sequences), t), np.int32)
    for i, s in enumerate(sequences):
        tokens[i, : len(s)] = s
        mask[i, : len(s)] = 1
    logits, _ = model(jnp.asarray(tokens), mask_bt=jnp.asarray(mask))
    return np.asarray(logits)


def test_sampled_logprobs_equal_teacher_forcing(model):
    params = SamplingParams(temperature=0.7, top_k=40, top_p=0.9)
    sampler = Sampler(model, sampling=params, pad_id=PAD)
    ps = prompts([5, 17, 1, 11])
    out = sampler.generate(ps, [12, 7, 12, 3], jax.random.key(1), cache_size=64)
    gens = out.token_lists()
    assert [len(g) for g in gens] == [12, 7, 12, 3]
    assert (np.asarray(out.done_reason) == DoneReason.MAX_NEW_TOKENS).all()
    logits = teacher_forced_logits(model, [p + g for p, g in zip(ps, gens)])
    policy = np.asarray(jax.nn.log_softmax(jnp.asarray(logits), axis=-1))
    processed = np.asarray(processed_logprobs(jnp.asarray(logits.reshape(-1, CFG.vocab_size)), params))
    processed = processed.reshape(logits.shape)
    for b, (p, g) in enumerate(zip(ps, gens)):
        pos = np.arange(len(p) - 1, len(p) - 1 + len(g))
        np.testing.assert_allclose(
            np.asarray(out.policy_logprobs[b, : len(g)]), policy[b, pos, g], rtol=0, atol=1e-5
        )
        np.testing.assert_allclose(
            np.asarray(out.logprobs[b, : len(g)]), processed[b, pos, g], rtol=0, atol=1e-5
        )
        # Every drawn token was inside the filtered support.
        assert np.isfinite(processed[b, pos, g]).all()
        assert (np.asarray(out.tokens[b, len(g) :]) == PAD).all()
        assert (np.asarray(out.logprobs[b, len(g) :]) == 0).all()
    # The cache holds prompt and every generated token, the last one included.
    assert np.asarray(out.cache.lengths).tolist() == [len(p) + len(g) for p, g in zip(ps, gens)]


def test_greedy_matches_naive_reencoding_loop(model):
    ps = prompts([3, 9, 6], seed=1)
    out = Sampler(model, sampling=GREEDY).generate(ps, 10, jax.random.key(0))
    seqs = [list(p) for p in ps]
    for _ in range(10):  # the independent reference: re-encode everything, take the argmax
        logits = teacher_forced_logits(model, seqs)
        for b, s in enumerate(seqs):
            s.append(int(np.argmax(logits[b, len(s) - 1])))
    assert out.token_lists() == [s[len(p) :] for s, p in zip(seqs, ps)]
    assert (np.asarray(out.logprobs)[:, :10] == 0).all()  # greedy: a point mass


def test_per_row_stop_on_eos_and_stop_sequences(model):
    ps = prompts([4, 8, 5], seed=2)
    free = Sampler(model, sampling=GREEDY).generate(ps, 12, jax.random.key(0)).token_lists()
    eos = free[0][3]
    stop_seq = tuple(free[1][4:6])
    sampler = Sampler(model, sampling=GREEDY, stop=StopConfig(eos_ids=(eos,), stop_sequences=(stop_seq,)))
    out = sampler.generate(ps, 12, jax.random.key(0))
    for b, (g, full) in enumerate(zip(out.token_lists(), free)):
        # Reference: scan the unconstrained greedy continuation for the first stop point.
        expected_len, expected_reason = 12, DoneReason.MAX_NEW_TOKENS
        for i, tok in enumerate(full):
            if tok == eos:
                expected_len, expected_reason = i + 1, DoneReason.EOS
                break
            if tuple(full[max(0, i + 1 - len(stop_seq)) : i + 1]) == stop_seq:
                expected_len, expected_reason = i + 1, DoneReason.STOP_SEQUENCE
                break
        assert g == full[:expected_len], b
        assert int(out.done_reason[b]) == expected_reason, b
        assert int(out.cache.lengths[b]) == len(ps[b]) + expected_len
    assert int(out.done_reason[0]) == DoneReason.EOS and out.token_lists()[0][-1] == eos
    assert int(out.done_reason[1]) in (DoneReason.EOS, DoneReason.STOP_SEQUENCE)


def test_prefill_only_and_inactive_rows(model):
    sampler = Sampler(model, sampling=GREEDY)
    cache = sampler.start(3, 64)
    out = sampler.step_turn(cache, [[5, 6, 7], [], [8]], [0, 4, 2], jax.random.key(0))
    assert np.asarray(out.lengths).tolist() == [0, 0, 2]
    assert np.asarray(out.done_reason).tolist() == [
        DoneReason.MAX_NEW_TOKENS,
        DoneReason.INACTIVE,
        DoneReason.MAX_NEW_TOKENS,
    ]
    assert np.asarray(out.cache.lengths).tolist() == [3, 0, 3]


def test_prompt_longer_than_cache_is_a_clear_error(model):
    sampler = Sampler(model, cache_buckets=[32, 64])
    cache = sampler.start(2, 32)
    with pytest.raises(ValueError, match=r"row 1 does not fit in the KV cache.*= 40 > cache size 32"):
        sampler.step_turn(cache, [[1] * 4, [1] * 30], 10, jax.random.key(0))
    # The check runs before the cache is donated: it is still usable.
    out = sampler.step_turn(cache, [[1] * 4, [1] * 20], 10, jax.random.key(0))
    assert np.asarray(out.cache.lengths).tolist() == [14, 30]
    with pytest.raises(ValueError, match="cache_size=100 exceeds the largest bucket 64"):
        sampler.start(2, 100)
    with pytest.raises(ValueError, match=r"new_tokens\[1\] holds id 256, outside the vocabulary"):
        sampler.step_turn(out.cache, [[1], [256]], 1, jax.random.key(0))
    with pytest.raises(ValueError, match="new_tokens has 3 rows; the cache has batch 2"):
        sampler.step_turn(out.cache, [[1], [2], [3]], 1, jax.random.key(0))


def test_grow_keeps_the_conversation(model):
    sampler = Sampler(model, sampling=GREEDY, cache_buckets=[16, 32])
    ps = prompts([6, 3], seed=3)
    small = sampler.step_turn(sampler.start(2, 16), ps, 4, jax.random.key(0))
    big = sampler.step_turn(sampler.grow(small.cache, 32), [[9, 9], [9]], 12, jax.random.key(0))
    ref = sampler.step_turn(
        sampler.start(2, 32),
        [p + g + e for p, g, e in zip(ps, small.token_lists(), [[9, 9], [9]])],
        12,
        jax.random.key(0),
    )
    assert big.token_lists() == ref.token_lists()


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


def test_cache_is_donated(model):
    sampler = Sampler(model)
    cache = sampler.start(2, 64)
    out = sampler.step_turn(cache, [[1, 2], [3]], 3, jax.random.key(0))
    assert cache.k.is_deleted() and cache.v.is_deleted()
    assert not out.cache.k.is_deleted()
