"""From trajectories to the arrays one RL update reads: rows, old/ref log-probs, advantages.

Whole-episode mode: one row per trajectory; the kernels' Batch is built over those rows directly
(loss mask and step ids of the tokens, rewards per step), so token-level GAE runs over the agent
tokens of the whole trajectory. Rows built with ``bootstrap=True`` (runs with a critic) carry a
truncated episode's final observation, and GAE bootstraps from the critic's value after it
(``trajectory.episode_rows``, ``kernels.token_gae``).

Step-wise mode: one row per step, but credit is assigned per trajectory: a step-level Batch with
one pseudo-token per step (loss mask = step mask, step id = the step) gives ``Advantages.steps``
[B, S] (or token advantages over pseudo-tokens, the same numbers), and each step row's action
tokens receive its step's advantage. A KL reward penalty (``kl=``, [R, T] over the rows) enters
each pseudo-token as the sum of its step's action-token KL (:func:`step_kl`): the step loses
``kl_coef`` times the KL the token-level estimators subtract over that action in episode mode.
Critic-based estimators need the episode mode (config validation enforces it).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from agentrl_jax import kernels
from agentrl_jax.rollout.trajectory import (
    TokenRows,
    Trajectory,
    episode_row_length,
    episode_rows,
    step_arrays,
    step_rows,
)
from agentrl_jax.sampling import buckets as bk


def round_up(n: int, multiple: int) -> int:
    return max(multiple, -(-n // multiple) * multiple)


_ROW_BUCKETS = bk.default_buckets(32)


def length_bucket(n: int) -> int:
    """The sampler's bucket rule for row lengths, so updates compile once per bucket."""
    return bk.round_up(n, _ROW_BUCKETS, what="row length")


@dataclasses.dataclass
class RLRows:
    rows: TokenRows
    arrays: object  # StepArrays of the trajectories
    step_of_row: np.ndarray | None  # step-wise mode: the step index of each row


def build_rows(
    trajs: list[Trajectory],
    mode: str,
    pad_id: int,
    row_multiple: int,
    bootstrap: bool = False,
    invalid_action_reward: float = 0.0,
) -> RLRows:
    """Token rows padded to a length bucket and to a multiple of ``row_multiple`` rows.

    ``bootstrap`` (whole-episode mode, for a critic): truncated episodes' rows also hold the
    state after their last action (see ``trajectory.episode_rows``). ``invalid_action_reward``
    is added to the reward of each step whose action the env refused (``trajectory.refused``).
    """
    num_steps = max(len(t.steps) for t in trajs)
    arrays = step_arrays(trajs, num_steps, invalid_action_reward)
    if mode == "episode":
        longest = max(episode_row_length(t, bootstrap) for t in trajs)
        rows = episode_rows(trajs, length_bucket(longest), pad_id, bootstrap)
        step_of_row = None
    else:
        longest = max(len(s.prompt_ids) + len(s.action_ids) for t in trajs for s in t.steps)
        rows = step_rows(trajs, length_bucket(longest), pad_id)
        step_of_row = np.concatenate([np.arange(len(t.steps)) for t in trajs]).astype(np.int32)
    rows = _pad_rows(rows, round_up(rows.tokens.shape[0], row_multiple), pad_id)
    if step_of_row is not None:
        step_of_row = np.pad(step_of_row, (0, rows.tokens.shape[0] - len(step_of_row)))
    return RLRows(rows, arrays, step_of_row)


def episode_row_weights(traj_index: np.ndarray) -> np.ndarray:
    """[R] float32: 1 / the number of rows of each row's trajectory (0 on padding rows).

    The row weights of ``aggregation="episode_mean"``: a trajectory's rows then weigh 1 together,
    whether it is one whole-episode row or one row per step, so a 10-step failure counts as much
    as a 3-step win rather than 10 / 3 times as much.
    """
    real = traj_index >= 0
    counts = np.bincount(traj_index[real]) if real.any() else np.zeros(0, np.int64)
    weights = np.zeros(traj_index.shape, np.float32)
    weights[real] = 1.0 / counts[traj_index[real]]
    return weights


def _pad_rows(rows: TokenRows, num_rows: int, pad_id: int) -> TokenRows:
    extra = num_rows - rows.tokens.shape[0]
    if extra <= 0:
        return rows

    def pad(x, value):
        return np.concatenate([x, np.full((extra, *x.shape[1:]), value, x.dtype)])

    return TokenRows(
        tokens=pad(rows.tokens, pad_id),
        mask=pad(rows.mask, 0),
        loss_mask=pad(rows.loss_mask, 0),
        step_ids=pad(rows.step_ids, -1),
        old_logprobs=pad(rows.old_logprobs, 0),
        traj_index=pad(rows.traj_index, -1),
        allowed=pad(rows.allowed, -1),
        bootstrap_pos=pad(rows.bootstrap_pos, -1),
    )


def advantages(
    rl: RLRows,
    num_trajs: int,
    algo: str,
    config: kernels.AdvantageConfig,
    *,
    values: np.ndarray | None = None,
    kl: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Token advantages [R, T] for the rows (and value targets [R, T] for gae, else None).

    With ``values``, rows built with ``bootstrap=True`` give the kernels the critic's value of
    the state after a truncated episode's last action (0 for terminal episodes).

    ``kl`` ([R, T], read on action tokens only) is the per-token KL reward penalty of an estimator
    registered with ``kl_reward=True``: per token in whole-episode rows, per step (the sum over
    the step's action tokens, :func:`step_kl`) in step-wise rows.
    """
    spec = kernels.get_advantage_spec(algo)
    rows, arrays = rl.rows, rl.arrays
    if rl.step_of_row is None:
        n = num_trajs
        bootstrap = None
        pos = rows.bootstrap_pos[:n]
        if values is not None:  # always an array then: one compiled shape with or without cuts
            bootstrap = np.where(pos >= 0, values[np.arange(n), np.maximum(pos, 0)], 0.0)
        batch = kernels.make_batch(
            loss_mask=rows.loss_mask[:n],
            step_ids=rows.step_ids[:n],
            rewards=arrays.rewards,
            step_mask=arrays.step_mask,
            group_ids=arrays.group_ids,
            state_keys=arrays.state_keys,
            bootstrap_values=bootstrap,
        )
        out = spec.fn(
            batch,
            config,
            values=None if values is None else values[:n],
            kl=None if kl is None else kl[:n],
        )
        adv = _pad_to(np.asarray(out.tokens), rows.tokens.shape)
        ret = None if out.returns is None else _pad_to(np.asarray(out.returns), rows.tokens.shape)
        return adv * rows.loss_mask, ret
    # Step-wise: a step-level batch with one pseudo-token per step.
    step_mask = arrays.step_mask
    pseudo_ids = np.where(step_mask > 0, np.arange(step_mask.shape[1])[None], -1).astype(np.int32)
    batch = kernels.make_batch(
        loss_mask=step_mask,
        step_ids=pseudo_ids,
        rewards=arrays.rewards,
        step_mask=step_mask,
        group_ids=arrays.group_ids,
        state_keys=arrays.state_keys,
    )
    step_penalty = None if kl is None else step_kl(rl, kl, step_mask.shape)
    out = spec.fn(batch, config, kl=step_penalty)
    step_adv = np.asarray(out.steps if out.steps is not None else out.tokens)
    real = rows.traj_index >= 0
    per_row = np.zeros(rows.tokens.shape[0], np.float32)
    per_row[real] = step_adv[rows.traj_index[real], rl.step_of_row[real]]
    return per_row[:, None] * rows.loss_mask, None


def step_kl(rl: RLRows, kl: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """[B, S] float32: each step's KL, the sum of ``kl`` over its step row's action tokens.

    Step-wise rows' KL reward penalty: one pseudo-token per step carries what the token-level
    estimators spread over the action's tokens (0 on padded steps).

    Args:
      rl: step-wise rows (``build_rows(..., "step", ...)``).
      kl: [R, T] per-token KL of the rows (positions off the loss mask are ignored).
      shape: (B, S), the trajectories' step arrays.
    """
    rows = rl.rows
    kl = np.asarray(kl)
    if kl.shape != rows.loss_mask.shape:
        raise ValueError(
            f"rl_batch.advantages: kl is of shape {kl.shape}; expected the rows' shape "
            f"{rows.loss_mask.shape} (a per-token KL of every row)"
        )
    per_row = np.sum(np.where(rows.loss_mask > 0, kl, 0.0), axis=1, dtype=np.float64)
    real = rows.traj_index >= 0
    out = np.zeros(shape, np.float64)
    np.add.at(out, (rows.traj_index[real], rl.step_of_row[real]), per_row[real])
    return out.astype(np.float32)


def _pad_to(x: np.ndarray, shape) -> np.ndarray:
    out = np.zeros(shape, np.float32)
    out[: x.shape[0], : x.shape[1]] = x
    return out
