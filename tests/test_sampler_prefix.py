"""Group prefix sharing.

The G rollouts of one task start from the same prompt: the sampler prefills it once and every row
of the group continues from that prefill. These tests count what the model is really given
(batch rows traced into the prefill), check that sharing changes nothing a caller can see
(tokens, log-probs, the cache, the next turn), and that rows with a history never share.
"""

import jax
import numpy as np
import pytest

from agentrl_jax.models import Trunk
from agentrl_jax.sampling import GREEDY, Sampler, SamplingParams
from agentrl_jax.sampling.testing import SMALL, TeacherForcer, random_policy

BUCKETS = dict(cache_buckets=[32, 64], chunk_buckets=[16], width_buckets=[8])
GROUP = 8


@pytest.fixture(scope="module")
def model():
    return random_policy()


def group_prompts(seed=0):
    """Three distinct first prompts over 8 rows: a on rows 0, 2, 6, 7; b on 1, 3, 5; c on 4."""
    rng = np.random.default_rng(seed)
    a, b, c = (rng.integers(1, SMALL.vocab_size, n).tolist() for n in (11, 7, 13))
    return [a, b, a, b, c, b, a, a]


@pytest.fixture
def traced_batches(monkeypatch):
    """Batch sizes of every cached trunk call as traced (the prefill is the first per trace)."""
    calls = []
    original = Trunk.__call__

    def spy(self, tokens_bt, **kwargs):
        if kwargs.get("cache") is not None:
            calls.append(tokens_bt.shape)
        return original(self, tokens_bt, **kwargs)

    monkeypatch.setattr(Trunk, "__call__", spy)
    return calls


def test_a_group_of_eight_prefills_its_prompt_once(model, traced_batches):
    sampler = Sampler(model, sampling=GREEDY, **BUCKETS)
    prompt = group_prompts()[0]
    out = sampler.step_turn(sampler.start(GROUP, 32), [prompt] * GROUP, 6, jax.random.key(0))
    assert sampler.prefilled_rows == 1
    # The prefill traced one row ([1, 16]); the decode step traced all eight ([8, 1]).
    assert traced_batches == [(1, 16), (GROUP, 1)]
    assert len(set(map(tuple, out.token_lists()))) == 1  # greedy: the same action everywhere
    np.testing.assert_array_equal(np.asarray(out.cache.lengths), [len(prompt) + 6] * GROUP)


@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(temperature=1.0)])
def test_sharing_changes_nothing_a_caller_sees(model, sampling):
    prompts = group_prompts()
    replies = [[5, 6, 7], [8], [], [9, 10], [11], [12, 13, 14, 15], [16], [17, 18]]
    outs = []
    for share in (True, False):
        sampler = Sampler(model, sampling=sampling, share_prefixes=share, **BUCKETS)
        first = sampler.step_turn(sampler.start(GROUP, 64), prompts, 6, jax.random.key(1))
        # The next turn donates the cache: read it now.
        kept = [np.asarray(x) for x in (first.cache.k, first.cache.v, first.cache.lengths)]
        second = sampler.step_turn(first.cache, replies, 6, jax.random.key(2))
        kept.append(np.asarray(second.cache.lengths))
        outs.append((sampler.prefilled_rows, first, second, kept))
    (shared_rows, got, got2, got_kept), (plain_rows, ref, ref2, ref_kept) = outs
    assert (shared_rows, plain_rows) == (3 + 7, GROUP + 7)  # 3 distinct prompts, 7 replies
    for a, b in ((got, ref), (got2, ref2)):
        assert a.token_lists() == b.token_lists()
        for name in ("logprobs", "policy_logprobs"):
            np.testing.assert_allclose(
                np.asarray(getattr(a, name)), np.asarray(getattr(b, name)), rtol=0, atol=1e-5
            )
    (got_k, got_v, *got_lengths), (ref_k, ref_v, *ref_lengths) = got_kept, ref_kept
    np.testing.assert_array_equal(got_lengths, ref_lengths)
    for row, n in enumerate(ref_lengths[0]):
        np.testing.assert_allclose(got_k[:, row, :n], ref_k[:, row, :n], rtol=0, atol=1e-5)
        np.testing.assert_allclose(got_v[:, row, :n], ref_v[:, row, :n], rtol=0, atol=1e-5)
    if not sampling.greedy:
        # Rows of one group share a prefill, not their draws.
        group_a = [got.token_lists()[r] for r in (0, 2, 6, 7)]
        assert len(set(map(tuple, group_a))) > 1


def test_shared_rows_log_probs_equal_teacher_forcing(model):
    sampler = Sampler(model, sampling=SamplingParams(temperature=1.0), **BUCKETS)
    prompts = group_prompts()
    out = sampler.step_turn(sampler.start(GROUP, 32), prompts, 6, jax.random.key(3))
    assert sampler.prefilled_rows == 3
    forcer = TeacherForcer(model, batch=GROUP, length=32)
    gens = out.token_lists()
    logits = forcer.logits([p + g for p, g in zip(prompts, gens)])
    logp = np.asarray(jax.nn.log_softmax(logits, axis=-1))
    policy = np.asarray(out.policy_logprobs)
    for b, (p, g) in enumerate(zip(prompts, gens)):
        pos = np.arange(len(p) - 1, len(p) - 1 + len(g))
        np.testing.assert_allclose(policy[b, : len(g)], logp[b, pos, g], rtol=0, atol=1e-5)


def test_rows_with_a_history_never_share(model):
    sampler = Sampler(model, sampling=GREEDY, **BUCKETS)
    prompts = group_prompts()
    first = sampler.step_turn(sampler.start(GROUP, 64), prompts, 4, jax.random.key(0))
    assert sampler.prefilled_rows == 3
    # The same reply on every row: rows 0, 2, 6, 7 even hold the same conversation, but only
    # rows that start a conversation are grouped; all 8 are prefilled.
    sampler.step_turn(first.cache, [[3, 4, 5]] * GROUP, 4, jax.random.key(0))
    assert sampler.prefilled_rows == 3 + GROUP
