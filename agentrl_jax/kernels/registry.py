"""Name -> function registries the trainer selects from config (``rl.advantage``, ``rl.loss``).

Users add their own without editing the library::

    @register_advantage_estimator("my_algo")
    def my_algo(batch, config, *, values=None, kl=None):
        ...
        return Advantages(tokens=...)

Uniform signatures (documented in ``agentrl_jax/kernels/__init__.py``):

- advantage estimator: ``fn(batch: Batch, config: AdvantageConfig, *, values=None, kl=None)
  -> Advantages``
- policy loss: ``fn(logprobs, old_logprobs, advantages, loss_mask, *, step_ids, config:
  LossConfig) -> (Weighted, dict[str, Weighted])``
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from agentrl_jax.kernels.config import RATIO_LEVELS


@dataclasses.dataclass(frozen=True)
class EstimatorSpec:
    """A registered advantage estimator and what the trainer must feed it.

    Attributes:
      needs_values: the trainer must run the critic and pass ``values=``.
      needs_groups: the estimator compares rollouts of one task (``group_size >= 2``).
      ratio_level: the PPO ratio the estimator is defined with ("token": one per token;
        "action": one per action, from the mean token log-ratio); the run's loss uses it unless
        ``config.rl.ratio_level`` names one on purpose.
      kl_reward: the estimator takes ``kl=`` as a per-token reward penalty (``kl_coef * kl``
        subtracted from the token rewards), so a run may set ``config.rl.kl_mode="reward"``.

    The run's config is checked against these when it is validated (run/config.py), the
    same for a user's estimator as for the built-in ones.
    """

    name: str
    fn: Callable[..., Any]
    needs_values: bool
    needs_groups: bool = False
    ratio_level: str = "token"
    kl_reward: bool = False


_ESTIMATORS: dict[str, EstimatorSpec] = {}
_POLICY_LOSSES: dict[str, Callable[..., Any]] = {}


def _check_name(kind: str, name: Any, table: dict, overwrite: bool) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"{kind} name is {name!r}; expected a non-empty string")
    if name in table and not overwrite:
        raise ValueError(
            f"{kind} {name!r} is already registered; pass overwrite=True to replace it"
        )


def register_advantage_estimator(
    name: str,
    fn: Callable | None = None,
    *,
    needs_values: bool = False,
    needs_groups: bool = False,
    ratio_level: str = "token",
    kl_reward: bool = False,
    overwrite: bool = False,
):
    """Registers ``fn`` under ``name``; usable as ``@register_advantage_estimator("name")``.

    Args:
      name: the config name.
      fn: ``fn(batch, config, *, values=None, kl=None) -> Advantages``.
      needs_values: the trainer must run the critic and pass ``values=`` [B, T].
      needs_groups: the estimator compares the rollouts of a task: a run needs
        ``rollout.group_size >= 2`` (checked when the config is validated).
      ratio_level: "token" or "action", the PPO ratio the estimator is defined with.
      kl_reward: ``fn`` subtracts ``config.kl_coef * kl`` from its token rewards when given
        ``kl=``: a run may use ``config.rl.kl_mode="reward"`` with it (otherwise a config error).
      overwrite: replace an existing registration instead of raising.
    """
    _check_name("advantage estimator", name, _ESTIMATORS, overwrite)
    if ratio_level not in RATIO_LEVELS:
        raise ValueError(
            f"advantage estimator {name!r}: ratio_level is {ratio_level!r}; expected one of "
            f"{RATIO_LEVELS}"
        )

    def add(f: Callable) -> Callable:
        _ESTIMATORS[name] = EstimatorSpec(
            name=name,
            fn=f,
            needs_values=needs_values,
            needs_groups=needs_groups,
            ratio_level=ratio_level,
            kl_reward=kl_reward,
        )
        return f

    return add if fn is None else add(fn)


def get_advantage_spec(name: str) -> EstimatorSpec:
    """The registered estimator and its requirements; ValueError listing valid names."""
    if name not in _ESTIMATORS:
        raise ValueError(
            f"unknown advantage estimator {name!r}; valid names: {', '.join(sorted(_ESTIMATORS))}"
        )
    return _ESTIMATORS[name]


def get_advantage_estimator(name: str) -> Callable[..., Any]:
    """The estimator function registered under ``name``; ValueError listing valid names."""
    return get_advantage_spec(name).fn


def advantage_estimators() -> tuple[str, ...]:
    """Registered estimator names, sorted."""
    return tuple(sorted(_ESTIMATORS))


def register_policy_loss(name: str, fn: Callable | None = None, *, overwrite: bool = False):
    """Registers a policy loss under ``name``; usable as ``@register_policy_loss("name")``."""
    _check_name("policy loss", name, _POLICY_LOSSES, overwrite)

    def add(f: Callable) -> Callable:
        _POLICY_LOSSES[name] = f
        return f

    return add if fn is None else add(fn)


def get_policy_loss(name: str) -> Callable[..., Any]:
    """The policy loss registered under ``name``; ValueError listing valid names."""
    if name not in _POLICY_LOSSES:
        raise ValueError(
            f"unknown policy loss {name!r}; valid names: {', '.join(sorted(_POLICY_LOSSES))}"
        )
    return _POLICY_LOSSES[name]


def policy_losses() -> tuple[str, ...]:
    """Registered policy loss names, sorted."""
    return tuple(sorted(_POLICY_LOSSES))


def unregister(name: str) -> None:
    """Removes ``name`` from both registries (tests use it to clean up)."""
    _ESTIMATORS.pop(name, None)
    _POLICY_LOSSES.pop(name, None)
