"""The jitted train step: SFT learns, RL updates actor and critic, non-finite steps are skipped."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from agentrl_jax import kernels
from agentrl_jax.models import CausalLM, ValueModel, preset
from agentrl_jax.rl.learner import Learner, token_logprobs
from agentrl_jax.rl.spec import LossWeights, RLSpec

CFG = preset(
    "tiny",
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    head_dim=16,
)


def _batch(rows=4, length=12, seed=0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, CFG.vocab_size, (rows, length)).astype(np.int32)
    mask = np.ones((rows, length), np.float32)
    mask[0, -3:] = 0  # a padded row
    loss_mask = np.zeros((rows, length), np.float32)
    loss_mask[:, 4:7] = 1
    step_ids = np.where(loss_mask > 0, 0, -1).astype(np.int32)
    return {
        "tokens": jnp.asarray(tokens),
        "mask": jnp.asarray(mask),
        "loss_mask": jnp.asarray(loss_mask),
        "step_ids": jnp.asarray(step_ids),
    }


def test_token_logprobs_matches_a_manual_gather():
    logits = jax.random.normal(jax.random.key(0), (2, 5, 7))
    tokens = jnp.asarray([[1, 2, 3, 4, 5], [6, 0, 1, 2, 3]])
    logp = np.asarray(token_logprobs(logits, tokens))
    ref = np.asarray(jax.nn.log_softmax(logits, axis=-1))
    for b in range(2):
        assert logp[b, 0] == 0.0
        for t in range(1, 5):
            assert abs(logp[b, t] - ref[b, t - 1, tokens[b, t]]) < 1e-6


def test_sft_step_lowers_the_loss_on_a_fixed_batch():
    policy = CausalLM(CFG, rngs=nnx.Rngs(0))
    learner = Learner(policy, None, optax.adam(1e-2))
    state = learner.init(policy)
    batch = _batch()
    losses = []
    for _ in range(20):
        state, metrics = learner.sft_step(state, batch)
        losses.append(float(metrics["sft/nll"]))
    assert losses[-1] < 0.5 * losses[0]
    assert int(state.step) == 20
    assert float(metrics["sft/tokens"]) == 12.0


def _rl_inputs(learner, state, batch, seed=1):
    rng = np.random.default_rng(seed)
    old = learner.policy_logprobs(state.policy, batch)
    adv = jnp.asarray(rng.normal(size=batch["tokens"].shape).astype(np.float32))
    return {
        **batch,
        "old_logprobs": old,
        "ref_logprobs": old,
        "advantages": adv * batch["loss_mask"],
        "returns": adv,
        "old_values": jnp.zeros_like(adv),
    }


def _actor_critic(actor_lr=1e-2, mesh=None, **losses):
    """The tiny policy, a critic from its trunk, and a Learner for both (Adam, critic lr 1e-2)
    with the spec of ``losses`` (``RLSpec.for_losses``)."""
    policy = CausalLM(CFG, rngs=nnx.Rngs(0))
    critic = ValueModel.from_policy(policy, rngs=nnx.Rngs(1))
    spec = RLSpec.for_losses(**losses)
    learner = Learner(policy, critic, optax.adam(actor_lr), optax.adam(1e-2), spec=spec, mesh=mesh)
    return policy, critic, learner


def test_rl_step_updates_actor_and_critic_with_finite_metrics():
    policy, critic, learner = _actor_critic(
        1e-3, weights=LossWeights(value=0.5, kl=0.1, entropy=0.01)
    )
    state = learner.init(policy, critic)
    before_pol = jax.tree.map(np.asarray, state.policy)
    before_val = jax.tree.map(np.asarray, state.value)
    batch = _rl_inputs(learner, state, _batch())
    state, metrics = learner.rl_step(state, batch)
    for name in (
        "losses/policy_loss",
        "losses/value_loss",
        "losses/entropy",
        "losses/kl_ref",
        "losses/explained_variance",
        "train/grad_norm",
    ):
        assert np.isfinite(float(metrics[name])), name
    assert float(metrics["train/skipped_nonfinite"]) == 0.0
    # On-policy first step: the PPO ratio is exactly 1 and the KL to an identical reference is 0.
    assert abs(float(metrics["losses/kl_ref"])) < 1e-6
    changed = jax.tree.map(lambda a, b: np.abs(np.asarray(a) - b).max(), state.policy, before_pol)
    assert max(jax.tree.leaves(changed)) > 0
    changed = jax.tree.map(lambda a, b: np.abs(np.asarray(a) - b).max(), state.value, before_val)
    assert max(jax.tree.leaves(changed)) > 0


@pytest.mark.parametrize("poison", ["advantages", "old_logprobs"])
def test_non_finite_update_is_skipped(poison):
    policy = CausalLM(CFG, rngs=nnx.Rngs(0))
    critic = ValueModel.from_policy(policy, rngs=nnx.Rngs(1))
    learner = Learner(policy, critic, optax.adam(1e-3), optax.adam(1e-3))
    state = learner.init(policy, critic)
    batch = _rl_inputs(learner, state, _batch())
    batch[poison] = batch[poison].at[1, 5].set(jnp.nan)
    before = jax.tree.map(np.asarray, (state.policy, state.value, state.policy_opt))
    state, metrics = learner.rl_step(state, batch)
    assert float(metrics["train/skipped_nonfinite"]) == 1.0
    after = jax.tree.map(np.asarray, (state.policy, state.value, state.policy_opt))
    for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(before)):
        np.testing.assert_array_equal(a, b)


def test_policy_loss_comes_from_the_registry():
    calls = []

    @kernels.register_policy_loss("test_learner_pg", overwrite=True)
    def my_loss(logprobs, old_logprobs, advantages, loss_mask, *, step_ids=None, config=None):
        calls.append(True)
        return kernels.aggregate(-advantages * logprobs, loss_mask, "token_mean"), {}

    policy = CausalLM(CFG, rngs=nnx.Rngs(0))
    learner = Learner(
        policy, None, optax.sgd(1e-2), spec=RLSpec.for_losses(policy_loss="test_learner_pg")
    )
    state = learner.init(policy)
    batch = _rl_inputs(learner, state, _batch())
    state, metrics = learner.rl_step(state, batch)
    assert calls and np.isfinite(float(metrics["losses/policy_loss"]))


def test_envrl_auxiliary_losses_join_the_rl_loss_with_cosine_weights():
    policy = CausalLM(CFG, rngs=nnx.Rngs(0))
    envrl = kernels.EnvrlConfig(sp_weight=0.5, id_weight=0.25, horizon=10)
    learner = Learner(policy, None, optax.sgd(1e-2), spec=RLSpec.for_losses(envrl=envrl))
    state = learner.init(policy)
    batch = _rl_inputs(learner, state, _batch())
    pairs = [([[1, 2, 3], [4, 5], [6, 7, 8]], [[9, 10], [11]])]
    sp = kernels.build_state_prediction(pairs, max_len=12)
    inv = kernels.build_inverse_dynamics(pairs, max_len=12)
    for kind, ex in (("sp", sp), ("id", inv)):
        batch[f"aux_{kind}_tokens"] = jnp.asarray(ex.input_ids)
        batch[f"aux_{kind}_mask"] = jnp.asarray(ex.attention_mask)
        batch[f"aux_{kind}_target_mask"] = jnp.asarray(ex.target_mask)
    for iteration, factor in ((0, 1.0), (5, 0.5), (10, 0.0)):
        batch["iteration"] = jnp.asarray(iteration)
        _, metrics = learner.rl_step(learner.init(policy), batch)
        assert float(metrics["envrl/sp_weight"]) == pytest.approx(0.5 * factor, abs=1e-6)
        assert float(metrics["envrl/id_weight"]) == pytest.approx(0.25 * factor, abs=1e-6)
        expected = (
            float(metrics["losses/policy_loss"])
            + 0.5 * factor * float(metrics["envrl/sp_loss"])
            + 0.25 * factor * float(metrics["envrl/id_loss"])
        )
        assert float(metrics["losses/total"]) == pytest.approx(expected, rel=1e-5)
        assert float(metrics["envrl/sp_loss"]) > 0 and float(metrics["envrl/id_loss"]) > 0


def test_sharded_train_step_matches_one_device():
    from agentrl_jax.sharding import make_mesh

    mesh = make_mesh((2, 2, 2))
    results = []
    for use_mesh in (None, mesh):
        policy = CausalLM(CFG, rngs=nnx.Rngs(0))
        critic = ValueModel.from_policy(policy, rngs=nnx.Rngs(1))
        learner = Learner(policy, critic, optax.adam(1e-2), optax.adam(1e-2), mesh=use_mesh)
        state = learner.init(policy, critic)
        batch = _rl_inputs(learner, learner.init(policy, critic), _batch(rows=8))
        state, metrics = learner.rl_step(state, learner.place_batch(batch))
        state, metrics = learner.rl_step(state, learner.place_batch(batch))
        results.append((jax.tree.map(np.asarray, (state.policy, state.value)), metrics, state))
    (single, m1, _), (sharded, m2, sharded_state) = results
    for a, b in zip(jax.tree.leaves(single), jax.tree.leaves(sharded)):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    assert float(m1["losses/total"]) == pytest.approx(float(m2["losses/total"]), abs=1e-5)
    # The state really lives on the mesh: the MLP width is split over tp, embed over fsdp.
    gate = sharded_state.policy["trunk"]["layers"][0]["mlp"]["gate_weight_df"].value
    assert gate.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tp")
    assert len(gate.sharding.device_set) == 8
    # Adam's moments share their parameter's layout (both of them, for every parameter).
    like_gate = [x for x in jax.tree.leaves(sharded_state.policy_opt) if x.shape == gate.shape]
    assert len(like_gate) >= 2 and all(x.sharding == gate.sharding for x in like_gate)


def test_abstract_state_is_the_layout_init_makes():
    from agentrl_jax.sharding import make_mesh

    policy, critic, learner = _actor_critic(mesh=make_mesh((2, 2, 2)))
    abstract = learner.abstract_state(policy, critic)
    state = learner.init(policy, critic)
    assert jax.tree.structure(abstract) == jax.tree.structure(state)
    for a, x in zip(jax.tree.leaves(abstract), jax.tree.leaves(state)):
        assert isinstance(a, jax.ShapeDtypeStruct)
        assert (a.shape, a.dtype, a.sharding) == (x.shape, x.dtype, x.sharding)


def test_rl_update_equals_one_rl_step_per_minibatch():
    """The scanned update (minibatches gathered on device) = rl_step on host-sliced minibatches."""
    policy, critic, learner = _actor_critic(weights=LossWeights(value=0.5, kl=0.1, entropy=0.01))
    batch = _rl_inputs(learner, learner.init(policy, critic), _batch(rows=8))
    plan = np.stack([np.random.default_rng(s).permutation(8)[:4] for s in range(3)])
    host = jax.tree.map(np.asarray, batch)

    state = learner.init(policy, critic)
    stepped = []
    for index in plan:
        state, metrics = learner.rl_step(state, {k: jnp.asarray(v[index]) for k, v in host.items()})
        stepped.append(metrics)
    want = jax.tree.map(np.asarray, (state.policy, state.value))

    state, metrics = learner.rl_update(
        learner.init(policy, critic), batch, jnp.asarray(plan, jnp.int32), {}
    )
    got = jax.tree.map(np.asarray, (state.policy, state.value))
    assert int(state.step) == 3
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
        np.testing.assert_allclose(b, a, atol=1e-6, rtol=0)
    for name, values in metrics.items():
        assert values.shape == (3,), name
        np.testing.assert_allclose(
            values, [float(m[name]) for m in stepped], atol=1e-6, rtol=1e-6, err_msg=name
        )


def test_score_equals_the_separate_passes_in_chunks():
    policy, critic, learner = _actor_critic(temperature=0.7)
    ref = CausalLM(CFG, rngs=nnx.Rngs(2))
    state = learner.init(policy, critic)
    ref_state = nnx.state(ref, nnx.Param)
    batch = _batch(rows=8)
    want = {
        "old_logprobs": learner.policy_logprobs(state.policy, batch),
        "ref_logprobs": learner.policy_logprobs(ref_state, batch),
        "old_values": learner.values(state.value, batch),
    }
    for rows_per_chunk in (8, 2):
        got = learner.score(
            state.policy, ref_state, state.value, batch, rows_per_chunk=rows_per_chunk
        )
        assert set(got) == set(want)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], atol=1e-6, rtol=0, err_msg=k)
    only_old = learner.score(state.policy, None, None, batch, rows_per_chunk=4)
    assert set(only_old) == {"old_logprobs"}
    with pytest.raises(ValueError, match="rows_per_chunk=3 does not divide the batch's 8 rows"):
        learner.score(state.policy, None, None, batch, rows_per_chunk=3)
