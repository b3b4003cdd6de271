"""Advantage estimators: gae, grpo, rloo, reinforce_pp, gigpo, gagpo.

Each has two layers:

- an array function (``token_gae``, ``grpo_advantages``, ...) of plain padded arrays, pure and
  jit-friendly, for users who want one kernel without the rest;
- a registered estimator ``fn(batch, config, *, values=None, kl=None) -> Advantages``: a pure
  ``impl(batch, config, values, kl)`` that calls the array functions, registered by name with
  what it needs by ``_builtin``; :func:`jit_estimator` jits it once (config static, so one
  compilation per shape bucket and config) behind the host-side checks of its inputs.

Shapes: B rows, T tokens, S steps (see ``batch.py``). Every estimator returns token advantages
[B, T] (0 off agent tokens); step-level ones also return their [B, S] step advantages, and gae
returns the critic's targets (returns = A + V).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from agentrl_jax.kernels.batch import Batch, check_token_array
from agentrl_jax.kernels.config import AdvantageConfig
from agentrl_jax.kernels.registry import register_advantage_estimator
from agentrl_jax.kernels.segments import (
    chunked_discount,
    group_deviation,
    group_normalize,
    last_token_of_step,
    masked_suffix_sums,
    reverse_discounted_sum,
    steps_to_tokens,
)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Advantages:
    """What an estimator returns.

    Attributes:
      tokens: [B, T] advantage of every agent token (0 elsewhere): what the policy loss reads.
      steps: [B, S] step advantages (step-level estimators), else None.
      returns: [B, T] value targets A + V (gae), else None.
    """

    tokens: jax.Array
    steps: jax.Array | None = None
    returns: jax.Array | None = None


# ----------------------------------------------------------------------------- array functions


def token_rewards(
    rewards: jax.Array,
    step_ids: jax.Array,
    loss_mask: jax.Array,
    kl: jax.Array | None = None,
    kl_coef: float = 0.0,
) -> jax.Array:
    """Places each step's reward on the last token of its action, minus an optional KL penalty.

    r_tok[b, t] = rewards[b, k] if t is the last token of step k's action, else 0;
    minus ``kl_coef * kl[b, t]`` on every agent token when ``kl`` is given.

    Args:
      rewards: [B, S]; step_ids, loss_mask: [B, T]; kl: optional [B, T] per-token KL estimate.
      kl_coef: beta of the penalty.

    Returns:
      [B, T] token rewards (0 off agent tokens).
    """
    last = last_token_of_step(step_ids, loss_mask)
    r = jnp.where(last, jnp.take_along_axis(rewards, jnp.maximum(step_ids, 0), axis=1), 0.0)
    if kl is not None and kl_coef:
        r = r - kl_coef * jnp.where(loss_mask > 0, jax.lax.stop_gradient(kl), 0.0)
    return r


@functools.partial(jax.jit, static_argnames=("gamma", "lam"))
def token_gae(
    rewards_bt: jax.Array,
    values_bt: jax.Array,
    mask_bt: jax.Array,
    *,
    gamma: float,
    lam: float,
    bootstrap_b: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Token-level GAE over agent tokens only (a masked reverse recursion).

    For agent tokens t (mask 1), with t' the next agent token of the row (environment and padding
    tokens in between are skipped, not treated as steps)::

        delta_t = r_t + gamma * V(h_{t'}) - V(h_t)
        A_t     = delta_t + gamma * lam * A_{t'}   ( = sum_l (gamma lam)^l delta_{t+l} )
        R_t     = A_t + V(h_t)

    Past the last agent token, V(h_{t'}) is ``bootstrap_b`` (0 when None): 0 for an episode that
    ended in a terminal state; for one cut by a step or length limit, the critic's value of the
    state in which the agent would have acted next, i.e. of the history that includes the last
    action and the observation it produced, read where the next action's first token would have
    been. That is the same definition V(h_{t'}) has inside the row (the first token of the next
    action), so a cut episode is credited exactly as if it had gone on and the critic's estimate
    stood in for the rest.

    Computed in closed form as one masked discounted suffix sum (see the comment in the body);
    discounts gamma * lam below ~0.6 run the recursion above as a sequential ``lax.scan``.

    Args:
      rewards_bt: [B, T] token rewards (see :func:`token_rewards`).
      values_bt: [B, T] critic values V(h_t).
      mask_bt: [B, T] 1 on agent tokens.
      gamma, lam: discount and GAE lambda.
      bootstrap_b: optional [B], V of the state after each row's last action (0: terminal).

    Returns:
      (advantages [B, T], returns [B, T]), 0 off agent tokens.
    """
    valid = mask_bt > 0
    if bootstrap_b is not None:
        # delta at the last agent token gains gamma * V(next state): the same recursion with the
        # bootstrap as V(h_{t'}), folded into that token's reward.
        later = jnp.cumsum(valid[:, ::-1], axis=1)[:, ::-1]  # agent tokens at or after t
        last = valid & (later == 1)
        rewards_bt = rewards_bt + jnp.where(last, gamma * bootstrap_b[:, None], 0.0)
    c = gamma * lam
    if not chunked_discount(c):
        adv = _sequential_gae(rewards_bt, values_bt, valid, gamma, lam)
    else:
        # Unrolling the recursion over agent tokens t = t_0 < t_1 < ... and telescoping V:
        #   A_t = sum_j c^j r_{t_j} - V_t + gamma (1 - lam) sum_{j>=1} c^(j-1) V_{t_j}
        #       = Y_t - (1 + beta) V_t,  Y_t = sum_j c^j (r + beta V)_{t_j},
        # with beta = gamma (1 - lam) / c: one masked discounted suffix sum, which runs as
        # chunked matmuls (see segments.masked_suffix_sums), not a 4096-step scan.
        beta = gamma * (1.0 - lam) / c
        y = masked_suffix_sums(rewards_bt + beta * values_bt, mask_bt, c)
        adv = y - (1.0 + beta) * values_bt
    adv = jnp.where(valid, adv, 0.0)
    return adv, jnp.where(valid, adv + values_bt, 0.0)


def _sequential_gae(rewards_bt, values_bt, valid, gamma, lam):
    """The recursion of :func:`token_gae` as a masked reverse ``lax.scan`` over T."""

    def step(carry, inputs):  # carry: (V, A) at the next agent token, each [B].
        next_v, next_a = carry
        r_t, v_t, m_t = inputs
        a_t = r_t + gamma * next_v - v_t + gamma * lam * next_a
        return (jnp.where(m_t, v_t, next_v), jnp.where(m_t, a_t, next_a)), a_t

    zeros = jnp.zeros(rewards_bt.shape[:1], rewards_bt.dtype)
    _, adv = jax.lax.scan(step, (zeros, zeros), (rewards_bt.T, values_bt.T, valid.T), reverse=True)
    return adv.T


def episode_returns(rewards: jax.Array, step_mask: jax.Array) -> jax.Array:
    """[B] undiscounted sum of the real steps' rewards."""
    return jnp.sum(jnp.where(step_mask > 0, rewards, 0.0), axis=1)


@functools.partial(jax.jit, static_argnames=("norm_by_std", "eps"))
def grpo_advantages(
    rewards: jax.Array,
    step_mask: jax.Array,
    group_ids: jax.Array,
    *,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> jax.Array:
    """GRPO: A_i = (R_i - mean_g R) / (std_g R + eps), R the episode return, g the row's group.

    Args:
      rewards, step_mask: [B, S]; group_ids: [B] dense in [0, B).
      norm_by_std: False gives R_i - mean_g R (no division).
      eps: added to the unbiased group std.

    Returns:
      [B] episode advantages (0 on padding rows and in groups of one).
    """
    real = step_mask[:, 0] > 0
    return group_normalize(
        episode_returns(rewards, step_mask),
        group_ids,
        real,
        rewards.shape[0],
        norm_by_std=norm_by_std,
        eps=eps,
    )


@jax.jit
def rloo_advantages(rewards: jax.Array, step_mask: jax.Array, group_ids: jax.Array) -> jax.Array:
    """RLOO: A_i = R_i - mean_{j in g, j != i} R_j (0 in groups of one).

    Args:
      rewards, step_mask: [B, S]; group_ids: [B] dense in [0, B).

    Returns:
      [B] episode advantages.
    """
    real = step_mask[:, 0] > 0
    returns = episode_returns(rewards, step_mask)
    _, shifted, count = group_deviation(returns, group_ids, real, rewards.shape[0])
    total = jax.ops.segment_sum(shifted, group_ids, rewards.shape[0])[group_ids]
    others = (total - shifted) / jnp.maximum(count - 1.0, 1.0)
    return jnp.where(real & (count > 1), shifted - others, 0.0)


@functools.partial(jax.jit, static_argnames=("gamma", "step_weight", "norm_by_std", "eps"))
def gigpo_step_advantages(
    rewards: jax.Array,
    step_mask: jax.Array,
    group_ids: jax.Array,
    state_ids: jax.Array,
    *,
    gamma: float,
    step_weight: float = 1.0,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> jax.Array:
    """GiGPO: episode-level group advantage + omega * step-level anchor-state advantage.

        A^E_i    = norm_g(R_i)                      (GRPO over the rollout group g)
        G_{i,t}  = sum_k gamma^k r_{i,t+k}          (discounted return of step t)
        A^S_{i,t} = norm_{(g, s_{i,t})}(G_{i,t})     (over all steps of group g whose state key is
                                                     s_{i,t}: the anchor-state group)
        A_{i,t}  = A^E_i + omega * A^S_{i,t}

    norm is (x - mean) / (std + eps), or x - mean when ``norm_by_std`` is False; a state seen once
    in its group has A^S = 0.

    Args:
      rewards, step_mask: [B, S]; group_ids: [B]; state_ids: [B, S] dense (group, key) ids.
      gamma: step discount; step_weight: omega; norm_by_std, eps: as in GRPO.

    Returns:
      [B, S] step advantages (0 on padded steps).
    """
    b, s = rewards.shape
    episode = grpo_advantages(rewards, step_mask, group_ids, norm_by_std=norm_by_std, eps=eps)
    # Sequential: equal reward suffixes give bitwise-equal returns, so tied anchors stay tied.
    returns = reverse_discounted_sum(rewards, step_mask, gamma, sequential=True)
    step = group_normalize(returns, state_ids, step_mask, b * s, norm_by_std=norm_by_std, eps=eps)
    return jnp.where(step_mask > 0, episode[:, None] + step_weight * step, 0.0)


@functools.partial(jax.jit, static_argnames=("gamma", "lam", "normalize", "norm_by_std", "eps"))
def gagpo_step_advantages(
    rewards: jax.Array,
    step_mask: jax.Array,
    group_ids: jax.Array,
    state_ids: jax.Array,
    *,
    gamma: float,
    lam: float,
    normalize: bool = True,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> jax.Array:
    """GAGPO: critic-free GAE over environment steps with a state-grouped value proxy.

        G_t     = r_t + gamma * G_{t+1}                 (G = 0 after the last step)
        V(s)    = mean of G over all steps of the rollout group whose state key is s;
                  V(terminal) = 0
        delta_t = r_t + gamma * V(s_{t+1}) - V(s_t)
        A_t     = delta_t + gamma * lam * A_{t+1}
        A       <- (A - mean_g A) / (std_g A + eps) over all real steps of rollout group g

    Computed as delta_t = D_t - gamma * D_{t+1} with D_t = G_t - V(s_t) (substitute
    r_t = G_t - gamma * G_{t+1}): the same number, but a state seen once has D = 0 exactly, so
    its delta is exactly 0 in float32 too.

    Args:
      rewards, step_mask: [B, S]; group_ids: [B]; state_ids: [B, S] dense (group, key) ids.
      gamma, lam: step discount and GAE lambda.
      normalize: normalise A within each rollout group (False returns the raw A).
      norm_by_std, eps: as in GRPO.

    Returns:
      [B, S] step advantages (0 on padded steps).
    """
    b, s = rewards.shape
    # Sequential: equal reward suffixes give bitwise-equal returns (exact ties, exact zeros).
    returns = reverse_discounted_sum(rewards, step_mask, gamma, sequential=True)
    dev, _, _ = group_deviation(returns, state_ids, step_mask, b * s)  # D_t, 0 on padding.
    next_dev = jnp.concatenate([dev[:, 1:], jnp.zeros_like(dev[:, :1])], axis=1)
    delta = dev - gamma * next_dev
    adv = reverse_discounted_sum(delta, step_mask, gamma * lam, sequential=True)
    if normalize:
        # Row ids: each row is reduced densely first, so the scatter has B updates, not B * S.
        adv = group_normalize(adv, group_ids, step_mask, b, norm_by_std=norm_by_std, eps=eps)
    return jnp.where(step_mask > 0, adv, 0.0)


# ------------------------------------------------------------------- registered estimators


def _check_inputs(
    name: str, batch: Batch, config: AdvantageConfig, values, kl, needs_states: bool = False
):
    if not isinstance(batch, Batch):
        raise ValueError(f"{name}: batch is a {type(batch).__name__}; expected a kernels.Batch")
    if not isinstance(config, AdvantageConfig):
        raise ValueError(
            f"{name}: config is a {type(config).__name__}; expected a kernels.AdvantageConfig"
        )
    if values is not None:
        check_token_array(f"{name}: values", values, batch)
    if kl is not None:
        check_token_array(f"{name}: kl", kl, batch)
    if needs_states and batch.state_ids is None:
        raise ValueError(
            f"{name}: batch.state_ids is None; expected state keys (make_batch(state_keys=...))"
        )


def jit_estimator(
    name: str,
    impl: Callable[..., Advantages],
    *,
    needs_values: bool = False,
    needs_states: bool = False,
    kl_reward: bool = False,
) -> Callable[..., Advantages]:
    """The estimator ``fn(batch, config, *, values=None, kl=None)`` around a pure ``impl``.

    ``impl(batch, config, values, kl) -> Advantages`` is jitted once, here, with ``config``
    static: one compilation per shape bucket and config (equal configs share it). ``fn`` checks
    its inputs on the host first (types, [B, T] shapes, what the estimator declares it needs) and
    hands ``impl`` only what it reads: ``values`` (as float32) when it ``needs_values``, ``kl``
    when it takes a ``kl_reward``, None otherwise, so an unused argument never retraces it. An
    estimator without a KL reward refuses ``kl`` with ``config.kl_coef != 0`` rather than silently
    ignoring the penalty.

    Args:
      name: used in error messages.
      impl: the pure function (traced, never called eagerly); ``fn.impl`` keeps it and
        ``fn.jitted`` its jitted form.
      needs_values: ``values`` must be given.
      needs_states: ``batch.state_ids`` must be set (state-keyed estimators).
      kl_reward: ``impl`` subtracts ``config.kl_coef * kl`` from its token rewards.
    """
    jitted = jax.jit(impl, static_argnames=("config",))

    @functools.wraps(impl)
    def fn(batch: Batch, config: AdvantageConfig, *, values=None, kl=None) -> Advantages:
        if needs_values and values is None:
            raise ValueError(f"{name}: values is None; expected the critic's values, shape [B, T]")
        _check_inputs(name, batch, config, values, kl, needs_states)
        if not kl_reward and kl is not None and config.kl_coef:
            raise ValueError(
                f"{name}: kl_coef is {config.kl_coef} with kl given; expected kl_coef 0: {name} "
                "has no token rewards to penalise, use the KL loss term (kernels.kl_loss) instead"
            )
        values = jnp.asarray(values, jnp.float32) if needs_values else None
        return jitted(batch, config, values, kl if kl_reward else None)

    fn.impl = impl
    fn.jitted = jitted  # its compilation cache is what a test of "compiled once" reads
    return fn


def _builtin(
    name: str,
    *,
    needs_values: bool = False,
    needs_groups: bool = False,
    needs_states: bool = False,
    ratio_level: str = "token",
    kl_reward: bool = False,
):
    """Registers the decorated impl as estimator ``name``: :func:`jit_estimator` around it, its
    needs declared to the registry (``register_advantage_estimator``)."""

    def register(impl):
        fn = jit_estimator(
            name, impl, needs_values=needs_values, needs_states=needs_states, kl_reward=kl_reward
        )
        return register_advantage_estimator(
            name,
            fn,
            needs_values=needs_values,
            needs_groups=needs_groups,
            ratio_level=ratio_level,
            kl_reward=kl_reward,
        )

    return register


@_builtin("gae", needs_values=True, kl_reward=True)
def gae(batch: Batch, config: AdvantageConfig, values, kl) -> Advantages:
    """Token-level GAE with a critic (PPO); see :func:`token_gae`. Needs ``values`` [B, T].

    Truncated rows bootstrap from ``batch.bootstrap_values`` (None: every row is terminal).
    """
    r = token_rewards(batch.rewards, batch.step_ids, batch.loss_mask, kl, config.kl_coef)
    adv, ret = token_gae(
        r,
        values,
        batch.loss_mask,
        gamma=config.gamma,
        lam=config.lam,
        bootstrap_b=batch.bootstrap_values,
    )
    return Advantages(tokens=adv, returns=ret)


@_builtin("reinforce_pp", kl_reward=True)
def reinforce_pp(batch: Batch, config: AdvantageConfig, values, kl) -> Advantages:
    """REINFORCE++: token returns (with an optional KL reward penalty) whitened over the batch.

    r_t = reward of the step on its action's last token - kl_coef * kl_t
    G_t = r_t + gamma * G_{t'}            (t' the next agent token; env tokens skipped)
    A_t = (G_t - mean G) / (std G + eps)  (over every agent token of the batch)
    """
    r = token_rewards(batch.rewards, batch.step_ids, batch.loss_mask, kl, config.kl_coef)
    returns = reverse_discounted_sum(r, batch.loss_mask, config.gamma)
    zeros = jnp.zeros_like(batch.step_ids)
    adv = group_normalize(
        returns, zeros, batch.loss_mask, 1, norm_by_std=config.norm_by_std, eps=config.eps
    )
    return Advantages(tokens=adv)


def _per_row(a: jax.Array, batch: Batch) -> Advantages:
    # One advantage per row: every agent token gets it, no [B, T] gather needed.
    return Advantages(tokens=a[:, None] * batch.loss_mask, steps=a[:, None] * batch.step_mask)


@_builtin("grpo", needs_groups=True)
def grpo(batch: Batch, config: AdvantageConfig, values, kl) -> Advantages:
    """GRPO; see :func:`grpo_advantages`. Every token of a trajectory shares its advantage."""
    a = grpo_advantages(
        batch.rewards,
        batch.step_mask,
        batch.group_ids,
        norm_by_std=config.norm_by_std,
        eps=config.eps,
    )
    return _per_row(a, batch)


@_builtin("rloo", needs_groups=True)
def rloo(batch: Batch, config: AdvantageConfig, values, kl) -> Advantages:
    """RLOO; see :func:`rloo_advantages`."""
    return _per_row(rloo_advantages(batch.rewards, batch.step_mask, batch.group_ids), batch)


@_builtin("gigpo", needs_groups=True, needs_states=True)
def gigpo(batch: Batch, config: AdvantageConfig, values, kl) -> Advantages:
    """GiGPO; see :func:`gigpo_step_advantages`. Needs state keys in the batch."""
    steps = gigpo_step_advantages(
        batch.rewards,
        batch.step_mask,
        batch.group_ids,
        batch.state_ids,
        gamma=config.gamma,
        step_weight=config.step_weight,
        norm_by_std=config.norm_by_std,
        eps=config.eps,
    )
    return Advantages(tokens=steps_to_tokens(steps, batch.step_ids, batch.loss_mask), steps=steps)


@_builtin("gagpo", needs_groups=True, needs_states=True, ratio_level="action")
def gagpo(batch: Batch, config: AdvantageConfig, values, kl) -> Advantages:
    """GAGPO; see :func:`gagpo_step_advantages`. Needs state keys in the batch."""
    steps = gagpo_step_advantages(
        batch.rewards,
        batch.step_mask,
        batch.group_ids,
        batch.state_ids,
        gamma=config.gamma,
        lam=config.lam,
        norm_by_std=config.norm_by_std,
        eps=config.eps,
    )
    return Advantages(tokens=steps_to_tokens(steps, batch.step_ids, batch.loss_mask), steps=steps)
