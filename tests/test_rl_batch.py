"""``rl/rl_batch.py``: the advantages of step-wise rows against plain numpy references."""

import os

import numpy as np
import pytest
from flax import nnx

from agentrl_jax import kernels
from agentrl_jax.benchmarks.learner import synthetic_episodes
from agentrl_jax.models import CausalLM, preset
from agentrl_jax.rl import rl_batch
from agentrl_jax.rl.rl_update import RLUpdate
from agentrl_jax.run.build import rl_learner
from agentrl_jax.run.config import from_config_dict, load_config_file

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _step_rows(seed=0):
    trajs = synthetic_episodes(2, 3, vocab=64, max_steps=4, seed=seed)
    return trajs, rl_batch.build_rows(trajs, "step", pad_id=0, row_multiple=4)


def _reference_reinforce_pp_steps(trajs, rows, step_of_row, kl, gamma, kl_coef, eps):
    """REINFORCE++ over environment steps, by loops: a step's reward less ``kl_coef`` times the
    KL summed over its action's tokens, discounted returns per episode, whitened over every
    real step (unbiased std); each step row's action tokens get its step's advantage."""
    returns = {}
    for i, traj in enumerate(trajs):
        g = 0.0
        for k in reversed(range(len(traj.steps))):
            (r,) = np.flatnonzero((rows.traj_index == i) & (step_of_row == k))
            step_kl = float(np.sum(kl[r].astype(np.float64) * rows.loss_mask[r]))
            g = traj.steps[k].reward - kl_coef * step_kl + gamma * g
            returns[i, k] = g
    values = np.array(list(returns.values()))
    mean, std = values.mean(), values.std(ddof=1)
    want = np.zeros(rows.tokens.shape)
    for (i, k), g in returns.items():
        (r,) = np.flatnonzero((rows.traj_index == i) & (step_of_row == k))
        want[r] = (g - mean) / (std + eps) * rows.loss_mask[r]
    return want


def test_step_rows_get_the_kl_reward_penalty():
    """kl_mode="reward" in step-wise contexts: each step's reward loses ``kl_coef`` times its
    action tokens' KL (the sum the token-level estimators subtract over that action)."""
    trajs, rl = _step_rows()
    rows = rl.rows
    rng = np.random.default_rng(1)
    kl = (rng.normal(0.2, 0.3, rows.tokens.shape) * rows.loss_mask).astype(np.float32)
    config = kernels.AdvantageConfig(gamma=0.9, kl_coef=0.3)
    with_kl, _ = rl_batch.advantages(rl, len(trajs), "reinforce_pp", config, kl=kl)
    without, _ = rl_batch.advantages(rl, len(trajs), "reinforce_pp", config)
    assert not np.allclose(with_kl, without, atol=1e-3)  # the penalty is not dropped
    want = _reference_reinforce_pp_steps(
        trajs, rows, rl.step_of_row, kl, config.gamma, config.kl_coef, config.eps
    )
    np.testing.assert_allclose(with_kl, want, rtol=0, atol=1e-5)
    # With kl_coef 0 the KL changes nothing.
    plain = kernels.AdvantageConfig(gamma=0.9)
    zero, _ = rl_batch.advantages(rl, len(trajs), "reinforce_pp", plain, kl=kl)
    np.testing.assert_array_equal(
        zero, rl_batch.advantages(rl, len(trajs), "reinforce_pp", plain)[0]
    )


def test_step_kl_only_counts_action_tokens():
    """KL on prompt or padding positions (an unmasked array) never reaches a step's reward."""
    trajs, rl = _step_rows(seed=2)
    rows = rl.rows
    rng = np.random.default_rng(3)
    kl = rng.normal(0.0, 0.5, rows.tokens.shape).astype(np.float32) * rows.loss_mask
    noisy = kl + 100.0 * (1.0 - rows.loss_mask)
    config = kernels.AdvantageConfig(kl_coef=0.5)
    got, _ = rl_batch.advantages(rl, len(trajs), "reinforce_pp", config, kl=noisy)
    want, _ = rl_batch.advantages(rl, len(trajs), "reinforce_pp", config, kl=kl)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_step_kl_must_match_the_rows():
    trajs, rl = _step_rows()
    config = kernels.AdvantageConfig(kl_coef=0.5)
    with pytest.raises(ValueError, match=r"kl is of shape \(3, 5\); expected the rows' shape"):
        rl_batch.advantages(rl, len(trajs), "reinforce_pp", config, kl=np.zeros((3, 5)))


def _kl_reference(logp, ref, mask, kind):
    rho = logp.astype(np.float64) - ref.astype(np.float64)
    kl = {"k1": rho, "k2": 0.5 * rho**2, "k3": np.exp(-rho) - 1.0 + rho}[kind]
    return np.where(mask > 0, kl, 0.0)


@pytest.mark.parametrize(
    "kind, mode", [("k1", "episode"), ("k2", "episode"), ("k3", "episode"), ("k3", "step")]
)
def test_the_update_penalises_rewards_with_the_configured_kl_estimator(kind, mode, monkeypatch):
    """kl_mode="reward": the KL the advantages get is ``rl.kl_estimator``'s (as the loss mode's
    is), from the old and reference log-probs the update computed, in either context mode."""
    cd = load_config_file(os.path.join(REPO, "configs", "tiny_textworld.py") + ":test")
    cd.rollout.context_mode = mode
    cd.rl.update(algo="reinforce_pp", kl_mode="reward", kl_coef=0.5, kl_estimator=kind)
    config = from_config_dict(cd)
    cfg = preset(
        config.model.preset, vocab_size=config.model.tokenizer_vocab, **dict(config.model.overrides)
    )
    policy = CausalLM(cfg, rngs=nnx.Rngs(0))
    reference = nnx.state(CausalLM(cfg, rngs=nnx.Rngs(1)), nnx.Param)  # KL > 0
    learner = rl_learner(config, policy, None)
    seen = {}
    advantages = rl_batch.advantages

    def spy(rl, num_trajs, algo, adv_config, *, values=None, kl=None):
        seen["kl"], seen["mask"], seen["coef"] = kl, rl.rows.loss_mask, adv_config.kl_coef
        return advantages(rl, num_trajs, algo, adv_config, values=values, kl=kl)

    monkeypatch.setattr(rl_batch, "advantages", spy)
    update = RLUpdate(learner.spec, learner, pad_id=0)
    trajs = synthetic_episodes(2, config.rollout.group_size, cfg.vocab_size, 3)
    batch, _, _ = update.batch(learner.init(policy, None), reference, trajs)
    old, ref = np.asarray(batch["old_logprobs"]), np.asarray(batch["ref_logprobs"])
    want = _kl_reference(old, ref, seen["mask"], kind)
    assert seen["coef"] == 0.5 and np.abs(want).max() > 1e-3
    np.testing.assert_allclose(seen["kl"], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["episode", "step"])
def test_refused_actions_are_penalised_as_if_the_env_had_rewarded_them_so(mode):
    """``invalid_action_reward``: every refused step (``invalid_action`` or a malformed tool
    call) gets the penalty added to its reward, and the advantages are those of the same
    episodes with the env's rewards edited by hand. In groups that all lose, GRPO gives every
    episode advantage 0 without it; with it, the episodes with fewer refusals gain."""
    trajs = synthetic_episodes(3, 4, vocab=64, max_steps=4, seed=2)
    rng = np.random.default_rng(3)
    for t in trajs:
        t.won = False
        for s in t.steps:
            s.reward, s.done = 0.0, False
            key = "invalid_tool_call" if rng.random() < 0.2 else "invalid_action"
            s.info[key] = bool(rng.random() < 0.5)
    config = kernels.AdvantageConfig()
    penalised = rl_batch.build_rows(trajs, mode, 0, 4, invalid_action_reward=-0.25)
    plain = rl_batch.build_rows(trajs, mode, 0, 4)
    adv, _ = rl_batch.advantages(penalised, len(trajs), "grpo", config)
    zero, _ = rl_batch.advantages(plain, len(trajs), "grpo", config)
    assert not zero.any()  # every episode lost: no signal without the penalty
    for t in trajs:
        for s in t.steps:
            s.reward = (
                -0.25 if s.info.get("invalid_action") or s.info.get("invalid_tool_call") else 0.0
            )
    edited = rl_batch.build_rows(trajs, mode, 0, 4)
    np.testing.assert_array_equal(penalised.arrays.rewards, edited.arrays.rewards)
    want, _ = rl_batch.advantages(edited, len(trajs), "grpo", config)
    np.testing.assert_array_equal(adv, want)
    assert (penalised.arrays.rewards < 0).sum() > len(trajs)  # many steps refused
    # The episode of each group with the fewest refusals gets the largest advantage.
    refusals = (penalised.arrays.rewards < 0).sum(axis=1)
    rows = penalised.rows
    per_episode = np.array(
        [adv[rows.traj_index == i][rows.loss_mask[rows.traj_index == i] > 0][0] for i in range(12)]
    )
    for g in range(3):
        group = slice(4 * g, 4 * g + 4)
        assert np.argmax(per_episode[group]) == np.argmin(refusals[group])
