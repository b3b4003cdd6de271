"""The trajectory batch that credit-assignment kernels read, and its host-side validation.

Layout (B trajectories, T tokens, S environment steps; all padded to a shape bucket)::

    loss_mask  [B, T] float32  1.0 on agent-generated (action) tokens, 0.0 on prompt,
                               environment-observation and padding tokens.
    step_ids   [B, T] int32    index of the environment step (turn) a token's action belongs to;
                               -1 exactly where loss_mask is 0. The tokens of one action form a
                               single contiguous run, actions appear in step order 0, 1, 2, ...
    rewards    [B, S] float32  reward received after the action of step s (finite everywhere).
    step_mask  [B, S] float32  1.0 on the n_b real steps of row b (a prefix: steps 0..n_b-1).
    group_ids  [B]    int32    rollout group of each row (rollouts of the same task instance share
                               it), remapped to dense ids in [0, B).
    state_ids  [B, S] int32    id of the exact environment state s_t from which step t's action
                               was taken, remapped per batch so that two steps share an id iff
                               they are in the same rollout group AND have the same raw state key.
                               Dense in [0, B*S); 0 on padded steps. None when the batch has no
                               state keys (gigpo and gagpo then refuse it).
    bootstrap_values [B] float32  V of the state after each row's last action where the episode
                               was cut by a step or length limit (truncated), 0 where it ended in
                               a terminal state. Only gae reads it (see ``token_gae``). None: every
                               row ended in a terminal state.

A row with no real step (``step_mask[b, 0] == 0``) is padding and contributes nothing.

State keys: environments report a key of the exact state (an int64 hash, or a string). JAX runs in
32-bit by default, so keys never enter a kernel as they are: :func:`make_batch` remaps the pairs
(group id, raw key) to dense int32 ids on the host, once per batch, before any compute. Inside jit,
grouping is then a segment reduction over at most B*S segments, O(B*S) memory.

Build batches with :func:`make_batch`; it validates every argument on the host and raises a
``ValueError`` naming the argument, what it found and what was expected, before any compute.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Batch:
    """The padded arrays every advantage estimator reads (layout in the module docstring)."""

    loss_mask: jax.Array  # [B, T] float32
    step_ids: jax.Array  # [B, T] int32, -1 off agent tokens
    rewards: jax.Array  # [B, S] float32
    step_mask: jax.Array  # [B, S] float32, prefix of ones
    group_ids: jax.Array  # [B] int32, dense in [0, B)
    state_ids: jax.Array | None = None  # [B, S] int32, dense in [0, B*S)
    bootstrap_values: jax.Array | None = None  # [B] float32, 0 on terminal rows

    @property
    def shape(self) -> tuple[int, int, int]:
        """(B, T, S)."""
        b, t = self.loss_mask.shape
        return b, t, self.rewards.shape[1]


def _fail(arg: str, found: Any, expected: str) -> None:
    raise ValueError(f"make_batch: {arg} is {found}; expected {expected}")


def _as_2d(name: str, x: Any, expected_shape: tuple[int, ...] | None, what: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.ndim != 2:
        _fail(name, f"of shape {arr.shape} ({arr.ndim}-D)", f"a 2-D array {what}")
    if expected_shape is not None and arr.shape != expected_shape:
        _fail(name, f"of shape {arr.shape}", f"{expected_shape} {what}")
    return arr


def _check_01(name: str, arr: np.ndarray) -> None:
    bad = ~np.isin(arr, (0, 1))
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        _fail(name, f"{arr[idx].item()!r} at index {idx}", "only 0 and 1")


def _check_finite(name: str, arr: np.ndarray) -> None:
    if not np.issubdtype(arr.dtype, np.number):
        _fail(name, f"of dtype {arr.dtype}", "a float array")
    finite = np.isfinite(arr)
    if not finite.all():
        idx = tuple(int(i) for i in np.argwhere(~finite)[0])
        _fail(name, f"{arr[idx]} at index {idx}", "finite values (no NaN or inf)")


def _check_integer(name: str, arr: np.ndarray) -> None:
    if not np.issubdtype(arr.dtype, np.integer):
        _fail(name, f"of dtype {arr.dtype}", "an integer array")


def validate_steps(loss_mask: np.ndarray, step_ids: np.ndarray, step_mask: np.ndarray) -> None:
    """Checks that step_ids, loss_mask and step_mask agree (see the module docstring)."""
    n_steps = step_mask.sum(axis=1).astype(np.int64)
    prefix = np.arange(step_mask.shape[1])[None, :] < n_steps[:, None]
    if not np.array_equal(prefix, step_mask.astype(bool)):
        row = int(np.argmax((prefix != step_mask.astype(bool)).any(axis=1)))
        _fail(
            "step_mask",
            f"{step_mask[row].astype(int).tolist()} in row {row}",
            "a prefix of ones (steps 0..n-1 real, the rest padding)",
        )
    agent = loss_mask.astype(bool)
    off = (~agent) & (step_ids != -1)
    if off.any():
        idx = tuple(int(i) for i in np.argwhere(off)[0])
        _fail("step_ids", f"{step_ids[idx]} at {idx} where loss_mask is 0", "-1 off agent tokens")
    bad = agent & ((step_ids < 0) | (step_ids >= n_steps[:, None]))
    if bad.any():
        b, t = (int(i) for i in np.argwhere(bad)[0])
        _fail(
            "step_ids",
            f"{step_ids[b, t]} at {(b, t)} (an agent token)",
            f"a real step of row {b}, in [0, {n_steps[b]})",
        )
    # Each action is one contiguous run of tokens, in step order 0, 1, ..., n-1: the k-th run
    # start of a row must carry step id k, and there must be exactly n runs.
    prev = np.concatenate([np.full((agent.shape[0], 1), -2), step_ids[:, :-1]], axis=1)
    starts = agent & (step_ids != prev)
    rank = np.cumsum(starts, axis=1) - 1
    wrong = starts & (step_ids != rank)
    if wrong.any():
        b, t = (int(i) for i in np.argwhere(wrong)[0])
        _fail(
            "step_ids",
            f"a run of step {step_ids[b, t]} starting at {(b, t)} as run #{rank[b, t]}",
            "each step's tokens in one contiguous run, steps in order 0, 1, ...",
        )
    runs = starts.sum(axis=1)
    if np.any(runs != n_steps):
        b = int(np.argmax(runs != n_steps))
        _fail(
            "step_ids",
            f"{runs[b]} actions in row {b} while step_mask has {n_steps[b]} real steps",
            "at least one agent token for every real step",
        )


def remap_ids(
    group_ids: np.ndarray, state_keys: np.ndarray | None, step_mask: np.ndarray
) -> tuple[np.ndarray, np.ndarray | None]:
    """Remaps raw group ids and state keys to dense int32 ids (host side).

    Args:
      group_ids: [B] any integer (or string) ids.
      state_keys: [B, S] raw state keys (int64 hashes or strings), or None.
      step_mask: [B, S] 0/1, real steps.

    Returns:
      group ids [B] int32 in [0, B) and state ids [B, S] int32 in [0, B*S) (0 on padded steps),
      equal iff (group id, state key) are equal.
    """
    _, dense_groups = np.unique(group_ids, return_inverse=True)
    dense_groups = dense_groups.reshape(-1).astype(np.int32)
    if state_keys is None:
        return dense_groups, None
    real = step_mask.astype(bool)
    _, key_ids = np.unique(state_keys[real], return_inverse=True)
    pair = np.broadcast_to(dense_groups[:, None], real.shape)[real].astype(np.int64)
    pair = pair * (int(key_ids.max(initial=0)) + 1) + key_ids.reshape(-1)
    _, pair_ids = np.unique(pair, return_inverse=True)
    state_ids = np.zeros(real.shape, np.int32)
    state_ids[real] = pair_ids.reshape(-1)
    return dense_groups, state_ids


def make_batch(
    *,
    loss_mask: Any,
    step_ids: Any,
    rewards: Any,
    step_mask: Any,
    group_ids: Any,
    state_keys: Any = None,
    bootstrap_values: Any = None,
) -> Batch:
    """Validates host arrays and builds a :class:`Batch` (dense ids, float32 / int32 arrays).

    Args:
      loss_mask: [B, T] 0/1, 1 on agent-generated tokens.
      step_ids: [B, T] integers, the step of each agent token, -1 elsewhere.
      rewards: [B, S] finite floats, the reward of each step.
      step_mask: [B, S] 0/1, a prefix of ones per row.
      group_ids: [B] rollout-group ids (any integers or strings).
      state_keys: optional [B, S] raw keys of the state each step acted from (int64 or str).
      bootstrap_values: optional [B] finite floats, V of the state after each row's last action
        for truncated rows, 0 for rows that ended in a terminal state.

    Returns:
      The batch, ready for any estimator.

    Raises:
      ValueError: naming the argument, the shape or value found and what was expected.
    """
    loss_mask = _as_2d("loss_mask", loss_mask, None, "[B, T]")
    _check_01("loss_mask", loss_mask)
    step_ids = _as_2d("step_ids", step_ids, loss_mask.shape, "[B, T] (the shape of loss_mask)")
    _check_integer("step_ids", step_ids)
    rewards = _as_2d("rewards", rewards, None, "[B, S]")
    if rewards.shape[0] != loss_mask.shape[0]:
        _fail(
            "rewards",
            f"of shape {rewards.shape}",
            f"[B, S] with B = {loss_mask.shape[0]} (the rows of loss_mask)",
        )
    _check_finite("rewards", rewards)
    step_mask = _as_2d("step_mask", step_mask, rewards.shape, "[B, S] (the shape of rewards)")
    _check_01("step_mask", step_mask)
    group_ids = np.asarray(group_ids)
    if group_ids.shape != (loss_mask.shape[0],):
        _fail("group_ids", f"of shape {group_ids.shape}", f"({loss_mask.shape[0]},), one per row")
    if state_keys is not None:
        state_keys = _as_2d(
            "state_keys", state_keys, rewards.shape, "[B, S] (the shape of rewards)"
        )
    if bootstrap_values is not None:
        bootstrap_values = np.asarray(bootstrap_values)
        if bootstrap_values.shape != (loss_mask.shape[0],):
            _fail(
                "bootstrap_values",
                f"of shape {bootstrap_values.shape}",
                f"({loss_mask.shape[0]},), one per row",
            )
        _check_finite("bootstrap_values", bootstrap_values)
    validate_steps(loss_mask, step_ids, step_mask)
    dense_groups, state_ids = remap_ids(group_ids, state_keys, step_mask)
    return Batch(
        loss_mask=jnp.asarray(loss_mask, jnp.float32),
        step_ids=jnp.asarray(step_ids, jnp.int32),
        rewards=jnp.asarray(rewards, jnp.float32),
        step_mask=jnp.asarray(step_mask, jnp.float32),
        group_ids=jnp.asarray(dense_groups),
        state_ids=None if state_ids is None else jnp.asarray(state_ids),
        bootstrap_values=(
            None if bootstrap_values is None else jnp.asarray(bootstrap_values, jnp.float32)
        ),
    )


def check_token_array(name: str, x: Any, batch: Batch) -> None:
    """Raises ValueError unless ``x`` is [B, T] like the batch (and finite, when concrete)."""
    expected = tuple(batch.loss_mask.shape)
    if tuple(jnp.shape(x)) != expected:
        raise ValueError(f"{name} has shape {tuple(jnp.shape(x))}; expected {expected} ([B, T])")
    if isinstance(x, jax.core.Tracer):
        return  # Inside someone else's jit: shapes are checked, values cannot be.
    arr = np.asarray(x)
    finite = np.isfinite(arr)
    if not finite.all():
        idx = tuple(int(i) for i in np.argwhere(~finite)[0])
        raise ValueError(f"{name} is {arr[idx]} at index {idx}; expected finite values")
