"""Trajectories as the rollout records them, and their assembly into padded training arrays.

A :class:`Step` holds the exact ids the model was fed before acting (``prompt_ids``), the ids it
sampled (``action_ids``) with their log-probs, and what the environment answered. Two context modes
decide what ``prompt_ids`` is:

- whole-episode: the ids appended since the previous action (the first step's include the system
  prompt); the concatenation over steps is the one sequence the model read, so the episode is one
  training row with environment tokens masked out of the loss.
- step-wise: the full context of this step (objective plus the last k turns, rebuilt from the
  stored ids of those turns, never re-encoded); each step is its own training row.

In both modes ``obs_ids`` is the step's newest observation turn as the model read it (the end of
``prompt_ids``), and the trajectory keeps the observation that followed its last action
(``final_obs_ids``, encoded as the next turn would have read it), so every action has a known
next observation: ENVRL's s_{t+1}, and the state a truncated episode's critic bootstraps from.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from agentrl_jax.envs.base import Task
from agentrl_jax.sampling import buckets as bk


@dataclasses.dataclass
class Step:
    prompt_ids: list[int]
    action_ids: list[int]
    action_logprobs: list[float]
    # Constrained decoding: per action token, the ids its draw was restricted to (None: any).
    action_allowed: list[list[int]] | None = None
    reward: float = 0.0
    state_key: int = 0
    done: bool = False
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    # The newest observation turn, as read: the last len(obs_ids) ids of prompt_ids.
    obs_ids: list[int] = dataclasses.field(default_factory=list)
    # The policy that sampled the action: its RL version (asynchronous RL's
    # ``rollout/staleness`` is the learner's version minus this, the mean over the steps).
    policy_version: int = 0


@dataclasses.dataclass
class Trajectory:
    """One episode of one task instance; ``group`` is shared by rollouts of the same instance.

    Attributes:
      truncated: cut by a limit (the rollout's turns or context length, or the environment's
        step limit) rather than ended by the environment (won or lost).
      header_ids: step-wise mode: the system prompt and goal every context starts with (empty in
        whole-episode mode, where the first step's prompt holds them).
      final_obs_ids: the observation after the last action, as the next turn would have read it
        (empty when unknown: an infrastructure failure).
    """

    task: Task
    group: int
    steps: list[Step] = dataclasses.field(default_factory=list)
    won: bool = False
    truncated: bool = False
    infra_failure: bool = False
    header_ids: list[int] = dataclasses.field(default_factory=list)
    final_obs_ids: list[int] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The episode as JSON (``from_json`` gives it back, equal)."""
        out = dataclasses.asdict(self)
        out["task"]["params"] = [list(p) for p in self.task.params]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Trajectory:
        data = dict(data)
        task = dict(data.pop("task"))
        task["params"] = tuple(tuple(p) for p in task.get("params", ()))
        steps = [Step(**s) for s in data.pop("steps")]
        return cls(task=Task(**task), steps=steps, **data)

    @property
    def episode_return(self) -> float:
        return float(sum(s.reward for s in self.steps))

    @property
    def num_tokens(self) -> int:
        return sum(len(s.prompt_ids) + len(s.action_ids) for s in self.steps)


@dataclasses.dataclass
class TokenRows:
    """Padded token rows for a forward pass and the loss.

    Attributes:
      tokens: [R, T] int32 ids (pad_id on padding).
      mask: [R, T] 1 on real tokens.
      loss_mask: [R, T] 1 on sampled (action) tokens.
      step_ids: [R, T] int32 step index of each action token, -1 elsewhere.
      old_logprobs: [R, T] float32 the sampler's log-probs on action tokens, 0 elsewhere.
      traj_index: [R] which trajectory each row came from.
      allowed: [R, T, K] int32 constrained decoding: the ids the draw of token t was restricted
        to, -1 padded (all -1: the whole vocabulary); K is 0 when no action was constrained.
      bootstrap_pos: [R] int32 whole-episode rows of truncated episodes built with
        ``bootstrap=True``: the position where the next action's first token would have been,
        after the final observation (appended as environment tokens), so the critic's value
        there is V of the state after the last action; -1 elsewhere.
    """

    tokens: np.ndarray
    mask: np.ndarray
    loss_mask: np.ndarray
    step_ids: np.ndarray
    old_logprobs: np.ndarray
    traj_index: np.ndarray
    allowed: np.ndarray
    bootstrap_pos: np.ndarray


@dataclasses.dataclass
class StepArrays:
    """Per-step arrays of B trajectories padded to S steps (what the kernels' Batch reads)."""

    rewards: np.ndarray  # [B, S] float32
    step_mask: np.ndarray  # [B, S] float32
    state_keys: np.ndarray  # [B, S] int64
    group_ids: np.ndarray  # [B] int64


def refused(step: Step) -> bool:
    """Whether the env refused the step's action: a command the game did not take
    (``invalid_action``) or a malformed tool call the rollout answered itself."""
    return bool(step.info.get("invalid_action") or step.info.get("invalid_tool_call"))


def step_arrays(
    trajs: list[Trajectory], num_steps: int, invalid_action_reward: float = 0.0
) -> StepArrays:
    """Per-step rewards, masks and state keys, padded to ``num_steps``; a refused action's
    reward gets ``invalid_action_reward`` added (``refused``)."""
    b = len(trajs)
    rewards = np.zeros((b, num_steps), np.float32)
    step_mask = np.zeros((b, num_steps), np.float32)
    state_keys = np.zeros((b, num_steps), np.int64)
    for i, traj in enumerate(trajs):
        n = len(traj.steps)
        if n > num_steps:
            raise ValueError(f"trajectory {i} has {n} steps; the batch holds {num_steps}")
        rewards[i, :n] = [s.reward + invalid_action_reward * refused(s) for s in traj.steps]
        step_mask[i, :n] = 1.0
        state_keys[i, :n] = [s.state_key for s in traj.steps]
    groups = np.asarray([t.group for t in trajs], np.int64)
    return StepArrays(rewards, step_mask, state_keys, groups)


def bootstraps(traj: Trajectory) -> bool:
    """Whether the episode's last action leads to a state the critic must value (truncated)."""
    return traj.truncated and bool(traj.final_obs_ids)


def episode_row_length(traj: Trajectory, bootstrap: bool = False) -> int:
    """Tokens the whole-episode row of ``traj`` needs (see :func:`episode_rows`)."""
    if bootstrap and bootstraps(traj):
        return traj.num_tokens + len(traj.final_obs_ids) + 1
    return traj.num_tokens


def episode_rows(
    trajs: list[Trajectory], seq_len: int, pad_id: int, bootstrap: bool = False
) -> TokenRows:
    """Whole-episode mode: one row per trajectory, the concatenation of all its steps' ids.

    With ``bootstrap``, a truncated episode's row goes on with its final observation (environment
    tokens, no loss) and one more column, whose critic value (values[:, t] is V of the prefix
    before t) is V of the state the next action would have been taken from: ``bootstrap_pos``.
    """
    rows = _alloc(len(trajs), seq_len, pad_id, _num_allowed(trajs))
    for i, traj in enumerate(trajs):
        pos = 0
        for s, step in enumerate(traj.steps):
            pos = _put(rows, i, pos, step.prompt_ids, None, None, seq_len, i)
            pos = _put(rows, i, pos, step.action_ids, s, step.action_logprobs, seq_len, i)
            _put_allowed(rows, i, pos, step)
        if bootstrap and bootstraps(traj):
            pos = _put(rows, i, pos, traj.final_obs_ids, None, None, seq_len - 1, i)
            rows.bootstrap_pos[i] = pos
        rows.traj_index[i] = i
    return rows


def step_rows(trajs: list[Trajectory], seq_len: int, pad_id: int) -> TokenRows:
    """Step-wise mode: one row per step (its full context, then its action); step id is 0."""
    total = sum(len(t.steps) for t in trajs)
    rows = _alloc(total, seq_len, pad_id, _num_allowed(trajs))
    r = 0
    for i, traj in enumerate(trajs):
        for step in traj.steps:
            pos = _put(rows, r, 0, step.prompt_ids, None, None, seq_len, i)
            pos = _put(rows, r, pos, step.action_ids, 0, step.action_logprobs, seq_len, i)
            _put_allowed(rows, r, pos, step)
            rows.traj_index[r] = i
            r += 1
    return rows


def _alloc(num_rows: int, seq_len: int, pad_id: int, num_allowed: int = 0) -> TokenRows:
    return TokenRows(
        tokens=np.full((num_rows, seq_len), pad_id, np.int32),
        mask=np.zeros((num_rows, seq_len), np.float32),
        loss_mask=np.zeros((num_rows, seq_len), np.float32),
        step_ids=np.full((num_rows, seq_len), -1, np.int32),
        old_logprobs=np.zeros((num_rows, seq_len), np.float32),
        traj_index=np.zeros((num_rows,), np.int32),
        allowed=np.full((num_rows, seq_len, num_allowed), -1, np.int32),
        bootstrap_pos=np.full((num_rows,), -1, np.int32),
    )


def _num_allowed(trajs: list[Trajectory]) -> int:
    """K of ``TokenRows.allowed``: the most ids one draw allowed, rounded up to a count bucket
    (so RL updates compile once per bucket); 0 when no action was constrained."""
    most = max(
        (len(a) for t in trajs for s in t.steps for a in (s.action_allowed or ())), default=0
    )
    return 0 if most == 0 else bk.round_up(most, bk.COUNT_BUCKETS, what="allowed ids")


def _put_allowed(rows: TokenRows, r: int, end: int, step: Step) -> None:
    """Writes the allowed ids of a step's action tokens, which end at position ``end``."""
    if not step.action_allowed:
        return
    start = end - len(step.action_ids)
    for t, ids in enumerate(step.action_allowed):
        rows.allowed[r, start + t, : len(ids)] = ids


def _put(rows, r, pos, ids, step, logprobs, seq_len, traj):
    n = len(ids)
    if pos + n > seq_len:
        raise ValueError(
            f"trajectory {traj} needs {pos + n} tokens; the batch rows hold {seq_len} "
            "(the rollout truncates episodes to the configured max_seq_len)"
        )
    rows.tokens[r, pos : pos + n] = ids
    rows.mask[r, pos : pos + n] = 1.0
    if step is not None:
        rows.loss_mask[r, pos : pos + n] = 1.0
        rows.step_ids[r, pos : pos + n] = step
        rows.old_logprobs[r, pos : pos + n] = logprobs
    return pos + n
