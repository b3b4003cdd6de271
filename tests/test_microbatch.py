"""Gradient accumulation inside one jitted step (issue 12).

A minibatch split into microbatches (``Learner(microbatch_size=...)``, scanned on device) must
give the whole minibatch's update: the same new parameters, optimizer states and metrics, in
float32 to fixed tolerances, for every aggregation mode, with a critic, KL, entropy bonus, ENVRL
auxiliary losses and constrained decoding (``allowed``).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from agentrl_jax import kernels
from agentrl_jax.models import ValueModel
from agentrl_jax.models.testing import random_model
from agentrl_jax.rl.learner import Learner
from agentrl_jax.rl.spec import LossWeights, RLSpec
from agentrl_jax.run.config import ConfigError, base_config, from_config_dict
from agentrl_jax.sampling.testing import SMALL, random_policy

TOL = 1e-5


def _tx():
    """SGD with momentum (the trace is the optimizer state), after global-norm clipping.

    Not Adam: its first step moves each parameter by lr * g / (|g| + eps), so a coordinate whose
    gradient is ~1e-7 (float32 rounding of the summation order, microbatched or not) moves by up
    to lr either way. The gradients themselves agree to ~2e-7; with SGD the parameters show it.
    """
    return optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.5, momentum=0.9))


B, T, K, L = 8, 16, 4, 12  # rows, tokens, allowed ids per token, ENVRL example length
MICRO = 2  # rows per microbatch: 4 microbatches


def _max_diff(a, b) -> float:
    leaves = zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y)))) for x, y in leaves)


def _sft_batch(seed=0):
    """Rows of different lengths and action spans, two padded rows and one without actions."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, SMALL.vocab_size, (B, T)).astype(np.int32)
    mask = np.ones((B, T), np.float32)
    mask[1, 13:] = 0
    mask[6, 14:] = 0
    loss_mask = np.zeros((B, T), np.float32)
    step_ids = np.full((B, T), -1, np.int32)
    for b in range(B):
        if b == 3:
            continue  # a row without action tokens: left out of the seq_mean_* row count
        first, second = 1 + b % 3, 1 + (2 * b) % 4  # two actions of 1-3 and 1-4 tokens
        loss_mask[b, 3 : 3 + first] = 1
        step_ids[b, 3 : 3 + first] = 0
        start = 5 + first
        loss_mask[b, start : start + second] = 1
        step_ids[b, start : start + second] = 1
    return {"tokens": tokens, "mask": mask, "loss_mask": loss_mask, "step_ids": step_ids}


def _rl_batch(learner, params, constrained, seed=0):
    """An RL minibatch with clipped ratios, a non-zero KL, value targets and ENVRL examples."""
    batch = _sft_batch(seed)
    rng = np.random.default_rng(seed + 1)
    on = batch["loss_mask"]
    if constrained:
        # Each action token drawn from itself and two other ids; the rest unconstrained.
        allowed = np.full((B, T, K), -1, np.int32)
        others = rng.integers(0, SMALL.vocab_size, (B, T, 2))
        allowed[..., 0] = batch["tokens"]
        allowed[..., 1:3] = others
        allowed[on == 0] = -1
        batch["allowed"] = allowed
    old = np.asarray(learner.policy_logprobs(params, batch))
    noise = lambda scale: (scale * rng.normal(size=(B, T)) * on).astype(np.float32)  # noqa: E731
    batch.update(
        old_logprobs=old + noise(0.3),  # ratios up to exp(+-0.9): the clip is active
        ref_logprobs=old - noise(0.2),  # a KL that is not 0
        advantages=noise(1.0),
        old_values=noise(0.5),
        returns=noise(1.0),
        iteration=np.asarray(3, np.int32),
    )
    # ENVRL examples: as many rows as the minibatch (as the trainer draws them), one empty.
    for kind in ("sp", "id"):
        lengths = rng.integers(4, L + 1, B)
        lengths[5] = 0
        cols = np.arange(L)[None, :]
        batch[f"aux_{kind}_tokens"] = rng.integers(0, SMALL.vocab_size, (B, L)).astype(np.int32)
        batch[f"aux_{kind}_mask"] = (cols < lengths[:, None]).astype(np.float32)
        batch[f"aux_{kind}_target_mask"] = (
            (cols < lengths[:, None]) & (cols >= lengths[:, None] - 3)
        ).astype(np.float32)
    return {k: jnp.asarray(v) for k, v in batch.items()}


def _rl_learners(microbatch_sizes, mesh=None, **loss_kwargs):
    """(learner, state) per microbatch size, sharing the policy, critic and settings; the last
    learner's state on ``mesh`` when given."""
    policy = random_policy(SMALL, seed=0)
    critic = random_model(ValueModel, SMALL, seed=1)
    loss_kwargs = dict(loss_kwargs)
    temperature = loss_kwargs.pop("temperature", 1.0)
    out = []
    for i, size in enumerate(microbatch_sizes):
        on_mesh = mesh if i == len(microbatch_sizes) - 1 else None
        learner = Learner(
            policy,
            critic,
            _tx(),
            _tx(),
            spec=RLSpec.for_losses(
                loss_config=kernels.LossConfig(**loss_kwargs),
                weights=LossWeights(value=0.5, kl=0.1, entropy=0.01),
                envrl=kernels.EnvrlConfig(sp_weight=0.5, id_weight=0.25, horizon=10),
                temperature=temperature,
            ),
            microbatch_size=size,
            mesh=on_mesh,
        )
        out.append((learner, learner.init(policy, critic)))
    return out


def _compare(name, whole, micro):
    """Asserts equal states and metrics; prints the largest differences."""
    (state_w, metrics_w), (state_m, metrics_m) = whole, micro
    assert set(metrics_m) == set(metrics_w)
    state_diff = _max_diff(state_m, state_w)
    metric_diff = {k: abs(float(metrics_m[k]) - float(metrics_w[k])) for k in metrics_w}
    worst = max(metric_diff, key=metric_diff.get)
    print(
        f"{name}: params and optimizer states max |diff| {state_diff:.2e}; metrics max |diff| "
        f"{metric_diff[worst]:.2e} ({worst})"
    )
    assert state_diff <= TOL
    for k in metrics_w:
        np.testing.assert_allclose(float(metrics_m[k]), float(metrics_w[k]), rtol=TOL, atol=TOL)


@pytest.mark.parametrize(
    "loss_kwargs, constrained",
    [
        pytest.param(dict(aggregation="token_mean"), False, marks=pytest.mark.slow),
        (
            dict(aggregation="seq_mean_token_mean", ratio_level="action", dual_clip=3.0),
            True,
        ),
        pytest.param(
            dict(aggregation="seq_mean_token_sum", temperature=0.7), True, marks=pytest.mark.slow
        ),
    ],
)
def test_microbatched_rl_step_equals_the_whole_minibatch_step(loss_kwargs, constrained):
    (whole, state_w), (micro, state_m) = _rl_learners((None, MICRO), **loss_kwargs)
    batch = _rl_batch(whole, state_w.policy, constrained)
    for step in range(2):  # the second step starts from moved parameters and momentum
        state_w, metrics_w = whole.rl_step(state_w, batch)
        state_m, metrics_m = micro.rl_step(state_m, batch)
        _compare(f"{loss_kwargs} step {step}", (state_w, metrics_w), (state_m, metrics_m))
    # Every term is really there: clipped ratios, KL, entropy, value loss, ENVRL losses.
    for key in ("losses/clipfrac", "losses/kl_ref", "losses/entropy", "losses/value_loss"):
        assert float(metrics_w[key]) > 1e-3, key
    assert float(metrics_w["envrl/sp_loss"]) > 0 and float(metrics_w["envrl/id_loss"]) > 0
    assert float(metrics_w["train/skipped_nonfinite"]) == 0.0

    # A non-finite value in one microbatch still skips the whole update, once.
    poisoned = {**batch, "advantages": batch["advantages"].at[5, 4].set(jnp.nan)}
    before = jax.tree.map(np.asarray, state_m)
    state_m, metrics_m = micro.rl_step(state_m, poisoned)
    assert float(metrics_m["train/skipped_nonfinite"]) == 1.0
    assert _max_diff(state_m.replace(step=before.step), before) == 0.0


@pytest.mark.slow  # ~40 s of compilation on 2 cores
def test_microbatches_on_a_mesh_match_the_whole_minibatch_on_one_device():
    from agentrl_jax.sharding import make_mesh

    # 2 microbatches of 4 rows; each microbatch's rows spread over the 4 (data, fsdp) shards.
    (whole, state_w), (micro, state_m) = _rl_learners((None, 4), mesh=make_mesh((2, 2, 2)))
    batch = _rl_batch(whole, state_w.policy, constrained=True)
    state_w, metrics_w = whole.rl_step(state_w, batch)
    state_m, metrics_m = micro.rl_step(state_m, micro.place_batch(batch))
    _compare("mesh (2, 2, 2), 2 microbatches", (state_w, metrics_w), (state_m, metrics_m))
    gate = state_m.policy["trunk"]["layers"][0]["mlp"]["gate_weight_df"].value
    assert len(gate.sharding.device_set) == 8


def test_microbatched_sft_step_equals_the_whole_batch_step():
    policy = random_policy(SMALL, seed=2)
    states, learners = [], []
    for size in (None, MICRO):
        learners.append(Learner(policy, None, _tx(), microbatch_size=size))
        states.append(learners[-1].init(policy))
    batch = {k: jnp.asarray(v) for k, v in _sft_batch(seed=4).items()}
    for step in range(2):
        results = [learner.sft_step(state, batch) for learner, state in zip(learners, states)]
        _compare(f"sft step {step}", *results)
        states = [state for state, _ in results]
    assert float(results[0][1]["sft/tokens"]) == float(batch["loss_mask"].sum())


@pytest.mark.slow  # the degenerate split; ~25 s of compilation on 2 cores
def test_one_microbatch_of_the_whole_minibatch_is_the_same_step():
    (whole, state_w), (micro, state_m) = _rl_learners((None, B))
    batch = _rl_batch(whole, state_w.policy, constrained=False)
    state_w, metrics_w = whole.rl_step(state_w, batch)
    state_m, metrics_m = micro.rl_step(state_m, batch)
    assert _max_diff(state_m, state_w) == 0.0
    assert {k: float(v) for k, v in metrics_m.items()} == {
        k: float(v) for k, v in metrics_w.items()
    }


def test_a_microbatch_size_must_divide_the_batch():
    assert from_config_dict(base_config()).rl.microbatch_size == 0  # default: no split
    for section, field, size, bad in (
        ("rl", "minibatch_size", 16, 3),
        ("rl", "minibatch_size", 16, 32),
        ("sft", "batch_size", 16, 5),
    ):
        cd = base_config()
        cd[section].microbatch_size = bad
        message = f"config.{section}.microbatch_size={bad} does not divide config.{section}.{field}"
        with pytest.raises(ConfigError, match=rf"{message}={size}"):
            from_config_dict(cd)
    cd = base_config()
    cd.rl.microbatch_size = -2
    with pytest.raises(ConfigError, match="config.rl.microbatch_size is -2; expected an int >= 0"):
        from_config_dict(cd)
    cd = base_config()
    cd.rl.microbatch_size, cd.sft.microbatch_size = 4, 8
    cfg = from_config_dict(cd)
    assert (cfg.rl.microbatch_size, cfg.sft.microbatch_size) == (4, 8)

    # The learner itself, handed a batch its microbatch size does not divide (caught at trace
    # time, before anything compiles).
    policy = random_policy(SMALL, seed=0)
    learner = Learner(policy, None, optax.sgd(0.1), microbatch_size=3)
    batch = {k: jnp.asarray(v) for k, v in _sft_batch().items()}
    with pytest.raises(ValueError, match="microbatch_size=3 does not divide the batch's 8 rows"):
        learner.sft_step(learner.init(policy), batch)
    with pytest.raises(ValueError, match="microbatch_size=-1"):
        Learner(policy, None, optax.sgd(0.1), microbatch_size=-1)
