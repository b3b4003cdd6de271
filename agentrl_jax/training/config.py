"""The run configuration: ml_collections ConfigDicts from configs/*.py, frozen and validated here.

``configs/<name>.py`` defines ``get_config(arg)`` returning a ConfigDict; absl flags choose and
override it (``--config=configs/x.py --config.rl.algo=gagpo``). :func:`from_config_dict` turns it
into frozen dataclasses and checks every value before any compute starts, so a wrong value fails
with an error that names the field and lists the valid choices.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import math
import os
import sys
from typing import Any

from agentrl_jax import kernels
from agentrl_jax.models.config import PRESETS
from agentrl_jax.training import budget as budget_lib
from agentrl_jax.training.curriculum import CurriculumConfig
from agentrl_jax.training.rollout import RolloutConfig

DTYPES = ("float32", "bfloat16")
REWARDS = ("sparse", "dense")
KL_MODES = ("loss", "reward")
# Which train games RL draws from: all of them, or those no SFT demonstration used.
TASK_POOLS = ("all", "unseen")
TEMPLATES = ("plain", "qwen")


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field and the valid choices."""


@dataclasses.dataclass(frozen=True)
class ModelSection:
    preset: str = "tiny"
    checkpoint: str = ""  # a local Hugging Face directory; empty: a fresh preset model
    tokenizer: str = ""  # a local tokenizer dir; empty: the checkpoint's, or built from env text
    tokenizer_vocab: int = 2048
    template: str = "plain"
    dtype: str = "float32"
    remat: bool = False
    # Positions per LM-head call in the learner: its logits peak at [B, logits_chunk, V].
    logits_chunk: int = 256
    overrides: tuple[tuple[str, Any], ...] = ()  # preset fields to change, e.g. num_layers=2


@dataclasses.dataclass(frozen=True)
class EnvSection:
    name: str = "textworld"
    kwargs: tuple[tuple[str, Any], ...] = ()
    train_levels: tuple[str, ...] = ("simple",)
    eval_levels: tuple[str, ...] = ("simple", "medium")
    num_train_tasks: int = 200
    num_eval_tasks: int = 50
    num_workers: int = 2
    envs_per_worker: int = 8


@dataclasses.dataclass(frozen=True)
class SFTSection:
    """SFT: Adam with linear warmup, then cosine decay to ``learning_rate * end_lr_fraction``.

    ``group_by_length``: windows of that many batches are sorted by length before batching
    (less padding; see ``sft_data.SftDataConfig``); 0 batches in shuffled order.
    ``microbatch_size``: rows per microbatch of a batch (gradient accumulation inside the jitted
    step: memory is set by the microbatch, the update is the whole batch's); it must divide
    ``batch_size``; 0 (or None): the whole batch at once.
    """

    epochs: int = 2
    batch_size: int = 16
    microbatch_size: int | None = 0
    learning_rate: float = 1e-3
    warmup_steps: int = 10
    end_lr_fraction: float = 0.1
    group_by_length: int = 8


@dataclasses.dataclass(frozen=True)
class BudgetSection:
    """Practitioner's-guide units: one SFT demonstration costs 10, one RL episode 1."""

    total: int = 2000
    sft_fraction: float = 0.5


@dataclasses.dataclass(frozen=True)
class RLSection:
    algo: str = "grpo"
    loss: str = "ppo"
    tasks_per_iteration: int = 8
    epochs: int = 2
    minibatch_size: int = 16
    # Rows per microbatch of a minibatch (gradient accumulation inside the jitted step: memory is
    # set by the microbatch, the update is the minibatch's); a divisor of minibatch_size, or 0
    # (or None) for the whole minibatch at once.
    microbatch_size: int | None = 0
    actor_lr: float = 1e-4
    critic_lr: float = 1e-3
    max_grad_norm: float = 1.0
    gamma: float = 1.0
    lam: float = 0.95
    norm_by_std: bool = True
    step_weight: float = 1.0
    kl_coef: float = 0.0
    kl_mode: str = "loss"
    entropy_coef: float = 0.0
    value_coef: float = 0.5
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    ratio_level: str = "auto"  # "auto": the estimator's own (its ``ratio_level``)
    aggregation: str = "token_mean"
    value_clip: float | None = 0.2
    kl_estimator: str = "k3"
    kl_clamp: float | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    task_pool: str = "all"


@dataclasses.dataclass(frozen=True)
class EnvrlSection:
    enabled: bool = False
    sp_weight: float = 0.1
    id_weight: float = 0.1
    horizon: int = 100


@dataclasses.dataclass(frozen=True)
class CheckpointSection:
    keep_last: int = 2
    keep_best: int = 1
    every: int = 1


@dataclasses.dataclass(frozen=True)
class RunConfig:
    seed: int
    model: ModelSection
    mesh: tuple[int, int, int]
    env: EnvSection
    rollout: RolloutConfig
    curriculum: CurriculumConfig
    sft: SFTSection
    budget: BudgetSection
    rl: RLSection
    envrl: EnvrlSection
    checkpoint: CheckpointSection
    eval_every: int
    plugins: tuple[str, ...] = ()

    @property
    def needs_critic(self) -> bool:
        return kernels.get_advantage_spec(self.rl.algo).needs_values

    def advantage_config(self) -> kernels.AdvantageConfig:
        rl = self.rl
        return kernels.AdvantageConfig(
            gamma=rl.gamma,
            lam=rl.lam,
            norm_by_std=rl.norm_by_std,
            step_weight=rl.step_weight,
            kl_coef=rl.kl_coef if rl.kl_mode == "reward" else 0.0,
        )

    @property
    def ratio_level(self) -> str:
        """``rl.ratio_level``, or with "auto" the one the estimator is defined with."""
        if self.rl.ratio_level == "auto":
            return kernels.get_advantage_spec(self.rl.algo).ratio_level
        return self.rl.ratio_level

    def loss_config(self) -> kernels.LossConfig:
        rl = self.rl
        return kernels.LossConfig(
            clip_low=rl.clip_low,
            clip_high=rl.clip_high,
            dual_clip=rl.dual_clip,
            ratio_level=self.ratio_level,
            aggregation=rl.aggregation,
            value_clip=rl.value_clip,
            kl_estimator=rl.kl_estimator,
            kl_clamp=rl.kl_clamp,
        )


def _section(cls, cd, path: str):
    """Builds dataclass ``cls`` from ConfigDict ``cd``; unknown keys are errors."""
    values = dict(cd) if cd is not None else {}
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(f"{path}: unknown field(s) {unknown}; valid fields: {sorted(fields)}")
    out = {}
    for name, value in values.items():
        if isinstance(value, (list, tuple)):
            value = tuple(tuple(v) if isinstance(v, list) else v for v in value)
        elif hasattr(value, "items"):
            value = tuple(sorted(dict(value).items()))
        out[name] = value
    try:
        return cls(**out)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{path}: {e}") from e


def _choice(path: str, value: Any, choices) -> None:
    if value not in choices:
        raise ConfigError(f"{path} is {value!r}; valid choices: {sorted(choices)}")


def _positive(path: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(f"{path} is {value!r}; expected > 0")


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
    are valid names for ``rl.algo`` and ``rl.loss``.
    """
    plugins = import_plugins(tuple(cd.get("plugins", ()) or ()))
    model = _section(ModelSection, cd.get("model"), "config.model")
    if not model.checkpoint:
        _choice("config.model.preset", model.preset, PRESETS)
    _choice("config.model.dtype", model.dtype, DTYPES)
    _choice("config.model.template", model.template, TEMPLATES)
    if isinstance(model.logits_chunk, bool) or not isinstance(model.logits_chunk, int):
        raise ConfigError(f"config.model.logits_chunk is {model.logits_chunk!r}; expected an int")
    _positive("config.model.logits_chunk", model.logits_chunk)
    env = _section(EnvSection, cd.get("env"), "config.env")
    rollout = _section(RolloutConfig, cd.get("rollout"), "config.rollout")
    sft = _section(SFTSection, cd.get("sft"), "config.sft")
    budget = _section(BudgetSection, cd.get("budget"), "config.budget")
    rl = _section(RLSection, cd.get("rl"), "config.rl")
    envrl = _section(EnvrlSection, cd.get("envrl"), "config.envrl")
    ckpt = _section(CheckpointSection, cd.get("checkpoint"), "config.checkpoint")

    _choice("config.rl.algo", rl.algo, kernels.advantage_estimators())
    _choice("config.rl.loss", rl.loss, kernels.policy_losses())
    _choice("config.rl.kl_mode", rl.kl_mode, KL_MODES)
    _choice("config.rl.task_pool", rl.task_pool, TASK_POOLS)
    for name in ("actor_lr", "critic_lr", "max_grad_norm"):
        _positive(f"config.rl.{name}", getattr(rl, name))
    for name in ("tasks_per_iteration", "epochs", "minibatch_size"):
        _positive(f"config.rl.{name}", getattr(rl, name))
    _microbatch("rl", rl.microbatch_size, "minibatch_size", rl.minibatch_size)
    _microbatch("sft", sft.microbatch_size, "batch_size", sft.batch_size)
    _positive("config.sft.learning_rate", sft.learning_rate)
    if not 0.0 <= sft.end_lr_fraction <= 1.0:
        raise ConfigError(f"config.sft.end_lr_fraction is {sft.end_lr_fraction}; expected [0, 1]")
    if sft.group_by_length < 0:
        raise ConfigError(f"config.sft.group_by_length is {sft.group_by_length}; expected >= 0")
    if not 0.0 <= budget.sft_fraction <= 1.0:
        raise ConfigError(f"config.budget.sft_fraction is {budget.sft_fraction}; expected [0, 1]")
    try:
        num_demos = budget_lib.from_config(budget).num_demos
    except ValueError as e:
        raise ConfigError(str(e)) from e
    if rl.task_pool == "unseen" and env.num_train_tasks <= num_demos:
        raise ConfigError(
            f"config.rl.task_pool='unseen' plays train games no demonstration used, but "
            f"config.env.num_train_tasks={env.num_train_tasks} games per level leave none after "
            f"the budget's {num_demos} demonstrations; raise num_train_tasks above {num_demos}"
        )
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
    if rl.ratio_level not in ("auto", *kernels.RATIO_LEVELS):
        raise ConfigError(
            f"config.rl.ratio_level={rl.ratio_level!r}: expected 'auto' (the estimator's own: "
            f"{spec.ratio_level!r} for {rl.algo!r}) or one of {kernels.RATIO_LEVELS}"
        )
    try:
        kernels.AdvantageConfig(gamma=rl.gamma, lam=rl.lam, step_weight=rl.step_weight)
        kernels.LossConfig(
            clip_low=rl.clip_low,
            clip_high=rl.clip_high,
            dual_clip=rl.dual_clip,
            aggregation=rl.aggregation,
            value_clip=rl.value_clip,
            kl_estimator=rl.kl_estimator,
            kl_clamp=rl.kl_clamp,
        )
    except ValueError as e:
        raise ConfigError(f"config.rl: {e}") from e

    cur = cd.get("curriculum") or {}
    stages = cur.get("stages") or [[(level, 1.0) for level in env.train_levels]]
    try:
        curriculum = CurriculumConfig(
            stages=tuple(tuple((str(lv), float(w)) for lv, w in stage) for stage in stages),
            stage_iterations=(
                tuple(cur["stage_iterations"]) if cur.get("stage_iterations") else None
            ),
            advance_at=cur.get("advance_at"),
            window=int(cur.get("window", 64)),
        )
    except (TypeError, ValueError) as e:
        raise ConfigError(f"config.curriculum: {e}") from e

    mesh = _mesh(cd.get("mesh", (1, 1, 1)), num_devices)
    return RunConfig(
        seed=int(cd.get("seed", 0)),
        model=model,
        mesh=mesh,
        env=env,
        rollout=rollout,
        curriculum=curriculum,
        sft=sft,
        budget=budget,
        rl=rl,
        envrl=envrl,
        checkpoint=ckpt,
        eval_every=int(cd.get("eval_every", 0)),
        plugins=plugins,
    )
