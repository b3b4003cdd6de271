"""The run configuration: ml_collections ConfigDicts from configs/*.py, frozen and validated here.

``configs/<name>.py`` defines ``get_config(arg)`` returning a ConfigDict; absl flags choose and
override it (``--config=configs/x.py --config.rl.algo=gagpo``). :func:`from_config_dict` turns it
into frozen dataclasses and checks every value before any compute starts, so a wrong value fails
with an error that names the field and lists the valid choices.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.util
import math
import os
import sys
from typing import Any

import ml_collections

from agentrl_jax import kernels
from agentrl_jax.models.config import PRESETS, REMAT_POLICIES
from agentrl_jax.rl import spec as spec_lib
from agentrl_jax.rl.spec import RLSpec
from agentrl_jax.rollout.curriculum import CurriculumConfig
from agentrl_jax.rollout.rollout import RolloutConfig
from agentrl_jax.run import budget as budget_lib

DTYPES = ("float32", "bfloat16")
REWARDS = ("sparse", "dense")
KL_MODES = spec_lib.KL_MODES
# Which train games RL draws from: all of them, or those no SFT demonstration used.
TASK_POOLS = ("all", "unseen")
# Chat templates (rollout/chat.py): fixed layouts, or the checkpoint's own jinja template.
TEMPLATES = ("checkpoint", "plain", "qwen")
# Where the RL section's defaults are declared (RLSection's docstring).
_SPEC = RLSpec()
_ADVANTAGE, _LOSS, _WEIGHTS, _KL = _SPEC.advantage, _SPEC.loss, _SPEC.weights, _SPEC.kl


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field and the valid choices."""


# ----------------------------------------------------------------------------- checks


def _choice(path: str, value: Any, choices) -> None:
    if value not in choices:
        raise ConfigError(f"{path} is {value!r}; valid choices: {sorted(choices)}")


def _number(path: str, value: Any, ok, expected: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
        raise ConfigError(f"{path} is {value!r}; expected {expected}")


def _positive(path: str, value: float) -> None:
    _number(path, value, lambda v: v > 0, "> 0")


def _non_negative(path: str, value: float) -> None:
    _number(path, value, lambda v: v >= 0, ">= 0")


def _fraction(path: str, value: float) -> None:
    _number(path, value, lambda v: 0.0 <= v <= 1.0, "in [0, 1]")


def _integer(path: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{path} is {value!r}; expected an int >= {low}")


def _microbatch(section: str, value: Any, batch_field: str, batch: int) -> None:
    """``config.<section>.microbatch_size``: 0 or None (no split), or a divisor of the batch."""
    path = f"config.{section}.microbatch_size"
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{path} is {value!r}; expected an int >= 0 (0: no microbatches)")
    if value and batch % value:
        raise ConfigError(
            f"{path}={value} does not divide config.{section}.{batch_field}={batch}: a "
            f"{batch_field} batch must split into whole microbatches; use a divisor of {batch} "
            "(or 0 for no microbatches)"
        )


def _mapping(**kwargs) -> dataclasses.Field:
    """A field given as a dict in the config (``{key: value}``), frozen as sorted pairs."""
    return dataclasses.field(default=(), metadata={"mapping": True}, **kwargs)


# ------------------------------------------------------------------- the sections
#
# The dataclasses below are the only definition of every default: ``base_config()``, which each
# configs/*.py starts from, is generated from them, and a key a ConfigDict leaves out takes the
# same value. Each section checks its own fields in ``__post_init__``; ``RunConfig`` checks the
# combinations across sections.


@dataclasses.dataclass(frozen=True)
class LoraSection:
    """``config.model.lora``: low-rank adapters on the policy (``models/lora.py``; rank 0: off).

    With ``rank`` > 0 the RL phase trains adapters only: they are applied to the policy as it
    enters RL (after the full-parameter SFT, or on the checkpoint's weights when SFT has no
    steps), B at zero, so RL starts from exactly the SFT policy; the base stays frozen, stored in
    ``base_dtype``, and the KL reference is that base. SFT stays a full fine-tune.
    """

    rank: int = 0  # the adapters' inner width; 0 turns LoRA off
    alpha: float = 8.0  # the scale's numerator: adapters add x A B * alpha / rank
    # PEFT's lora_dropout: each RL step's forward pass drops an adapter's input entries with
    # this probability (masks from the run's seed and the step; scoring and sampling never drop,
    # so it is refused with rl.loss='ppo', whose ratio it would bias)
    dropout: float = 0.0
    targets: str = "all"  # some of q,k,v,o,gate,up,down (comma-separated), or "all"
    # The frozen base's storage dtype (the adapters stay float32); empty: model.dtype, the
    # compute dtype (a bf16 base under bf16 compute: half the memory of the f32 weights SFT
    # trained).
    base_dtype: str = ""

    def __post_init__(self):
        from agentrl_jax.models.config import LORA_TARGETS

        if self.base_dtype:
            _choice("config.model.lora.base_dtype", self.base_dtype, DTYPES)

        _integer("config.model.lora.rank", self.rank, 0)
        _positive("config.model.lora.alpha", self.alpha)
        _number(
            "config.model.lora.dropout",
            self.dropout,
            lambda v: 0 <= v < 1,
            "a probability in [0, 1)",
        )
        targets = self.targets
        if isinstance(targets, (list, tuple)):
            targets = ",".join(str(t) for t in targets)
        if not isinstance(targets, str) or not targets.strip():
            raise ConfigError(
                f"config.model.lora.targets is {self.targets!r}; expected some of "
                f"{list(LORA_TARGETS)}, comma-separated, or 'all'"
            )
        if targets.strip() != "all":
            names = [t.strip() for t in targets.split(",")]
            unknown = [t for t in names if t not in LORA_TARGETS]
            if unknown or len(set(names)) != len(names):
                raise ConfigError(
                    f"config.model.lora.targets is {self.targets!r}: "
                    + (f"{unknown} not among" if unknown else "repeated names; expected some of")
                    + f" the projections {list(LORA_TARGETS)} (comma-separated), or 'all'"
                )
            targets = ",".join(t for t in LORA_TARGETS if t in names)
        object.__setattr__(self, "targets", targets.strip())

    @property
    def enabled(self) -> bool:
        """Whether this is a LoRA run (``rank`` > 0: the RL phase trains adapters only): the
        one test of it, for the config's checks, the RL policy, the trainer's adapter export,
        ``launch.export`` and the memory plan."""
        return self.rank > 0

    def lora_config(self):
        """The model's ``LoraConfig``, or None when this is no LoRA run."""
        from agentrl_jax.models.config import LoraConfig

        if not self.enabled:
            return None
        return LoraConfig(
            rank=self.rank, alpha=self.alpha, dropout=self.dropout, targets=self.targets
        )


_LORA = "config.model.lora"


def _section_field(cls) -> dataclasses.Field:
    """A nested section (``config.model.lora``), a dict of its own fields in the config."""
    return dataclasses.field(default_factory=cls, metadata={"section": cls})


@dataclasses.dataclass(frozen=True)
class ModelSection:
    preset: str = "tiny"
    checkpoint: str = ""  # a local Hugging Face directory; empty: a fresh preset model
    tokenizer: str = ""  # a local tokenizer dir; empty: the checkpoint's, or built from env text
    # The vocabulary of a tokenizer built from the env text (no checkpoint, no tokenizer given).
    tokenizer_vocab: int = 1024
    # The train tasks (each level's first) whose expert episodes that tokenizer learns from; 0: all
    # of them. A family whose words are few (ALFWorld's 3,553 games) needs a few hundred.
    tokenizer_tasks: int = 0
    # The chat template: "checkpoint" (the checkpoint's or tokenizer's own jinja template, checked
    # when the run starts), "qwen" or "plain"; empty: "checkpoint" when model.checkpoint is set,
    # else "plain".
    template: str = ""
    dtype: str = "float32"
    remat: str = "none"  # what each layer keeps for the backward pass: REMAT_POLICIES
    scan_layers: bool = False  # the layers as one scanned stack (ModelConfig.scan_layers)
    # The learner runs the LM head over this many positions at a time (and recomputes them in the
    # backward pass), so its logits peak at [B, logits_chunk, V], never [B, T, V].
    logits_chunk: int = 256
    overrides: tuple[tuple[str, Any], ...] = _mapping()  # preset fields to change: num_layers=2
    # LoRA adapters for the RL phase (LoraSection); rank 0, the default: full fine-tuning.
    lora: LoraSection = _section_field(LoraSection)

    def __post_init__(self):
        if not isinstance(self.lora, LoraSection):  # a dict, or its sorted (key, value) pairs
            object.__setattr__(self, "lora", _section(LoraSection, dict(self.lora), _LORA))
        if not self.checkpoint:
            _choice("config.model.preset", self.preset, PRESETS)
        _choice("config.model.dtype", self.dtype, DTYPES)
        if not self.lora.base_dtype:
            object.__setattr__(self, "lora", dataclasses.replace(self.lora, base_dtype=self.dtype))
        if not self.template:
            object.__setattr__(self, "template", "checkpoint" if self.checkpoint else "plain")
        _choice("config.model.template", self.template, TEMPLATES)
        if self.template == "checkpoint" and not (self.checkpoint or self.tokenizer):
            raise ConfigError(
                "config.model.template is 'checkpoint' (the chat template of "
                "config.model.checkpoint or config.model.tokenizer) but neither is set; expected "
                "a checkpoint or tokenizer directory, or template 'qwen' or 'plain'"
            )
        _choice("config.model.remat", self.remat, REMAT_POLICIES)
        if not isinstance(self.scan_layers, bool):
            raise ConfigError(f"config.model.scan_layers is {self.scan_layers!r}; expected a bool")
        _integer("config.model.logits_chunk", self.logits_chunk, 1)
        _integer("config.model.tokenizer_tasks", self.tokenizer_tasks, 0)
        if not self.checkpoint and not self.tokenizer:
            from agentrl_jax.models.tokenizer import MIN_VOCAB_SIZE

            if isinstance(self.tokenizer_vocab, bool) or not (
                isinstance(self.tokenizer_vocab, int) and self.tokenizer_vocab >= MIN_VOCAB_SIZE
            ):
                raise ConfigError(
                    f"config.model.tokenizer_vocab is {self.tokenizer_vocab!r}; expected an int "
                    f">= {MIN_VOCAB_SIZE} (the tokenizer built from the env text holds the "
                    "special tokens and 256 bytes)"
                )


def check_levels(family, field: str, levels, held_out: bool = True) -> None:
    """Each of ``levels`` (``level`` or ``level@split``) names a level and split the env family
    has (``registry.EnvFamily``): a held-out split where ``held_out``, none otherwise (train
    levels read ``train``); a level among ``family.levels`` where it declares them.

    Raises:
      ConfigError: naming ``field``, the family and its splits or levels.
    """
    from agentrl_jax.envs import registry

    for entry in levels:
        if not isinstance(entry, str) or not entry.partition("@")[0]:
            raise ConfigError(f"{field} holds {entry!r}; expected 'level' or 'level@split'")
        level, at, split = entry.partition("@")
        splits = family.held_out_splits if held_out else ()
        if at and split not in splits:
            where = (
                f"one of {', '.join(splits)}"
                if splits
                else f"none (they read {registry.TRAIN_SPLIT!r})"
            )
            raise ConfigError(
                f"{field} holds {entry!r}: env family {family.name!r} has no held-out split "
                f"{split!r}; expected {where} (registered env families: "
                f"{', '.join(registry.names())})"
            )
        if family.levels and level not in family.levels:
            raise ConfigError(
                f"{field} holds {entry!r}: env family {family.name!r} has no level {level!r}; "
                f"expected one of {', '.join(family.levels)}"
            )


@dataclasses.dataclass(frozen=True)
class EnvSection:
    name: str = "textworld"
    kwargs: tuple[tuple[str, Any], ...] = _mapping()  # the env's constructor arguments
    train_levels: tuple[str, ...] = ("simple",)
    eval_levels: tuple[str, ...] = ("simple", "medium")
    num_train_tasks: int = 200
    num_eval_tasks: int = 50
    report_levels: tuple[str, ...] = ()  # empty: eval_levels, on the report split
    # Games per level of the before/after report (0: the report reads the valid evaluations).
    num_report_tasks: int = 200
    # Episodes per evaluated level written out as text (eval/<name>_<level>_transcripts.md).
    num_transcripts: int = 3
    num_workers: int = 2  # actor processes (0: one per CPU)
    envs_per_worker: int = 16
    # A worker steps its envs side by side, each on a thread (envs whose steps wait: remote,
    # subprocesses, step_latency_s); False: one after another.
    concurrent_steps: bool = False

    def __post_init__(self):
        from agentrl_jax.envs import registry

        try:
            registry.resolve(self.name)
        except ValueError as e:
            raise ConfigError(f"config.env.name: {e}") from e
        for name in ("train_levels", "eval_levels"):
            if not getattr(self, name):
                raise ConfigError(f"config.env.{name} is empty; expected at least one level")
        try:
            family = registry.family(self.name)
        except ValueError:  # a "module:attr" path: an env without a registered task source
            return
        for name in ("train_levels", "eval_levels", "report_levels"):
            check_levels(family, f"config.env.{name}", getattr(self, name), name != "train_levels")
        _integer("config.env.num_train_tasks", self.num_train_tasks, 1)
        _integer("config.env.num_eval_tasks", self.num_eval_tasks, 1)
        _integer("config.env.num_report_tasks", self.num_report_tasks, 0)
        _integer("config.env.num_transcripts", self.num_transcripts, 0)
        _integer("config.env.num_workers", self.num_workers, 0)
        _integer("config.env.envs_per_worker", self.envs_per_worker, 1)
        if not isinstance(self.concurrent_steps, bool):
            raise ConfigError(
                f"config.env.concurrent_steps is {self.concurrent_steps!r}; expected True or False"
            )


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
        _integer("config.sft.epochs", self.epochs, 1)
        _integer("config.sft.batch_size", self.batch_size, 1)
        _microbatch("sft", self.microbatch_size, "batch_size", self.batch_size)
        _positive("config.sft.learning_rate", self.learning_rate)
        _integer("config.sft.warmup_steps", self.warmup_steps, 0)
        _fraction("config.sft.end_lr_fraction", self.end_lr_fraction)
        _integer("config.sft.group_by_length", self.group_by_length, 0)


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
        _choice("config.rl.algo", self.algo, kernels.advantage_estimators())
        _choice("config.rl.off_policy_correction", self.off_policy_correction, kernels.CORRECTIONS)
        _number("config.rl.is_cap", self.is_cap, lambda v: v > 1, "> 1")
        _choice("config.rl.loss", self.loss, kernels.policy_losses())
        _choice("config.rl.kl_mode", self.kl_mode, KL_MODES)
        _choice("config.rl.task_pool", self.task_pool, TASK_POOLS)
        _choice("config.rl.reference_dtype", self.reference_dtype, spec_lib.REFERENCE_DTYPES)
        for name in ("actor_lr", "critic_lr", "max_grad_norm"):
            _positive(f"config.rl.{name}", getattr(self, name))
        for name in ("tasks_per_iteration", "epochs", "minibatch_size"):
            _integer(f"config.rl.{name}", getattr(self, name), 1)
        _integer("config.rl.max_staleness", self.max_staleness, 0)
        _microbatch("rl", self.microbatch_size, "minibatch_size", self.minibatch_size)
        for name in ("kl_coef", "entropy_coef", "value_coef"):
            _non_negative(f"config.rl.{name}", getattr(self, name))
        _number(
            "config.rl.temperature",
            self.temperature,
            lambda v: v > 0,
            "> 0: RL samples its rollouts and the learner divides the logits by the temperature "
            "(greedy decoding is for evaluation)",
        )
        _number("config.rl.top_p", self.top_p, lambda v: 0.0 < v <= 1.0, "in (0, 1]")
        _integer("config.rl.top_k", self.top_k, 0)
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
        _non_negative("config.envrl.sp_weight", self.sp_weight)
        _non_negative("config.envrl.id_weight", self.id_weight)
        _integer("config.envrl.horizon", self.horizon, 0)


@dataclasses.dataclass(frozen=True)
class CheckpointSection:
    keep_last: int = 2
    keep_best: int = 1
    every: int = 5  # RL iterations between checkpoints (and always after the last one)

    def __post_init__(self):
        _integer("config.checkpoint.keep_last", self.keep_last, 1)
        _integer("config.checkpoint.keep_best", self.keep_best, 0)
        _integer("config.checkpoint.every", self.every, 1)


# Each section of the config and the dataclass it is frozen into (``curriculum`` is built apart:
# its ``stages`` default to the env's train levels).
SECTIONS: dict[str, type] = {
    "model": ModelSection,
    "env": EnvSection,
    "rollout": RolloutConfig,
    "sft": SFTSection,
    "budget": BudgetSection,
    "rl": RLSection,
    "envrl": EnvrlSection,
    "checkpoint": CheckpointSection,
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig:
    seed: int = 0
    model: ModelSection
    # (data, fsdp, tp); the product is the device count, and one size may be -1: the devices the
    # others leave, e.g. (1, -1, 1) shards parameters over every device (FSDP).
    mesh: tuple[int, int, int] = (1, 1, 1)
    # Disaggregated rollouts: (data, fsdp, tp) of a mesh of devices of their own, after the
    # learner's (one host); the sampler's copy of the policy moves there device to device after
    # each update. Empty: rollouts run on the learner's mesh.
    rollout_mesh: tuple[int, ...] = ()
    env: EnvSection
    rollout: RolloutConfig
    curriculum: CurriculumConfig
    sft: SFTSection
    budget: BudgetSection
    rl: RLSection
    envrl: EnvrlSection
    checkpoint: CheckpointSection
    eval_every: int = 0  # RL iterations between held-out evaluations (0: only before and after)
    # Seconds an RL iteration, SFT epoch, evaluation or checkpoint may take before the process
    # ends with an error naming it (0: no limit). A multi-host run otherwise waits forever on a
    # host that hangs (run/watchdog.py); leave room for the first iteration's compilation.
    watchdog_s: float = 0.0
    # Modules imported before validation: they register estimators, losses or envs by name
    # (docs/custom_losses.md), e.g. --config.plugins="('my_losses',)".
    plugins: tuple[str, ...] = ()
    # JAX's persistent compilation cache (agentrl_jax/compile_cache.py): a folder, "" for
    # $AGENTRL_CACHE/jax (default ~/.cache/agentrl_jax/jax), or "off". A resumed or repeated run
    # loads the programs an earlier process compiled instead of compiling them again.
    compile_cache: str = ""

    def __post_init__(self):
        """The checks across sections (each section checked its own fields)."""
        _integer("config.seed", self.seed, 0)
        _integer("config.eval_every", self.eval_every, 0)
        _number("config.watchdog_s", self.watchdog_s, lambda v: v >= 0, ">= 0 seconds (0: off)")
        if (
            len(self.mesh) != 3
            or any(isinstance(x, bool) or not isinstance(x, int) for x in self.mesh)
            or any(x < 1 and x != -1 for x in self.mesh)
            or self.mesh.count(-1) > 1
        ):
            raise ConfigError(
                f"config.mesh is {self.mesh}; expected three sizes (data, fsdp, tp), positive or "
                "one -1 (the devices the others leave)"
            )
        _check_rollout_mesh(self.rollout_mesh)
        rl, rollout, env = self.rl, self.rollout, self.env
        spec = kernels.get_advantage_spec(rl.algo)
        if spec.needs_values and rollout.context_mode != "episode":
            raise ConfigError(
                f"config.rl.algo={rl.algo!r} uses a critic over the whole trajectory; it needs "
                f"config.rollout.context_mode='episode' (got {rollout.context_mode!r})"
            )
        if spec.needs_groups and rollout.group_size < 2:
            raise ConfigError(
                f"config.rl.algo={rl.algo!r} compares rollouts within a group; it needs "
                f"config.rollout.group_size >= 2 (got {rollout.group_size})"
            )
        lora = self.model.lora
        if lora.enabled and lora.dropout > 0 and rl.loss == "ppo":
            raise ConfigError(
                f"config.model.lora.dropout={lora.dropout} with config.rl.loss='ppo': the RL "
                "steps drop adapter inputs but the old log-probs are scored without dropout, so "
                "the PPO ratio would be pi_dropout / pi, not 1, on-policy; expected "
                "config.model.lora.dropout=0, or a loss without a ratio (config.rl.loss='pg')"
            )
        episodes = rl.tasks_per_iteration * rollout.group_size
        if rl.minibatch_size > episodes:
            raise ConfigError(
                f"config.rl.minibatch_size={rl.minibatch_size} is more than an iteration's "
                f"{episodes} episodes (config.rl.tasks_per_iteration={rl.tasks_per_iteration} x "
                f"config.rollout.group_size={rollout.group_size}): RL would never update"
            )
        capacity = env.num_workers * env.envs_per_worker
        if env.num_workers and rollout.group_size > capacity:
            raise ConfigError(
                f"config.rollout.group_size={rollout.group_size} does not fit the actor pool: "
                f"config.env.num_workers={env.num_workers} x "
                f"config.env.envs_per_worker={env.envs_per_worker} = {capacity} episodes at once"
            )
        split = budget_lib.from_config(self.budget)
        if split.num_rl_episodes and not split.rl_iterations(episodes):
            raise ConfigError(
                f"config.budget leaves {split.num_rl_episodes} RL episodes, fewer than one "
                f"iteration's {episodes} (config.rl.tasks_per_iteration x "
                "config.rollout.group_size): raise config.budget.total or lower "
                "config.budget.sft_fraction, or set sft_fraction=1.0 for no RL"
            )
        if rl.task_pool == "unseen" and env.num_train_tasks <= split.num_demos:
            raise ConfigError(
                f"config.rl.task_pool='unseen' plays train games no demonstration used, but "
                f"config.env.num_train_tasks={env.num_train_tasks} games per level leave none "
                f"after the budget's {split.num_demos} demonstrations; raise num_train_tasks "
                f"above {split.num_demos}"
            )
        from agentrl_jax.envs import registry

        if env.name in registry.names():  # the curriculum's levels are train levels too
            check_levels(
                registry.family(env.name), "config.curriculum.stages", self.curriculum.levels, False
            )
        kwargs = dict(env.kwargs)
        from agentrl_jax.envs.base import split_latency

        try:  # any family: a delay on every env step (benchmarks, tests)
            split_latency(kwargs)
        except ValueError as e:
            raise ConfigError(str(e).replace("env.kwargs", "config.env.kwargs", 1)) from None
        if rollout.constrain_actions and (
            registry.lists_admissible_commands(env.name, kwargs) is False
        ):
            raise ConfigError(
                "config.rollout.constrain_actions=True writes one of the env's admissible "
                f"commands, but config.env.name={env.name!r} with config.env.kwargs="
                f"{dict(env.kwargs)} lists none (set constrain_actions=False, or turn the "
                "env's admissible commands on)"
            )

    def rl_spec(self, num_iterations: int = 1) -> RLSpec:
        """The run's RL settings, resolved once (``rl/spec.py``): what the learner, the RL
        update, the frozen reference, the memory plan and the benchmarks read.

        ``num_iterations``: the run's RL iterations, the ENVRL weights' horizon when
        ``envrl.horizon`` is 0.
        """
        return RLSpec.from_sections(
            self.rl,
            self.envrl,
            context_mode=self.rollout.context_mode,
            num_iterations=num_iterations,
        )

    @property
    def needs_critic(self) -> bool:
        return self.rl_spec().needs_critic


def _defaults(cls) -> dict[str, Any]:
    """The default of every field of dataclass ``cls`` that has one, as a config value (a
    mapping field as a dict)."""
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            continue
        if "section" in f.metadata:
            value = _defaults(f.metadata["section"])
        out[f.name] = dict(value) if f.metadata.get("mapping") else value
    return out


def base_config() -> ml_collections.ConfigDict:
    """The defaults every ``configs/<name>.py`` starts from, generated from the dataclasses."""
    c = ml_collections.ConfigDict()
    top = _defaults(RunConfig)
    for name in ("seed", "mesh", "rollout_mesh", "eval_every", "watchdog_s", "plugins"):
        c[name] = top[name]
    for name in ("model", "env", "rollout"):
        c[name] = _defaults(SECTIONS[name])
    curriculum = _defaults(CurriculumConfig)
    # Empty stages: one stage over config.env.train_levels; empty stage_iterations: None.
    c.curriculum = dict(curriculum, stages=[], stage_iterations=())
    for name in ("sft", "budget", "rl", "envrl", "checkpoint"):
        c[name] = _defaults(SECTIONS[name])
    return c


def _section(cls, cd, path: str):
    """Builds dataclass ``cls`` from ConfigDict ``cd``; unknown keys are errors."""
    values = dict(cd) if cd is not None else {}
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(f"{path}: unknown field(s) {unknown}; valid fields: {sorted(fields)}")
    out = {}
    for name, value in values.items():
        if "section" in fields[name].metadata:
            sub = fields[name].metadata["section"]
            out[name] = value if isinstance(value, sub) else _section(sub, value, f"{path}.{name}")
            continue
        if isinstance(value, (list, tuple)):
            value = tuple(tuple(v) if isinstance(v, list) else v for v in value)
        elif hasattr(value, "items"):
            value = tuple(sorted(dict(value).items()))
        out[name] = value
    try:
        return cls(**out)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{path}: {e}") from e


def import_plugins(names) -> tuple[str, ...]:
    """Imports the user modules named in ``config.plugins`` (they register estimators, losses).

    A plugin is any importable module (``"my_losses"``, ``"mypkg.rl"``) whose import registers
    things, e.g. with :func:`agentrl_jax.register_advantage_estimator` and
    :func:`agentrl_jax.register_policy_loss`. Modules are found on ``sys.path``
    (``python -m launch.train`` puts the current directory there). See docs/custom_losses.md.

    Raises:
      ConfigError: ``names`` is not a list of module names, or one cannot be imported (the
        message names the module and the import error).
    """
    if isinstance(names, str) or not all(isinstance(n, str) and n for n in names):
        raise ConfigError(
            f"config.plugins is {names!r}; expected a tuple of module names, e.g. ('my_losses',)"
        )
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as e:  # Any failure while importing user code names the module.
            raise ConfigError(
                f"config.plugins: cannot import module {name!r}: {type(e).__name__}: {e} "
                f"(is it on sys.path? sys.path[0] is {sys.path[0]!r})"
            ) from e
    return tuple(names)


def missing_key(config, dotted: str) -> str | None:
    """The one-line error when ConfigDict ``config`` has no ``dotted`` key (``"rl.lr"``), naming
    the section's valid keys and the closest match; None when it has it."""
    path = dotted.split(".")
    node, where = config, "config"
    for key in path:
        keys = sorted(node.keys()) if hasattr(node, "keys") else []
        if key not in keys:
            close = difflib.get_close_matches(key, keys, n=1)
            hint = f" (did you mean {where}.{close[0]}?)" if close else ""
            valid = ", ".join(keys) if keys else f"none: {where} is not a section"
            return f"config error: {where} has no key {key!r}{hint}; valid keys: {valid}"
        node, where = node[key], f"{where}.{key}"
    return None


def load_config_file(spec: str):
    """The ConfigDict of ``"configs/x.py"`` or ``"configs/x.py:arg"``, as ``--config=`` reads it.

    Calls the file's ``get_config(arg)`` (``get_config()`` without ``:arg``), like absl's
    ``config_flags.DEFINE_config_file``; overrides are then plain assignments
    (``cd.rl.algo = "gagpo"``) before :func:`from_config_dict`.
    """
    path, _, arg = spec.partition(":")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"config file {path!r} not found (from {spec!r})")
    name = "agentrl_config_" + os.path.splitext(os.path.basename(path))[0]
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.get_config(arg) if arg else module.get_config()


def _check_rollout_mesh(sizes) -> None:
    if sizes and (
        len(sizes) != 3
        or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in sizes)
    ):
        raise ConfigError(
            f"config.rollout_mesh is {sizes}; expected () (rollouts on the learner's mesh) or "
            "three positive sizes (data, fsdp, tp)"
        )


def _mesh(value, num_devices: int | None) -> tuple[int, int, int]:
    """``config.mesh``: (data, fsdp, tp) sizes; one may be -1, the devices the others leave.

    With ``num_devices`` the product must equal it (a -1 is resolved against it); without, a -1
    stays for ``sharding.make_mesh`` to resolve against the devices it is given.
    """
    mesh = tuple(int(x) for x in value)
    if len(mesh) != 3 or any(x < 1 and x != -1 for x in mesh) or mesh.count(-1) > 1:
        raise ConfigError(
            f"config.mesh is {mesh}; expected three sizes (data, fsdp, tp), positive or one -1 "
            "(the devices the others leave)"
        )
    if num_devices is None:
        return mesh
    known = math.prod(x for x in mesh if x != -1)
    if -1 in mesh and num_devices % known == 0:
        mesh = tuple(num_devices // known if x == -1 else x for x in mesh)
    if math.prod(mesh) != num_devices:
        needs = f"a multiple of {known}" if -1 in mesh else str(known)
        raise ConfigError(
            f"config.mesh={mesh} needs {needs} devices; this run has {num_devices} (the product "
            "of (data, fsdp, tp) must equal the device count)"
        )
    return mesh


def from_config_dict(cd, *, num_devices: int | None = None) -> RunConfig:
    """Validates a ConfigDict and freezes it into a RunConfig (no compute happens here).

    The modules in ``cd.plugins`` are imported first, so the estimators and losses they register
    are valid names for ``rl.algo`` and ``rl.loss``. A key ``cd`` leaves out takes its default
    (the dataclass field's, as in ``base_config()``).
    """
    plugins = import_plugins(tuple(cd.get("plugins", ()) or ()))
    keys = sorted(f.name for f in dataclasses.fields(RunConfig))
    unknown = sorted(set(cd.keys()) - set(keys))
    if unknown:
        raise ConfigError(f"config: unknown key(s) {unknown}; valid keys: {keys}")
    top = _defaults(RunConfig)
    sections = {
        name: _section(cls, cd.get(name), f"config.{name}") for name, cls in SECTIONS.items()
    }
    cur = dict(cd.get("curriculum") or {})
    try:
        stages = cur.get("stages") or [[(level, 1.0) for level in sections["env"].train_levels]]
        cur["stages"] = tuple(tuple((str(lv), float(w)) for lv, w in stage) for stage in stages)
        iterations = cur.get("stage_iterations")
        cur["stage_iterations"] = tuple(iterations) if iterations else None
    except (TypeError, ValueError) as e:
        raise ConfigError(f"config.curriculum: {e}") from e
    curriculum = _section(CurriculumConfig, cur, "config.curriculum")
    try:
        rollout_mesh = tuple(int(x) for x in cd.get("rollout_mesh", top["rollout_mesh"]) or ())
    except (TypeError, ValueError) as e:
        raise ConfigError(
            f"config.rollout_mesh is {cd.get('rollout_mesh')!r}; expected three ints"
        ) from e
    _check_rollout_mesh(rollout_mesh)
    learner_devices = num_devices
    if num_devices is not None and rollout_mesh:
        learner_devices = num_devices - math.prod(rollout_mesh)  # the rollout's are its own
    try:
        mesh = _mesh(cd.get("mesh", top["mesh"]), learner_devices)
    except (TypeError, ValueError) as e:
        if isinstance(e, ConfigError) and learner_devices != num_devices:
            raise ConfigError(
                f"{e}; config.rollout_mesh={rollout_mesh} takes {math.prod(rollout_mesh)} of "
                f"the {num_devices} devices"
            ) from e
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"config.mesh is {cd.get('mesh')!r}; expected three ints") from e
    return RunConfig(
        seed=cd.get("seed", top["seed"]),
        mesh=mesh,
        rollout_mesh=rollout_mesh,
        curriculum=curriculum,
        eval_every=cd.get("eval_every", top["eval_every"]),
        watchdog_s=cd.get("watchdog_s", top["watchdog_s"]),
        plugins=plugins,
        **sections,
    )
