"""``aggregation="episode_mean"``: every episode weighs the same in the loss, one whole-episode
row or one row per step, so a long failure does not outweigh a short win by its length."""

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


def test_row_weights_are_one_over_the_episodes_rows():
    # Rows of trajectories 0 (3 steps), 1 (1 step), 2 (2 steps), then two padding rows.
    traj_index = np.array([0, 0, 0, 1, 2, 2, -1, -1])
    weights = rl_batch.episode_row_weights(traj_index)
    np.testing.assert_allclose(weights, [1 / 3, 1 / 3, 1 / 3, 1, 0.5, 0.5, 0, 0], rtol=1e-7)
    assert rl_batch.episode_row_weights(np.full(3, -1)).tolist() == [0, 0, 0]


def test_episode_mean_is_the_mean_over_episodes_of_their_rows_mean():
    """The PPO loss at ratio 1 is -A per token: with rows weighted 1 / their episode's rows,
    ``episode_mean`` gives the mean over episodes of each episode's mean row loss (a plain loop
    here); with a 0/1 mask it is ``seq_mean_token_mean``."""
    rng = np.random.default_rng(0)
    episode_rows = [3, 1, 2, 5]  # rows (steps) of each episode
    traj_index = np.repeat(np.arange(len(episode_rows)), episode_rows)
    r, t = len(traj_index) + 1, 8  # one padding row
    mask = np.zeros((r, t), np.float32)
    for row in range(r - 1):
        mask[row, rng.integers(0, 3) : rng.integers(4, t)] = 1.0
    adv = rng.normal(0, 1, (r, t)).astype(np.float32)
    logp = np.full((r, t), -1.0, np.float32)
    weights = rl_batch.episode_row_weights(np.append(traj_index, -1))

    def loss(mode, m):
        cfg = kernels.LossConfig(aggregation=mode)
        return float(kernels.ppo_loss(logp, logp, adv, m, config=cfg)[0].value)

    row_mean = [-adv[row][mask[row] > 0].mean() for row in range(r - 1)]
    per_episode = [np.mean([row_mean[row] for row in np.flatnonzero(traj_index == e)])
                   for e in range(len(episode_rows))]  # fmt: skip
    assert loss("episode_mean", mask * weights[:, None]) == pytest.approx(
        np.mean(per_episode), abs=1e-6
    )
    assert loss("episode_mean", mask) == pytest.approx(loss("seq_mean_token_mean", mask), abs=1e-7)
    assert loss("seq_mean_token_mean", mask) == pytest.approx(np.mean(row_mean), abs=1e-6)


@pytest.mark.parametrize("mode", ["step", "episode"])
def test_the_update_batch_carries_each_rows_weight_in_its_loss_mask(mode):
    cd = load_config_file(os.path.join(REPO, "configs", "tiny_textworld.py") + ":test")
    cd.rollout.context_mode = mode
    cd.rl.aggregation = "episode_mean"
    config = from_config_dict(cd)
    cfg = preset(
        config.model.preset, vocab_size=config.model.tokenizer_vocab, **dict(config.model.overrides)
    )
    policy = CausalLM(cfg, rngs=nnx.Rngs(0))
    learner = rl_learner(config, policy, None)
    update = RLUpdate(learner.spec, learner, pad_id=0)
    trajs = synthetic_episodes(2, config.rollout.group_size, cfg.vocab_size, 3)
    state = learner.init(policy, None)
    batch, _, _ = update.batch(state, nnx.state(policy, nnx.Param), trajs)
    rows = rl_batch.build_rows(trajs, mode, 0, config.rl.minibatch_size).rows
    placed = np.asarray(batch["loss_mask"])
    for i, traj in enumerate(trajs):
        mine = rows.traj_index == i
        want = 1.0 / len(traj.steps) if mode == "step" else 1.0
        np.testing.assert_allclose(placed[mine], rows.loss_mask[mine] * want, rtol=1e-6)
    assert not placed[rows.traj_index < 0].any()
    # The update trains with them.
    _, metrics = update.update(state, batch, {}, np.random.default_rng(0), 0)
    assert np.isfinite(metrics["losses/policy_loss"]) and metrics["train/updates"] > 0
