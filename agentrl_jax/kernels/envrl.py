"""ENVRL auxiliary losses: state prediction and inverse dynamics on the policy's own LM head.

From each step t of a trajectory, a :class:`Transition` of token ids: s_t (what the agent saw
when it acted: a ``goal`` part always kept, then its ``context``, oldest first), the action a_t
and the environment's next observation s_{t+1} alone (never a next prompt, whose history would
hold a_t). Two kinds of examples are built on the host, one per transition:

    state prediction (SP):  [s_t, a_t, sp_instruction, s_{t+1}]  target s_{t+1}
                            L_SP = -log p(s_{t+1} | s_t, a_t)
    inverse dynamics (ID):  [s_t, s_{t+1}, id_instruction, a_t]  target a_t
                            L_ID = -log p(a_t | s_t, s_{t+1})

The instruction says which task the example is (e.g. "Predict the next observation."). An
example longer than the row budget drops the oldest context tokens first (the history between
the goal and the newest observation), then tokens of s_{t+1} (its end where it is the target,
its front where it is context), then of a_t; the goal, the instruction and at least one target
token stay.

Both are scored by the same model that acts (next-token log-probabilities), with the per-token
losses aggregated like the RL loss (numerator / denominator). The weights decay on a cosine from
their initial value to 0 over ``horizon`` updates, and the trainer minimises

    L = L_RL + lambda_SP(k) * L_SP + lambda_ID(k) * L_ID,
    lambda(k) = lambda_0 * (1 + cos(pi * min(k, horizon) / horizon)) / 2.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from agentrl_jax.kernels.weighted import Weighted, aggregate


@dataclasses.dataclass(frozen=True)
class EnvrlConfig:
    """Initial weights of the two auxiliary losses and the decay horizon (in updates)."""

    sp_weight: float = 0.1
    id_weight: float = 0.1
    horizon: int = 1000

    def __post_init__(self):
        for name in ("sp_weight", "id_weight"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"EnvrlConfig.{name} is {getattr(self, name)!r}; expected >= 0")
        if not (isinstance(self.horizon, int) and self.horizon > 0):
            raise ValueError(f"EnvrlConfig.horizon is {self.horizon!r}; expected an int > 0")


@dataclasses.dataclass(frozen=True)
class Transition:
    """One environment step as token ids: (s_t, a_t, s_{t+1}).

    Attributes:
      goal: the start of s_t that an example always keeps (the task's header and goal).
      context: the rest of s_t, oldest first (earlier turns, then the newest observation); an
        example that does not fit drops its oldest tokens first.
      action: a_t.
      next_obs: s_{t+1}, the environment's next observation alone.
    """

    goal: Sequence[int]
    context: Sequence[int]
    action: Sequence[int]
    next_obs: Sequence[int]


@dataclasses.dataclass(frozen=True)
class AuxExamples:
    """Padded auxiliary examples (host numpy arrays).

    Attributes:
      input_ids: [N, L] int32 token ids, right-padded with ``pad_id``.
      target_mask: [N, L] float32, 1 where the token is a target (predicted from the tokens
        before it).
      attention_mask: [N, L] float32, 1 on real tokens.
      rows: [N] int32, the trajectory each example came from.
      steps: [N] int32, its step t.
    """

    input_ids: np.ndarray
    target_mask: np.ndarray
    attention_mask: np.ndarray
    rows: np.ndarray
    steps: np.ndarray


def _fit(goal, context, middle, instruction, target, max_len, *, target_first):
    """Cuts [goal, context, middle, instruction] + target to max_len: the context's oldest
    tokens, then the next observation (the target's end in SP, ``target_first``; the middle's
    front in ID), then the action (the middle's front in SP; the target's end in ID), keeping
    at least one target token. The goal and the instruction stay."""
    over = len(goal) + len(context) + len(middle) + len(instruction) + len(target) - max_len
    cut = min(max(over, 0), len(context))
    context, over = context[cut:], over - cut
    for part in ("target", "middle") if target_first else ("middle", "target"):
        if part == "target":
            cut = min(max(over, 0), len(target) - 1)
            target = target[: len(target) - cut]
        else:
            cut = min(max(over, 0), len(middle))
            middle = middle[cut:]
        over -= cut
    return goal + context + middle + instruction, target


def _transitions(row: int, trajectory) -> list[Transition]:
    """A trajectory's transitions; (states, actions) is shorthand for goal-less transitions
    (context s_t = states[t], next_obs = states[t + 1]; a step without a next state is skipped)."""
    if isinstance(trajectory, tuple) and len(trajectory) == 2:
        states, actions = trajectory
        if len(states) not in (len(actions), len(actions) + 1):
            raise ValueError(
                f"trajectory {row}: {len(states)} states for {len(actions)} actions; expected "
                "one state per action plus optionally the final state"
            )
        return [
            Transition((), states[t], actions[t], states[t + 1])
            for t in range(min(len(actions), len(states) - 1))
        ]
    return list(trajectory)


def _build(trajectories, kind: str, max_len: int, instruction_ids, pad_id: int) -> AuxExamples:
    instruction = list(instruction_ids)
    seqs, masks, rows, steps = [], [], [], []
    for row, trajectory in enumerate(trajectories):
        for t, tr in enumerate(_transitions(row, trajectory)):
            goal = list(tr.goal)
            if len(goal) + len(instruction) + 1 > max_len:
                raise ValueError(
                    f"trajectory {row} step {t}: max_len is {max_len}; expected more than the "
                    f"goal's {len(goal)} tokens plus the instruction's {len(instruction)}"
                )
            if kind == "sp":
                middle, target = list(tr.action), list(tr.next_obs)
            else:
                middle, target = list(tr.next_obs), list(tr.action)
            if not target:
                continue  # Nothing to predict (an empty next observation).
            context, target = _fit(
                goal, list(tr.context), middle, instruction, target, max_len,
                target_first=kind == "sp",
            )  # fmt: skip
            seqs.append(context + target)
            masks.append([0] * len(context) + [1] * len(target))
            rows.append(row)
            steps.append(t)
    n = len(seqs)
    input_ids = np.full((n, max_len), pad_id, np.int32)
    target_mask = np.zeros((n, max_len), np.float32)
    attention = np.zeros((n, max_len), np.float32)
    for i, (seq, mask) in enumerate(zip(seqs, masks)):
        input_ids[i, : len(seq)] = seq
        target_mask[i, : len(seq)] = mask
        attention[i, : len(seq)] = 1.0
    return AuxExamples(
        input_ids, target_mask, attention, np.asarray(rows, np.int32), np.asarray(steps, np.int32)
    )


def build_state_prediction(
    trajectories: Sequence,
    *,
    max_len: int,
    instruction_ids: Sequence[int] = (),
    pad_id: int = 0,
) -> AuxExamples:
    """SP examples [s_t, a_t, instruction, s_{t+1}] with targets on s_{t+1}.

    Args:
      trajectories: per trajectory, a list of :class:`Transition`, or (states, actions): lists
        of token-id lists, states with one entry per action plus the final state when known
        (s_t and s_{t+1} are then states[t] and states[t + 1], with no goal).
      max_len: L, the padded length; a longer example is cut as the module docstring says.
      instruction_ids: token ids placed right before the target, saying what to predict (e.g. a
        tokenised "Predict the next observation.").
      pad_id: the padding token.

    Returns:
      The padded examples, one per transition (steps t count within each trajectory).

    Raises:
      ValueError: a goal and instruction that leave no room for a target in max_len.
    """
    return _build(trajectories, "sp", max_len, instruction_ids, pad_id)


def build_inverse_dynamics(
    trajectories: Sequence,
    *,
    max_len: int,
    instruction_ids: Sequence[int] = (),
    pad_id: int = 0,
) -> AuxExamples:
    """ID examples [s_t, s_{t+1}, instruction, a_t] with targets on a_t (args as SP)."""
    return _build(trajectories, "id", max_len, instruction_ids, pad_id)


def target_logprobs(logits: jax.Array, input_ids: jax.Array) -> jax.Array:
    """log p(input_ids[:, i] | input_ids[:, :i]) at position i (0 at i = 0).

    Args:
      logits: [N, L, V] the model's outputs on input_ids (position i predicts token i + 1).
      input_ids: [N, L] int32.

    Returns:
      [N, L] float32 log-probabilities aligned with the tokens they score.
    """
    logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(logp, input_ids[:, 1:, None], axis=-1)[..., 0]
    return jnp.concatenate([jnp.zeros_like(picked[:, :1]), picked], axis=1)


def aux_loss(
    token_logprobs: jax.Array, target_mask: jax.Array, aggregation: str = "token_mean"
) -> Weighted:
    """Negative log-likelihood of the target tokens (L_SP or L_ID).

    Args:
      token_logprobs: [N, L] from :func:`target_logprobs`.
      target_mask: [N, L] from the builders.
      aggregation: as in :func:`weighted.aggregate` ("seq_mean_token_sum" gives the mean of
        -log p(target sequence)).

    Returns:
      The loss as numerator / denominator.
    """
    return aggregate(-token_logprobs, target_mask, aggregation)


def cosine_weight(step: jax.Array | int, initial: float, horizon: int) -> jax.Array:
    """lambda(k) = initial * (1 + cos(pi * min(k, horizon) / horizon)) / 2."""
    frac = jnp.minimum(jnp.asarray(step, jnp.float32), horizon) / horizon
    return initial * 0.5 * (1.0 + jnp.cos(math.pi * frac))


def envrl_total_loss(
    rl_loss: jax.Array,
    sp_loss: jax.Array,
    id_loss: jax.Array,
    step: jax.Array | int,
    config: EnvrlConfig,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """L_RL + lambda_SP(k) L_SP + lambda_ID(k) L_ID, and the weights used (for logging).

    Args:
      rl_loss, sp_loss, id_loss: scalar losses (``Weighted.value``).
      step: the update index k.
      config: initial weights and horizon.

    Returns:
      (total, {"envrl/sp_weight": ..., "envrl/id_weight": ...}).
    """
    w_sp = cosine_weight(step, config.sp_weight, config.horizon)
    w_id = cosine_weight(step, config.id_weight, config.horizon)
    total = rl_loss + w_sp * sp_loss + w_id * id_loss
    return total, {"envrl/sp_weight": w_sp, "envrl/id_weight": w_id}
