"""The run configuration: ml_collections ConfigDicts from configs/*.py, frozen and validated here.

``configs/<name>.py`` defines ``get_config(arg)`` returning a ConfigDict; absl flags choose and
override it (``--config=configs/x.py --config.rl.algo=gagpo``). :func:`from_config_dict` turns it
into frozen dataclasses and checks every value before any compute starts, so a wrong value fails
with an error that names the field and lists the valid choices. The sections are defined by the
stage that owns them (``config_model.py``, ``config_env.py``, ``config_learning.py``, the checks
they share in ``config_checks.py``); this module holds ``RunConfig``, the checks across sections,
and the loading.
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
from agentrl_jax.models.config import PRESETS
from agentrl_jax.rl.spec import RLSpec
from agentrl_jax.rollout.curriculum import CurriculumConfig
from agentrl_jax.rollout.rollout import RolloutConfig
from agentrl_jax.run import budget as budget_lib
from agentrl_jax.run import config_checks as checks
from agentrl_jax.run.config_checks import ConfigError
from agentrl_jax.run.config_env import EnvSection, check_levels
from agentrl_jax.run.config_learning import BudgetSection, EnvrlSection, RLSection, SFTSection
from agentrl_jax.run.config_model import ModelSection

# ------------------------------------------------------------------- the sections
#
# Each stage's sections live beside their checks: the model's (run/config_model.py), the env's
# (run/config_env.py), the learner's (run/config_learning.py); the checkpoints' is below. Those
# dataclasses are the only definition of every default: ``base_config()``, which each
# configs/*.py starts from, is generated from them, and a key a ConfigDict leaves out takes the
# same value. Each section checks its own fields in ``__post_init__``; ``RunConfig`` checks the
# combinations across sections.


@dataclasses.dataclass(frozen=True)
class CheckpointSection:
    keep_last: int = 2
    keep_best: int = 1
    every: int = 5  # RL iterations between checkpoints (and always after the last one)

    def __post_init__(self):
        checks.integer("config.checkpoint.keep_last", self.keep_last, 1)
        checks.integer("config.checkpoint.keep_best", self.keep_best, 0)
        checks.integer("config.checkpoint.every", self.every, 1)


@dataclasses.dataclass(frozen=True)
class WandbSection:
    """``config.logging.wandb``: a Weights & Biases writer beside TensorBoard (run/writers.py)."""

    enabled: bool = False
    project: str = "agentrl_jax"
    entity: str = ""  # "" for the account's default
    name: str = ""  # the run's display name; "" for the workdir's name
    group: str = ""
    tags: tuple[str, ...] = ()
    # "offline" (no network; `wandb sync <workdir>/wandb/offline-run-*` uploads it later),
    # "online" or "disabled"; WANDB_MODE in the environment overrides it.
    mode: str = "offline"
    run_id: str = ""  # "" for one made once per workdir (a resumed run continues it)

    def __post_init__(self):
        if not isinstance(self.enabled, bool):
            raise ConfigError(
                f"config.logging.wandb.enabled is {self.enabled!r}; expected True or False"
            )
        modes = ("offline", "online", "disabled")
        if self.mode not in modes:
            raise ConfigError(
                f"config.logging.wandb.mode is {self.mode!r}; expected one of {', '.join(modes)}"
            )
        for name in ("project", "entity", "name", "group", "run_id"):
            if not isinstance(getattr(self, name), str):
                raise ConfigError(f"config.logging.wandb.{name} must be a string")
        if not self.project:
            raise ConfigError("config.logging.wandb.project is empty; expected a project name")


@dataclasses.dataclass(frozen=True)
class LoggingSection:
    """``config.logging``: the metric writers beside TensorBoard, which always writes."""

    wandb: WandbSection = checks.section_field(WandbSection)

    def __post_init__(self):
        if not isinstance(self.wandb, WandbSection):  # a dict, or its sorted (key, value) pairs
            wandb = checks.section(WandbSection, dict(self.wandb), "config.logging.wandb")
            object.__setattr__(self, "wandb", wandb)


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
    "logging": LoggingSection,
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig:
    seed: int = 0
    model: ModelSection
    # (data, fsdp, tp), or (data, fsdp, tp, expert) for a model with routed experts (their
    # weights split over the fourth axis, which must divide num_experts); the product is the
    # device count, and one size may be -1: the devices the others leave, e.g. (1, -1, 1)
    # shards parameters over every device (FSDP).
    mesh: tuple[int, ...] = (1, 1, 1)
    # Disaggregated rollouts: (data, fsdp, tp), or (data, fsdp, tp, expert) as in ``mesh``, of a
    # mesh of devices of their own, after the learner's (one host); the sampler's copy of the
    # policy moves there device to device after each update, laid out by the same rules (routed
    # experts split over its expert axis). Empty: rollouts run on the learner's mesh.
    rollout_mesh: tuple[int, ...] = ()
    env: EnvSection
    rollout: RolloutConfig
    curriculum: CurriculumConfig
    sft: SFTSection
    budget: BudgetSection
    rl: RLSection
    envrl: EnvrlSection
    checkpoint: CheckpointSection
    logging: LoggingSection = dataclasses.field(default_factory=LoggingSection)
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
        checks.integer("config.seed", self.seed, 0)
        checks.integer("config.eval_every", self.eval_every, 0)
        checks.number(
            "config.watchdog_s", self.watchdog_s, lambda v: v >= 0, ">= 0 seconds (0: off)"
        )
        _check_mesh_sizes(self.mesh)
        check_expert_axis(self.mesh, self.model)
        _check_rollout_mesh(self.rollout_mesh)
        check_expert_axis(self.rollout_mesh, self.model, "config.rollout_mesh")
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
    for name in ("sft", "budget", "rl", "envrl", "checkpoint", "logging"):
        c[name] = _defaults(SECTIONS[name])
    return c


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
    """``config.rollout_mesh`` is empty, or three positive ints (data, fsdp, tp) or four (data,
    fsdp, tp, expert): no -1, its devices are counted before the learner's mesh resolves one."""
    if sizes and (
        len(sizes) not in (3, 4)
        or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in sizes)
    ):
        raise ConfigError(
            f"config.rollout_mesh is {sizes}; expected () (rollouts on the learner's mesh), "
            "three positive sizes (data, fsdp, tp) or four (data, fsdp, tp, expert)"
        )


def _check_mesh_sizes(mesh) -> None:
    """``config.mesh`` is three ints (data, fsdp, tp) or four (data, fsdp, tp, expert), each
    positive or one of them -1."""
    if (
        len(mesh) not in (3, 4)
        or any(isinstance(x, bool) or not isinstance(x, int) for x in mesh)
        or any(x < 1 and x != -1 for x in mesh)
        or mesh.count(-1) > 1
    ):
        raise ConfigError(
            f"config.mesh is {mesh}; expected three sizes (data, fsdp, tp) or four (data, fsdp, "
            "tp, expert), positive or one -1 (the devices the others leave)"
        )


def _num_experts(model: ModelSection, field: str) -> tuple[int, str]:
    """The routed experts of the run's model and where that number comes from: the checkpoint's
    config.json (the only file read), or the preset with ``config.model.overrides``. ``field``
    (``"config.mesh"``) names the mesh whose expert axis asks, in the error."""
    if model.checkpoint:
        from agentrl_jax.models.hf_checkpoint import load_config

        source = f"config.model.checkpoint={model.checkpoint!r}"
        try:
            return load_config(model.checkpoint).num_experts, source
        except Exception as e:  # A missing or unreadable config.json: the reason, in one line.
            raise ConfigError(
                f"{field} has an expert axis, checked against the model's num_experts, but "
                f"{source} gives none: {type(e).__name__}: {e}"
            ) from e
    source = f"config.model.preset={model.preset!r}"
    overrides = dict(model.overrides)
    if overrides:
        source += f" with config.model.overrides={overrides}"
    try:
        return PRESETS[model.preset].replace(**overrides).num_experts, source
    except (TypeError, ValueError) as e:
        raise ConfigError(f"config.model.overrides={overrides}: {e}") from e


def check_expert_axis(mesh, model: ModelSection, field: str = "config.mesh") -> None:
    """Refuses an ``expert`` size (a mesh's fourth: ``config.mesh``'s or
    ``config.rollout_mesh``'s, named by ``field``) above 1 on a model without routed experts,
    or one that does not divide its ``num_experts``: the rules would replicate the experts over
    that axis instead of splitting them (``sharding.logical_to_spec``), silently. A -1 there is
    checked once resolved (``from_config_dict`` with ``num_devices``, or
    ``build.device_mesh``).

    Raises:
      ConfigError: naming ``field`` and the model's source.
    """
    if len(mesh) < 4 or mesh[3] in (1, -1):
        return
    expert = mesh[3]
    num_experts, source = _num_experts(model, field)
    if not num_experts:
        raise ConfigError(
            f"{field}={mesh} splits routed experts over {expert} devices (its fourth size, "
            f"expert), but the model ({source}) has none; expected an expert size of 1, or three "
            "sizes (data, fsdp, tp)"
        )
    if num_experts % expert:
        raise ConfigError(
            f"{field}={mesh}: its expert size {expert} does not divide the model's "
            f"num_experts={num_experts} ({source}); expected a divisor of {num_experts}"
        )


def _mesh(value, num_devices: int | None) -> tuple[int, ...]:
    """``config.mesh``: (data, fsdp, tp[, expert]) sizes; one may be -1, the devices the others
    leave.

    With ``num_devices`` the product must equal it (a -1 is resolved against it); without, a -1
    stays for ``sharding.make_mesh`` to resolve against the devices it is given.
    """
    mesh = tuple(int(x) for x in value)
    _check_mesh_sizes(mesh)
    if num_devices is None:
        return mesh
    known = math.prod(x for x in mesh if x != -1)
    if -1 in mesh and num_devices % known == 0:
        mesh = tuple(num_devices // known if x == -1 else x for x in mesh)
    if math.prod(mesh) != num_devices:
        needs = f"a multiple of {known}" if -1 in mesh else str(known)
        raise ConfigError(
            f"config.mesh={mesh} needs {needs} devices; this run has {num_devices} (the product "
            "of its sizes must equal the device count)"
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
        name: checks.section(cls, cd.get(name), f"config.{name}") for name, cls in SECTIONS.items()
    }
    cur = dict(cd.get("curriculum") or {})
    try:
        stages = cur.get("stages") or [[(level, 1.0) for level in sections["env"].train_levels]]
        cur["stages"] = tuple(tuple((str(lv), float(w)) for lv, w in stage) for stage in stages)
        iterations = cur.get("stage_iterations")
        cur["stage_iterations"] = tuple(iterations) if iterations else None
    except (TypeError, ValueError) as e:
        raise ConfigError(f"config.curriculum: {e}") from e
    curriculum = checks.section(CurriculumConfig, cur, "config.curriculum")
    try:
        rollout_mesh = tuple(int(x) for x in cd.get("rollout_mesh", top["rollout_mesh"]) or ())
    except (TypeError, ValueError) as e:
        raise ConfigError(
            f"config.rollout_mesh is {cd.get('rollout_mesh')!r}; expected () or three ints (data, "
            "fsdp, tp) or four (data, fsdp, tp, expert)"
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
        raise ConfigError(
            f"config.mesh is {cd.get('mesh')!r}; expected three ints (data, fsdp, tp) or four "
            "(data, fsdp, tp, expert)"
        ) from e
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
