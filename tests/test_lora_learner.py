"""LoRA in the learner: only the adapters train and have Adam moments; the base stays bit for bit,
and the KL reference is the base without adapters (no copy)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from agentrl_jax.models import CausalLM, ValueModel, lora
from agentrl_jax.models.config import LoraConfig
from agentrl_jax.rl.learner import Learner
from agentrl_jax.rl.spec import LossWeights, RLSpec
from tests.test_learner import CFG, _batch, _rl_inputs


def _flat(state):
    return {path: (type(v), np.asarray(v.get_value())) for path, v in nnx.to_flat_state(state)}


def _lora_learner(critic=False, **losses):
    base = CausalLM(CFG, rngs=nnx.Rngs(0))
    policy = lora.apply_lora(base, LoraConfig(rank=4, alpha=8.0), seed=3)
    value = ValueModel.from_policy(base, rngs=nnx.Rngs(1)) if critic else None
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2))
    spec = RLSpec.for_losses(**losses)
    learner = Learner(policy, value, tx, optax.adam(1e-2) if critic else None, spec=spec)
    return base, policy, value, learner


def test_lora_rl_step_trains_adapters_only_with_moments_for_adapters_only():
    base, policy, value, learner = _lora_learner(
        critic=True, weights=LossWeights(value=0.5, kl=0.1, entropy=0.01)
    )
    state = learner.init(policy, value)
    adapter_paths = {p for p, v in nnx.to_flat_state(state.policy) if isinstance(v, nnx.LoRAParam)}
    assert adapter_paths and len(adapter_paths) < len(nnx.to_flat_state(state.policy))
    # Adam moments (mu, nu) exist for the adapters alone: as many arrays of the adapters' shapes.
    moments = [x for x in jax.tree.leaves(state.policy_opt) if np.ndim(x) > 0]
    adapter_shapes = sorted(
        v.get_value().shape for p, v in nnx.to_flat_state(state.policy) if p in adapter_paths
    )
    assert sorted(m.shape for m in moments) == sorted(adapter_shapes * 2)
    before = _flat(state.policy)
    batch = _rl_inputs(learner, state, _batch())
    # The reference is the base: with B = 0 it scores what the policy does, bit for bit.
    ref = learner.policy_logprobs(learner.base_state(state.policy), batch)
    np.testing.assert_array_equal(np.asarray(ref), np.asarray(batch["old_logprobs"]))
    for _ in range(3):
        state, metrics = learner.rl_step(state, batch)
        assert float(metrics["train/skipped_nonfinite"]) == 0.0
    after = _flat(state.policy)
    assert after.keys() == before.keys()
    moved = set()
    for path, (kind, value) in after.items():
        assert value.dtype == before[path][1].dtype, path
        if path in adapter_paths:
            assert kind is nnx.LoRAParam
            if not np.array_equal(value, before[path][1]):
                moved.add(path)
        else:  # the frozen base: bit for bit
            np.testing.assert_array_equal(value, before[path][1], err_msg=str(path))
    assert moved  # B moves from the first step, A from the second
    assert any(p[-1].startswith(("q_lora_b", "up_lora_b", "gate_lora_b")) for p in moved)
    # The critic stays a full model and trains.
    assert int(state.step) == 3


def test_lora_sft_step_trains_adapters_only():
    _, policy, _, learner = _lora_learner()
    state = learner.init(policy)
    before = _flat(state.policy)
    batch = _batch()
    for _ in range(3):
        state, metrics = learner.sft_step(state, batch)
    after = _flat(state.policy)
    changed = {p for p in after if not np.array_equal(after[p][1], before[p][1])}
    assert changed and all(after[p][0] is nnx.LoRAParam for p in changed)


def test_merged_lora_policy_scores_like_the_learner():
    """The sampler's copy (``lora.merge``) gives the learner's log-probs (f32, < 1e-5)."""
    _, policy, _, learner = _lora_learner()
    state = learner.init(policy)
    batch = _batch()
    state, _ = learner.sft_step(state, batch)
    state, _ = learner.sft_step(state, batch)
    model = learner.policy_module(state)
    merged = lora.merge(model, jnp.float32)
    plain = Learner(merged, None, optax.adam(1e-2))
    got = plain.policy_logprobs(nnx.state(merged, nnx.Param), batch)
    want = learner.policy_logprobs(state.policy, batch)
    assert float(jnp.abs(got - want).max()) < 1e-5
    assert (
        float(
            jnp.abs(want - learner.policy_logprobs(learner.base_state(state.policy), batch)).max()
        )
        > 0
    )


def test_sync_sampler_gives_the_merged_copy_owned_and_released_after():
    """``build.sync_sampler`` of a LoRA state: the merged weights (a plain model's state, no
    adapters) owned by the sampler, deleted on release; the train state stays intact."""
    from agentrl_jax.run import build
    from agentrl_jax.sampling import Sampler

    base, policy, _, learner = _lora_learner()
    state = learner.init(policy)
    batch = _batch()
    for _ in range(2):  # B and A move
        state, _ = learner.sft_step(state, batch)
    sampler = Sampler(base)
    build.sync_sampler(sampler, state.policy, jnp.float32, graphdef=learner.policy_graphdef)
    got = nnx.to_flat_state(sampler.state)
    assert not any(isinstance(v, nnx.LoRAParam) for _, v in got)
    want = dict(
        nnx.to_flat_state(
            nnx.state(lora.merge(learner.policy_module(state), jnp.float32), nnx.Param)
        )
    )
    assert [p for p, _ in got] == list(want)
    for path, var in got:
        np.testing.assert_array_equal(var.get_value(), want[path].get_value())
    held = jax.tree.leaves(sampler.state)
    sampler.release()
    assert all(x.is_deleted() for x in held)
    assert np.isfinite(np.asarray(learner.policy_logprobs(state.policy, batch))).all()


def _flat_values(state):
    return {p: np.asarray(v.get_value()) for p, v in nnx.to_flat_state(state)}


def test_lora_dropout_in_rl_steps_only_and_drawn_from_the_seed_and_step():
    """LoRA dropout (``cfg.lora.dropout`` > 0): the RL steps' forward passes drop adapter inputs
    (the adapters then move otherwise than without it), with masks drawn from ``dropout_seed``
    and the state's step (the same seed and state: the same step, bit for bit, so a resumed run
    repeats it); scoring never drops."""
    base = CausalLM(CFG, rngs=nnx.Rngs(0))
    tx = optax.adam(1e-2)

    def learner_of(dropout, seed=0, microbatch_size=None):
        policy = lora.apply_lora(base, LoraConfig(rank=4, alpha=8.0, dropout=dropout), seed=3)
        learner = Learner(policy, None, tx, dropout_seed=seed, microbatch_size=microbatch_size)
        return policy, learner

    def two_steps(dropout, seed=0, microbatch_size=None):
        policy, learner = learner_of(dropout, seed, microbatch_size)
        state = learner.init(policy)
        batch = _rl_inputs(learner, state, _batch())
        for _ in range(2):  # B moves at the first step, A (whose input is dropped) at the second
            state, metrics = learner.rl_step(state, batch)
            assert float(metrics["train/skipped_nonfinite"]) == 0.0
        return learner, state, batch

    learner, dropped, batch = two_steps(0.3)
    assert learner.lora_dropout
    _, plain, _ = two_steps(0.0)
    _, again, _ = two_steps(0.3)
    _, other_seed, _ = two_steps(0.3, seed=1)
    got, want = _flat_values(dropped.policy), _flat_values(plain.policy)
    assert any(not np.array_equal(got[p], want[p]) for p in got)
    same = _flat_values(again.policy)
    assert all(np.array_equal(got[p], same[p]) for p in got)
    other = _flat_values(other_seed.policy)
    assert any(not np.array_equal(got[p], other[p]) for p in got)
    # Each step draws its own masks; each microbatch of a step its own key.
    keys0, keys1 = np.asarray(learner.dropout_keys(0, 4)), np.asarray(learner.dropout_keys(1, 4))
    assert len({tuple(k) for k in np.concatenate([keys0, keys1])}) == 8
    # Scoring is deterministic: the dropout learner scores as the one without dropout.
    _, no_dropout = learner_of(0.0)
    np.testing.assert_array_equal(
        np.asarray(learner.policy_logprobs(dropped.policy, batch)),
        np.asarray(no_dropout.policy_logprobs(dropped.policy, batch)),
    )
    # Microbatches: still a finite step, and not the whole batch's masks.
    _, micro, _ = two_steps(0.3, microbatch_size=2)
    assert any(not np.array_equal(got[p], v) for p, v in _flat_values(micro.policy).items())


def test_bf16_base_under_f32_adapters():
    """``apply_lora(base_dtype=bf16)``: the frozen base cast to bf16 (the model's
    ``cfg.param_dtype`` says so), the adapters f32; the model computes what the base rounded to
    bf16 does, and RL steps keep the bf16 base bit for bit while the adapters train."""
    base = CausalLM(CFG, rngs=nnx.Rngs(0))
    policy = lora.apply_lora(base, LoraConfig(rank=4, alpha=8.0), seed=3, base_dtype=jnp.bfloat16)
    assert policy.cfg.param_dtype == jnp.bfloat16 and policy.cfg.lora.param_dtype == jnp.float32
    for _, var in nnx.to_flat_state(nnx.state(policy)):
        want = jnp.float32 if isinstance(var, nnx.LoRAParam) else jnp.bfloat16
        assert var.get_value().dtype == want
    # The base's own arrays are untouched (a cast is a copy).
    assert all(v.get_value().dtype == jnp.float32 for _, v in nnx.to_flat_state(nnx.state(base)))
    rounded = CausalLM(CFG, rngs=nnx.Rngs(0))
    nnx.update(
        rounded,
        jax.tree.map(lambda x: x.astype(jnp.bfloat16).astype(x.dtype), nnx.state(rounded)),
    )
    tokens = jnp.asarray(np.random.default_rng(0).integers(1, CFG.vocab_size, (2, 9)), jnp.int32)
    np.testing.assert_array_equal(np.asarray(policy(tokens)[0]), np.asarray(rounded(tokens)[0]))

    learner = Learner(policy, None, optax.adam(1e-2))
    state = learner.init(policy)
    before = _flat_values(state.policy)
    batch = _rl_inputs(learner, state, _batch())
    for _ in range(2):
        state, _ = learner.rl_step(state, batch)
    after = _flat_values(state.policy)
    frozen = [p for p, v in nnx.to_flat_state(state.policy) if not isinstance(v, nnx.LoRAParam)]
    for path in frozen:
        assert after[path].dtype == jnp.bfloat16
        np.testing.assert_array_equal(after[path], before[path])
    assert any(not np.array_equal(after[p], before[p]) for p in after if p not in frozen)
