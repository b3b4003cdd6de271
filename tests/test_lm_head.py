"""The chunked LM head (rl/lm_head.py) against the full [B, T, V] logits formulas.

The reference is the learner's former path, kept here as the independent check: the policy's
full logits, divided by the temperature, masked by ``mask_to_allowed`` (a [B, T, V] scatter),
then ``token_logprobs`` and ``shift_right(entropy_from_logits(...))``. Values and gradients
must agree to 1e-5 in float32.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from agentrl_jax import kernels
from agentrl_jax.models import CausalLM, preset
from agentrl_jax.models.testing import random_model
from agentrl_jax.rl.learner import Learner, shift_right
from agentrl_jax.rl.lm_head import (
    MASKED_LOGIT,
    TokenStats,
    mask_to_allowed,
    token_logprobs,
    token_stats,
)
from agentrl_jax.rl.spec import LossWeights, RLSpec

TOL = 1e-5
# V = 97 is no other dimension of the test, so [.., .., V] shapes in a jaxpr are logits.
CFG = preset(
    "tiny",
    vocab_size=97,
    hidden_size=32,
    intermediate_size=64,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    head_dim=16,
)
B, T, K = 3, 11, 5


def _policy(tied: bool) -> CausalLM:
    return random_model(CausalLM, CFG.replace(tie_word_embeddings=tied), seed=int(tied))


def _batch(seed=0, constrained=True):
    """Tokens, a padded row and an ``allowed`` with -1 gaps and duplicate ids."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, CFG.vocab_size, (B, T)).astype(np.int32)
    mask = np.ones((B, T), np.float32)
    mask[0, -3:] = 0
    loss_mask = np.zeros((B, T), np.float32)
    loss_mask[:, 3:9] = 1
    batch = {
        "tokens": tokens,
        "mask": mask,
        "loss_mask": loss_mask,
        "step_ids": np.where(loss_mask > 0, 0, -1).astype(np.int32),
    }
    if constrained:
        allowed = np.full((B, T, K), -1, np.int32)
        for b in range(B):
            for t in range(2, T, 2):  # every other position constrained, column 0 never
                n = rng.integers(1, K + 1)
                ids = rng.choice(CFG.vocab_size, n, replace=False)
                ids[rng.integers(n)] = tokens[b, t]  # the drawn token is in its set
                allowed[b, t, :n] = ids
        allowed[1, 4] = [tokens[1, 4], -1, 7, 7, tokens[1, 4]]  # duplicates count once
        allowed[2, 6] = [-1, -1, tokens[2, 6], -1, -1]  # a single allowed id: log-prob 0
        allowed[2, 0] = [1, 2, -1, -1, -1]  # column 0's set predicts nothing
        batch["allowed"] = allowed
    return {k: jnp.asarray(v) for k, v in batch.items()}


def _reference(model, tokens, mask, temperature=1.0, allowed=None):
    """(log-probs, entropy, lse) [B, T] from the full logits, as the learner used to."""
    logits, _ = model(tokens, mask_bt=mask)
    if temperature != 1.0:
        logits = logits / temperature
    if allowed is not None:
        logits = mask_to_allowed(logits, allowed)
    lse = shift_right(jax.nn.logsumexp(logits, axis=-1))
    return token_logprobs(logits, tokens), shift_right(kernels.entropy_from_logits(logits)), lse


def _chunked(model, tokens, mask, temperature=1.0, allowed=None, chunk=4):
    hidden, _ = model.trunk(tokens, mask_bt=mask)
    return tuple(
        token_stats(
            model.logits,
            hidden,
            tokens,
            temperature=temperature,
            allowed_btk=allowed,
            chunk=chunk,
        )
    )


def _max_diff(a, b) -> float:
    return max(
        float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
    )


@pytest.mark.parametrize(
    "tied, temperature, chunk, constrained",
    [
        (True, 1.0, 4, False),  # 10 scored positions: chunks of 4, 4 and 2 (+2 padding)
        (False, 0.7, 4, True),
        (True, 1.3, 3, True),  # 3 + 3 + 3 + 1
        (False, 1.0, 64, True),  # one chunk, larger than the sequence
        (True, 0.7, 1, True),  # one position per chunk
    ],
)
def test_token_stats_and_their_gradients_match_the_full_logits(
    tied, temperature, chunk, constrained
):
    model = _policy(tied)
    graphdef, params = nnx.split(model)
    batch = _batch(constrained=constrained)
    tokens, mask, allowed = batch["tokens"], batch["mask"], batch.get("allowed")
    weights = jax.random.normal(jax.random.key(1), (3, B, T))

    def run(fn, params):
        return fn(nnx.merge(graphdef, params), tokens, mask, temperature, allowed)

    def loss(params, fn):
        # Weights on every output (log-prob, entropy, lse) exercise all three gradients.
        return sum(jnp.sum(w * s) for w, s in zip(weights, run(fn, params)))

    chunked = lambda m, *a: _chunked(m, *a, chunk=chunk)  # noqa: E731
    got = jax.jit(lambda p: run(chunked, p))(params)
    want = jax.jit(lambda p: run(_reference, p))(params)
    for name, g, w in zip(("logprobs", "entropy", "lse"), got, want):
        assert g.shape == (B, T), name
        assert np.all(np.asarray(g)[:, 0] == 0), name
        diff = _max_diff(g, w)
        print(f"{name}: max |diff| {diff:.2e}")
        assert diff <= TOL, (name, diff)
    if constrained:
        # A single allowed id is drawn for sure: log-prob 0 and entropy 0.
        assert abs(float(got[0][2, 6])) <= TOL and abs(float(got[1][2, 6])) <= TOL
    g_got = jax.jit(jax.grad(lambda p: loss(p, chunked)))(params)
    g_want = jax.jit(jax.grad(lambda p: loss(p, _reference)))(params)
    diff = _max_diff(g_got, g_want)
    print(f"param grads: max |diff| {diff:.2e}")
    assert diff <= TOL
    assert max(float(np.max(np.abs(x))) for x in jax.tree.leaves(g_got)) > 1e-3  # not vacuous


def test_a_target_outside_its_allowed_set_scores_as_masked():
    model = _policy(True)
    batch = _batch()
    allowed = batch["allowed"].at[1, 5].set(jnp.asarray([3, 4, -1, -1, -1]))
    tokens = batch["tokens"].at[1, 5].set(9)
    got = _chunked(model, tokens, batch["mask"], 1.0, allowed)
    want = _reference(model, tokens, batch["mask"], 1.0, allowed)
    assert float(got[0][1, 5]) <= 0.5 * MASKED_LOGIT and float(want[0][1, 5]) <= 0.5 * MASKED_LOGIT
    on = np.ones((B, T), bool)
    on[1, 5] = False
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g)[on], np.asarray(w)[on], atol=TOL, rtol=0)


def test_no_full_vocabulary_array_in_the_forward_or_backward_program():
    model = _policy(False)
    graphdef, params = nnx.split(model)
    batch = _batch()
    chunk = 4

    def program(fn):
        def loss(params):
            m = nnx.merge(graphdef, params)
            lp, ent, _ = fn(m, batch["tokens"], batch["mask"], 0.7, batch["allowed"])
            return jnp.sum(lp) + jnp.sum(ent)

        text = str(jax.make_jaxpr(jax.grad(loss))(params))
        # The sizes of the arrays with a vocabulary axis and at least two more (logits-like).
        dims = re.findall(r"\[((?:\d+,){2,}" + str(CFG.vocab_size) + r")\]", text)
        return text, [int(np.prod([int(d) for d in ds.split(",")])) for ds in dims]

    text, sizes = program(lambda *a: _chunked(*a, chunk=chunk))
    # Every one holds at most one chunk's logits, recomputed in the backward pass (remat).
    assert sizes and max(sizes) <= B * chunk * CFG.vocab_size
    assert re.search(r"\bremat\d*\[", text)
    # The check sees full logits where there are some: the reference has [B, T, V] arrays.
    _, full_sizes = program(_reference)
    assert max(full_sizes) == B * T * CFG.vocab_size


class _FullLogitsLearner(Learner):
    """The learner as it was: per-token stats from the full, masked [B, T, V] logits."""

    def _token_stats(self, model, tokens, mask, *, temperature=1.0, allowed=None, lora_key=None):
        assert lora_key is None  # no LoRA dropout here
        return TokenStats(*_reference(model, tokens, mask, temperature, allowed))


def _learners(tied, **kwargs):
    policy = _policy(tied)
    envrl = kernels.EnvrlConfig(sp_weight=0.5, id_weight=0.25, horizon=10)
    weights = LossWeights(kl=0.1, entropy=0.05)
    spec = RLSpec.for_losses(envrl=envrl, weights=weights, **kwargs)
    chunked = Learner(policy, None, optax.sgd(0.0), logits_chunk=4, spec=spec)
    full = _FullLogitsLearner(policy, None, optax.sgd(0.0), spec=spec)
    return policy, chunked, full


@pytest.mark.parametrize(
    "tied, temperature", [(True, 0.7), pytest.param(False, 1.0, marks=pytest.mark.slow)]
)
def test_learner_losses_and_gradients_match_the_full_logits_learner(tied, temperature):
    policy, chunked, full = _learners(tied, temperature=temperature)
    params = nnx.state(policy, nnx.Param)
    batch = _batch(seed=3)

    old = chunked.policy_logprobs(params, batch)
    diff = _max_diff(old, full.policy_logprobs(params, batch))
    print(f"policy_logprobs: max |diff| {diff:.2e}")
    assert diff <= TOL

    rng = np.random.default_rng(4)
    adv = jnp.asarray(rng.normal(size=(B, T)).astype(np.float32))
    rl = {
        **batch,
        "old_logprobs": old + 0.05 * adv,  # ratios away from 1: the clip is active somewhere
        "ref_logprobs": old - 0.1 * adv,  # a KL that is not 0
        "advantages": adv * batch["loss_mask"],
        "iteration": jnp.asarray(3),
    }
    pairs = [([[1, 2, 3], [4, 5], [6, 7, 8]], [[9, 10], [11]])]
    for kind, ex in (
        ("sp", kernels.build_state_prediction(pairs, max_len=14)),
        ("id", kernels.build_inverse_dynamics(pairs, max_len=14)),
    ):
        rl[f"aux_{kind}_tokens"] = jnp.asarray(ex.input_ids)
        rl[f"aux_{kind}_mask"] = jnp.asarray(ex.attention_mask)
        rl[f"aux_{kind}_target_mask"] = jnp.asarray(ex.target_mask)

    def grads(learner, name):
        if name == "sft":
            fn = lambda p, b: learner.sft_loss(p, b)  # noqa: E731
        else:
            fn = lambda p, b: learner.rl_loss((p, None), b)  # noqa: E731
        return jax.jit(jax.value_and_grad(fn, has_aux=True))(params, rl)

    for name in ("sft", "rl"):
        (loss_c, m_c), g_c = grads(chunked, name)
        (loss_f, m_f), g_f = grads(full, name)
        assert set(m_c) == set(m_f)
        for key in m_c:
            assert abs(float(m_c[key]) - float(m_f[key])) <= TOL, (name, key)
        if name == "rl":
            for key in ("losses/kl_ref", "losses/entropy", "envrl/sp_loss", "envrl/id_loss"):
                assert abs(float(m_c[key])) > 1e-3, key  # each term is really there
        diff = _max_diff(g_c, g_f)
        print(
            f"{name} loss {float(loss_c):.4f}: |diff| {abs(float(loss_c - loss_f)):.2e}, "
            f"param grads max |diff| {diff:.2e}"
        )
        assert abs(float(loss_c - loss_f)) <= TOL
        assert diff <= TOL


def test_the_chunk_size_is_a_validated_model_setting():
    from agentrl_jax.run.config import ConfigError, base_config, from_config_dict

    assert from_config_dict(base_config()).model.logits_chunk == 256
    for bad in (0, -4):
        cd = base_config()
        cd.model.logits_chunk = bad
        with pytest.raises(ConfigError, match="config.model.logits_chunk"):
            from_config_dict(cd)
