"""The learner's sections: ``config.sft``, ``config.budget``, ``config.rl`` and ``config.envrl``,
each field checked beside it (``run/config_checks.py``). ``config.rl``'s defaults that the
learner's math reads are the RL spec's own (``rl/spec.py``), only named here."""

from __future__ import annotations

import dataclasses

from agentrl_jax import kernels
from agentrl_jax.rl import spec as spec_lib
from agentrl_jax.rl.spec import RLSpec
from agentrl_jax.run import budget as budget_lib
from agentrl_jax.run import config_checks as checks
from agentrl_jax.run.config_checks import ConfigError

KL_MODES = spec_lib.KL_MODES
# Which train games RL draws from: all of them, or those no SFT demonstration used.
TASK_POOLS = ("all", "unseen")
# Where the RL section's defaults are declared (RLSection's docstring).
_SPEC = RLSpec()
_ADVANTAGE, _LOSS, _WEIGHTS, _KL = _SPEC.advantage, _SPEC.loss, _SPEC.weights, _SPEC.kl


@dataclasses.dataclass(frozen=True)
class SFTSection:
    """SFT: Adam with linear warmup, then cosine decay to ``learning_rate * end_lr_fraction``.

    ``group_by_length``: windows of that many batches are sorted by length before batching
    (less padding; see ``sft_data.SftDataConfig``); 0 batches in shuffled order.
    ``microbatch_size``: rows per microbatch of a batch (gradient accumulation inside the jitted
    step: memory is set by the microbatch, the update is the whole batch's); it must divide
    ``batch_size``; 0 (or None): the whole batch at once.
    """

    epochs: int = 3
    batch_size: int = 16
    microbatch_size: int | None = 0
    learning_rate: float = 2e-3
    warmup_steps: int = 10
    end_lr_fraction: float = 0.1
    group_by_length: int = 8

    def __post_init__(self):
        checks.integer("config.sft.epochs", self.epochs, 1)
        checks.integer("config.sft.batch_size", self.batch_size, 1)
        checks.microbatch("sft", self.microbatch_size, "batch_size", self.batch_size)
        checks.positive("config.sft.learning_rate", self.learning_rate)
        checks.integer("config.sft.warmup_steps", self.warmup_steps, 0)
        checks.fraction("config.sft.end_lr_fraction", self.end_lr_fraction)
        checks.integer("config.sft.group_by_length", self.group_by_length, 0)


@dataclasses.dataclass(frozen=True)
class BudgetSection:
    """Practitioner's-guide units: one SFT demonstration costs 10, one RL episode 1."""

    total: int = 4000
    sft_fraction: float = 0.5

    def __post_init__(self):
        try:
            budget_lib.from_config(self)
        except ValueError as e:
            raise ConfigError(str(e)) from e


@dataclasses.dataclass(frozen=True)
class RLSection:
    """``config.rl``. Each default that the learner's math reads is declared once, where the
    setting is defined (``rl/spec.py``: the RL spec, its KL part and loss weights;
    ``kernels/config.py``: the estimators' and losses' configs) and only named here;
    ``base_config()`` lists the values."""

    algo: str = _SPEC.algo  # a registered advantage estimator (kernels.advantage_estimators())
    loss: str = _SPEC.policy_loss  # a registered policy loss (kernels.policy_losses())
    tasks_per_iteration: int = 8
    epochs: int = _SPEC.epochs
    minibatch_size: int = _SPEC.minibatch_size
    # Rows per microbatch of a minibatch (gradient accumulation inside the jitted step: memory is
    # set by the microbatch, the update is the minibatch's); a divisor of minibatch_size, or 0
    # (or None) for the whole minibatch at once.
    microbatch_size: int | None = _SPEC.microbatch_size
    actor_lr: float = _SPEC.actor_lr
    critic_lr: float = _SPEC.critic_lr
    max_grad_norm: float = _SPEC.max_grad_norm
    gamma: float = _ADVANTAGE.gamma
    lam: float = _ADVANTAGE.lam
    norm_by_std: bool = _ADVANTAGE.norm_by_std
    step_weight: float = _ADVANTAGE.step_weight
    kl_coef: float = _KL.coef
    # "loss": a KL term in the loss; "reward": a per-token reward penalty (an estimator that
    # takes it: registered with kl_reward=True).
    kl_mode: str = _KL.mode
    entropy_coef: float = _WEIGHTS.entropy
    value_coef: float = _WEIGHTS.value
    clip_low: float = _LOSS.clip_low
    clip_high: float = _LOSS.clip_high
    dual_clip: float | None = _LOSS.dual_clip
    ratio_level: str = "auto"  # "auto": the estimator's own (its ``ratio_level``)
    aggregation: str = _LOSS.aggregation  # "episode_mean": every episode weighs alike
    value_clip: float | None = _LOSS.value_clip  # None: unclipped value loss
    kl_estimator: str = _KL.estimator  # KL to the reference: "k1", "k2" or "k3" (either mode)
    # The frozen KL reference's parameters: "float32" (a copy of the policy as RL starts) or
    # "bfloat16" (half the memory a chip holds beside every program of the RL phase).
    reference_dtype: str = _KL.reference_dtype
    kl_clamp: float | None = _KL.clamp  # clamp of the per-token KL estimate
    temperature: float = _SPEC.temperature  # > 0: rollouts sample (the learner divides by it)
    # RL rollouts sample the whole softmax: the learner's log-probs model no truncation, so only
    # 1.0 and 0 are accepted (kept as fields so a config naming them keeps working).
    top_p: float = 1.0
    top_k: int = 0
    task_pool: str = "all"  # or "unseen": only train games no SFT demonstration used
    # Added to the reward of every step whose action the env refused (``invalid_action`` in its
    # step info: a command the game did not take, a malformed tool call): <= 0, 0 for none. A
    # validity signal for free decoding, where a group of episodes that all lose otherwise
    # gives every episode advantage 0. Success and ``rollout/return`` stay the env's own.
    invalid_action_reward: float = _SPEC.invalid_action_reward
    # Importance weights on each token's loss for the sampler's log-probs differing from the
    # trained policy's (kernels/off_policy.py): "none", "tis" (truncated at is_cap) or "mis"
    # (tokens whose ratio leaves [1 / is_cap, is_cap] masked).
    off_policy_correction: str = _SPEC.off_policy_correction
    is_cap: float = _SPEC.is_cap
    # The iteration's schedule. S = 0: on-policy, each iteration plays its rollout, then trains
    # on it. S > 0: asynchronous: while the learner trains on iteration i's rollout, iteration
    # i + S's is played in the background by the policy as iteration i began; so every rollout
    # is trained on by a policy S updates newer than the one that played it (the first S
    # iterations' rollouts are played at the start, by the starting policy). Correct for the
    # lag with off_policy_correction.
    max_staleness: int = 0

    def __post_init__(self):
        checks.choice("config.rl.algo", self.algo, kernels.advantage_estimators())
        checks.choice(
            "config.rl.off_policy_correction", self.off_policy_correction, kernels.CORRECTIONS
        )
        checks.number("config.rl.is_cap", self.is_cap, lambda v: v > 1, "> 1")
        checks.choice("config.rl.loss", self.loss, kernels.policy_losses())
        checks.choice("config.rl.kl_mode", self.kl_mode, KL_MODES)
        checks.choice("config.rl.task_pool", self.task_pool, TASK_POOLS)
        checks.choice("config.rl.reference_dtype", self.reference_dtype, spec_lib.REFERENCE_DTYPES)
        for name in ("actor_lr", "critic_lr", "max_grad_norm"):
            checks.positive(f"config.rl.{name}", getattr(self, name))
        for name in ("tasks_per_iteration", "epochs", "minibatch_size"):
            checks.integer(f"config.rl.{name}", getattr(self, name), 1)
        checks.integer("config.rl.max_staleness", self.max_staleness, 0)
        checks.number(
            "config.rl.invalid_action_reward",
            self.invalid_action_reward,
            lambda v: v <= 0,
            "<= 0 (a penalty on the steps whose action the env refused; 0 for none)",
        )
        checks.microbatch("rl", self.microbatch_size, "minibatch_size", self.minibatch_size)
        for name in ("kl_coef", "entropy_coef", "value_coef"):
            checks.non_negative(f"config.rl.{name}", getattr(self, name))
        checks.number(
            "config.rl.temperature",
            self.temperature,
            lambda v: v > 0,
            "> 0: RL samples its rollouts and the learner divides the logits by the temperature "
            "(greedy decoding is for evaluation)",
        )
        checks.number("config.rl.top_p", self.top_p, lambda v: 0.0 < v <= 1.0, "in (0, 1]")
        checks.integer("config.rl.top_k", self.top_k, 0)
        _untruncated("top_p", self.top_p, 1.0)
        _untruncated("top_k", self.top_k, 0)
        spec = kernels.get_advantage_spec(self.algo)
        if self.ratio_level not in ("auto", *kernels.RATIO_LEVELS):
            raise ConfigError(
                f"config.rl.ratio_level={self.ratio_level!r}: expected 'auto' (the estimator's "
                f"own: {spec.ratio_level!r} for {self.algo!r}) or one of {kernels.RATIO_LEVELS}"
            )
        if self.kl_mode == "reward" and not spec.kl_reward:
            raise ConfigError(
                f"config.rl.kl_mode='reward' needs an estimator that takes a per-token KL "
                f"reward penalty; config.rl.algo={self.algo!r} does not (use kl_mode='loss', "
                "or an estimator registered with kl_reward=True: "
                f"{[n for n in kernels.advantage_estimators() if _takes_kl(n)]})"
            )
        try:  # the kernels' own checks, on the configs the spec will hold
            spec_lib.advantage_config(self)
            spec_lib.loss_config(self)
        except ValueError as e:
            raise ConfigError(f"config.rl: {e}") from e


def _untruncated(name: str, value: float, whole: float) -> None:
    """Refuses a top-p / top-k truncation of RL rollouts, which the learner does not model.

    The sampler records the log-probs of the truncated distribution, the learner computes those
    of the full ``softmax(logits / T)``: their PPO ratio would not be against the behaviour
    policy (and tokens outside the truncation could never be sampled but still be trained on).
    """
    if value != whole:
        kind = name.replace("_", "-")
        raise ConfigError(
            f"config.rl.{name} is {value!r}; expected {whole!r}: the learner's log-probs do not "
            f"model {kind} truncation, so the PPO ratio would not be against the behaviour policy "
            "(RL rollouts sample the whole softmax of logits / config.rl.temperature; evaluation "
            "decodes greedily)"
        )


def _takes_kl(name: str) -> bool:
    return kernels.get_advantage_spec(name).kl_reward


@dataclasses.dataclass(frozen=True)
class EnvrlSection:
    enabled: bool = False
    sp_weight: float = 0.1
    id_weight: float = 0.1
    horizon: int = 0  # RL updates of the weights' cosine decay; 0: the whole RL phase

    def __post_init__(self):
        checks.non_negative("config.envrl.sp_weight", self.sp_weight)
        checks.non_negative("config.envrl.id_weight", self.id_weight)
        checks.integer("config.envrl.horizon", self.horizon, 0)
