"""A run's parts, assembled from its config, without a Trainer.

    build(config, workdir) -> Parts: the held-out tasks, the actor pool, the mesh, the tokenizer
      (checked across hosts), the chat template, the policy, the sampler and the rollout worker
    rl_learner / sft_learner: the learners of the two phases; critic: the value model
    reference_copy: the frozen KL reference; sync_sampler: the sampler's copy of the policy
    rl_policy: the policy as RL trains it (with LoRA adapters when ``model.lora.rank`` > 0)

The trainer (``run/trainer.py``) builds its parts here, then adds what only training needs (the
learners, the RL update, checkpoints, TensorBoard). ``launch.eval`` builds the same parts to play
a checkpoint's policy, ``launch.plan`` (``experiments/plan.py``) and the benchmarks take the
learners and model shapes from here, so each builds exactly what a run builds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import pathlib
from collections.abc import Callable, Iterator
from typing import Any, Literal

import jax
import jax.numpy as jnp
import optax
from absl import logging
from flax import nnx
from jax.sharding import Mesh

from agentrl_jax import sharding, timing
from agentrl_jax.envs import registry as env_registry
from agentrl_jax.envs.actors import ActorPool
from agentrl_jax.envs.base import Task
from agentrl_jax.models import CausalLM, ModelConfig, ValueModel, preset, registry
from agentrl_jax.models.tokenizer import build_tokenizer, load_tokenizer
from agentrl_jax.rl import sft_data
from agentrl_jax.rl.learner import Learner
from agentrl_jax.rollout import tasks as tasks_lib
from agentrl_jax.rollout import tool_calls
from agentrl_jax.rollout.chat import get_template
from agentrl_jax.rollout.chat_template import ChatTemplate
from agentrl_jax.rollout.play import Episode, play_wave
from agentrl_jax.rollout.rollout import RolloutWorker, render_observation
from agentrl_jax.rollout.tool_calls import ToolCalling
from agentrl_jax.rollout.trajectory import Trajectory
from agentrl_jax.run import logs, multihost, workdir_config
from agentrl_jax.run.checkpoint import Checkpointer
from agentrl_jax.run.config import ConfigError, RunConfig, check_expert_axis
from agentrl_jax.sampling import Sampler, SamplingParams, StopConfig
from agentrl_jax.sharding import create_sharded_model, make_mesh

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


# ---------------------------------------------------------------------------- learners


def rl_learner(config: RunConfig, policy, critic, mesh=None, num_iterations: int = 1) -> Learner:
    """The RL Learner of a run: Adam for actor and critic, the losses and weights of the run's
    RL spec (``config.rl_spec``, resolved here once; the Learner keeps it as ``learner.spec``,
    which ``RLUpdate`` and the trainer's reference read).

    ``num_iterations``: the run's RL iterations, the ENVRL weights' horizon when
    ``envrl.horizon`` is 0 (the schedule then steps by RL-phase progress, see ``RLUpdate``).
    """
    spec = config.rl_spec(num_iterations)
    max_norm = spec.max_grad_norm
    actor_tx = optax.chain(optax.clip_by_global_norm(max_norm), optax.adam(spec.actor_lr))
    critic_tx = optax.chain(optax.clip_by_global_norm(max_norm), optax.adam(spec.critic_lr))
    return Learner(
        policy,
        critic,
        actor_tx,
        critic_tx if critic is not None else None,
        spec=spec,
        logits_chunk=config.model.logits_chunk,
        microbatch_size=spec.microbatch_size or None,
        mesh=mesh,
        dropout_seed=config.seed,
    )


def rl_policy(config: RunConfig, policy: CausalLM) -> CausalLM:
    """The policy as the RL phase trains it: ``policy`` itself, or with ``model.lora.rank`` > 0
    ``policy`` with fresh LoRA adapters (``lora.apply_lora``: A drawn from the run's seed, B at
    zero, so it computes what ``policy`` does; the base arrays are shared, or cast to
    ``model.lora.base_dtype`` when it is not theirs).

    The RL learner (``rl_learner``), the RL state (``Learner.init``) and its restore target
    (``state.restore_latest``) are built from it; SFT trains ``policy`` in full.
    """
    from agentrl_jax.models import lora

    section = config.model.lora
    if not section.enabled:
        return policy
    return lora.apply_lora(
        policy, section.lora_config(), seed=config.seed, base_dtype=DTYPES[section.base_dtype]
    )


def model_config(config: RunConfig, vocab_size: int | None = None) -> ModelConfig:
    """The policy's shape and numerics, without any weights.

    From the checkpoint's config.json (the only file read) when ``model.checkpoint`` is set, else
    ``model.preset`` with ``model.overrides``; ``vocab_size`` (a fresh model's tokenizer) goes
    under the overrides.
    """
    cfg = config.model
    numerics = {
        "dtype": DTYPES[cfg.dtype],
        "remat": cfg.remat,
        "scan_layers": cfg.scan_layers,
        "moe_impl": cfg.moe_impl,
    }
    if cfg.checkpoint:
        from agentrl_jax.models.hf_checkpoint import load_config

        return load_config(cfg.checkpoint, **numerics)
    vocab = {} if vocab_size is None else {"vocab_size": vocab_size}
    return preset(cfg.preset, **{**numerics, **vocab, **dict(cfg.overrides)})


def rl_sampling(config: RunConfig) -> SamplingParams:
    """How RL rollouts sample (the learner's log-probs are of the same ``logits / T``)."""
    rl = config.rl
    return SamplingParams(temperature=rl.temperature, top_k=rl.top_k, top_p=rl.top_p)


def sft_learner(config: RunConfig, policy, total_steps: int, mesh=None) -> Learner:
    """Adam, linear warmup then cosine decay to ``end_lr_fraction`` over ``total_steps``."""
    sft = config.sft
    warmup = max(sft.warmup_steps, 1)
    schedule = optax.warmup_cosine_decay_schedule(
        0.0,
        sft.learning_rate,
        warmup_steps=warmup,
        decay_steps=max(total_steps, warmup + 1),
        end_value=sft.learning_rate * sft.end_lr_fraction,
    )
    tx = optax.chain(optax.clip_by_global_norm(config.rl.max_grad_norm), optax.adam(schedule))
    return Learner(
        policy,
        None,
        tx,
        logits_chunk=config.model.logits_chunk,
        microbatch_size=sft.microbatch_size or None,
        mesh=mesh,
    )


def sft_dataset(config: RunConfig, demos: list[Trajectory], pad_id: int) -> sft_data.SftDataset:
    """The SFT batches of the won demonstrations ``demos`` (length buckets up to the context)."""
    examples, stats = sft_data.demonstration_examples(
        demos, config.rollout.context_mode, pad_id=pad_id, max_len=config.rollout.max_seq_len
    )
    logging.info("SFT data: %s", stats)
    max_len = config.rollout.max_seq_len
    buckets = tuple(b for b in sft_data.DEFAULT_BUCKETS if b < max_len)
    return sft_data.SftDataset(
        examples,
        sft_data.SftDataConfig(
            batch_size=config.sft.batch_size,
            buckets=(*buckets, max_len),
            num_epochs=config.sft.epochs,
            seed=config.seed,
            group_by_length=config.sft.group_by_length,
        ),
        pad_id,
    )


# ---------------------------------------------------------------------------- the policy's copies


SamplerWeights = Literal["local", "moved", "merged", "cast", "copy", "borrowed"]


def sampler_weights(
    *, multihost: bool, rollout: bool, lora: bool, casts: bool, copy: bool
) -> SamplerWeights:
    """Where the sampler's weights come from, decided here once: ``sync_sampler`` makes them so
    and ``experiments/plan.sampler_copy`` plans them so.

    Args:
      multihost: the sampler plays on this process's own mesh (``multihost.local_mesh``).
      rollout: one host with ``config.rollout_mesh``: the sampler has devices of its own.
      lora: the policy's state holds LoRA adapters (merged into its base to sample).
      casts: the parameters are stored in another dtype than the compute one.
      copy: the sampler must own its weights (asynchronous RL samples while the update donates
        the train state's).

    Returns:
      ``"local"`` (a compute-dtype copy split over the process's devices), ``"moved"`` (a copy
      moved to the rollout's devices), ``"merged"`` (LoRA's merged weights), ``"cast"`` (a
      compute-dtype copy in the train state's layout), ``"copy"`` (a copy of the train state's
      arrays) or ``"borrowed"`` (the train state's own arrays, no copy). Every kind but the
      last is a copy the sampler owns.
    """
    if multihost:
        return "local"
    if rollout:
        return "moved"
    if lora:
        return "merged"
    if casts:
        return "cast"
    return "copy" if copy else "borrowed"


def sync_sampler(
    sampler: Sampler,
    policy: Any,
    dtype: Any,
    local: Mesh | None = None,
    graphdef: nnx.GraphDef | None = None,
    copy: bool = False,
    rollout: Mesh | None = None,
) -> None:
    """Gives ``sampler`` the policy's parameters ``policy`` (the train state's) in ``dtype``.

    The sampler's previous copy is released first (its arrays deleted when it owns them), so
    two copies never coexist. Then, as ``sampler_weights`` decides:

    - a LoRA policy (``policy`` holds ``nnx.LoRAParam`` adapters; ``graphdef`` is its graph,
      the learner's ``policy_graphdef``): the merged weights ``W + A B alpha / r`` in ``dtype``
      (``lora.merge``: one program, summed in f32), a plain model's state owned by the sampler
      (on a mesh of its own, as below: then copied there, and the merged copy dropped);

    - multi-host (``local``: this process's mesh): a copy in ``dtype`` split over the local
      devices (``multihost.local_copy``), owned by the sampler;
    - one host with ``config.rollout_mesh`` (``rollout``: the rollout's own devices): a copy in
      ``dtype`` moved there device to device (``sharding.moved_copy``), owned by the sampler;
    - one host, parameters stored in another dtype than the compute one (f32 under bf16
      compute): a ``dtype`` copy in the train state's layout, owned by the sampler: half the
      bytes a decode step reads, and no per-turn cast of every weight;
    - one host, parameters already in ``dtype`` (f32 on CPU): the train state's own arrays,
      borrowed, no copy; with ``copy``, a copy owned by the sampler (asynchronous RL samples
      while the update donates the train state's arrays).
    """
    from agentrl_jax.models import lora

    sampler.release()
    adapters = lora.has_adapters(policy)
    kind = sampler_weights(
        multihost=local is not None,
        rollout=rollout is not None,
        lora=adapters,
        casts=sharding.casts(policy, dtype),
        copy=copy,
    )
    if adapters:
        if graphdef is None:
            raise ValueError("sync_sampler: a LoRA policy's state needs its graphdef to merge")
        policy = nnx.state(lora.merge(nnx.merge(graphdef, policy), dtype), nnx.Param)
    if kind == "borrowed":
        sampler.set_state(policy)
        return
    made = {
        "local": lambda: multihost.local_copy(policy, local, dtype),
        "moved": lambda: sharding.moved_copy(policy, rollout, dtype),
        "merged": lambda: policy,
        "cast": lambda: sharding.cast_copy(policy, dtype),
        "copy": lambda: jax.tree.map(jnp.copy, policy),
    }
    sampler.set_state(made[kind](), owned=True)


@contextlib.contextmanager
def policy_in_sampler(sampler: Sampler, sync: Callable[[], None]) -> Iterator[None]:
    """The policy in ``sampler`` for the ``with`` block (a rollout, an evaluation): ``sync()``
    gives it (``sync_sampler`` with the caller's policy) on entry, and it is released on exit,
    also when the block raises (timed as ``sync``), so the sampler's own copy of the policy is
    never held past the block."""
    sync()
    try:
        yield
    finally:
        with timing.phase("sync"):
            sampler.release()


def reference_copy(policy: Any, dtype: str) -> Any:
    """The frozen KL reference made from the policy's parameters (arrays, or abstract
    ``jax.ShapeDtypeStruct``s with their shardings): floating arrays in ``dtype`` ("float32": a
    copy; "bfloat16": half the bytes, the KL then measured against the policy rounded to bf16),
    in the same layout."""
    target = jnp.dtype(dtype)

    def cast(x):
        to = target if jnp.issubdtype(x.dtype, jnp.floating) else x.dtype
        if isinstance(x, jax.ShapeDtypeStruct):
            return jax.ShapeDtypeStruct(x.shape, to, sharding=x.sharding)
        return jnp.copy(x) if x.dtype == to else x.astype(to)

    return jax.tree.map(cast, policy)


def kl_reference(learner: Learner, policy: Any, frozen: Any = None) -> tuple[Any, bool]:
    """The KL reference a run scores against, decided here once (the trainer's update and its
    frozen copy, and ``launch.plan``). Returns ``(reference, is_frozen_copy)``:

    - ``(None, False)``: the spec's KL needs no reference (its weight is 0);
    - LoRA: ``(learner.base_state(policy), False)``, the policy's own base arrays (its adapters
      started at zero): no copy, nothing written; read again before each update, whose step
      donates the state's buffers;
    - otherwise the policy as RL began, frozen: ``(frozen, True)`` when the caller has it, else
      ``(reference_copy(policy, kl.reference_dtype), True)``, a new copy, which the caller keeps
      (the trainer writes it once beside the checkpoints).

    ``policy``: the train state's policy (arrays, or abstract ones for the memory plan).
    """
    kl = learner.spec.kl
    if not kl.needs_reference:
        return None, False
    if learner.lora:
        return learner.base_state(policy), False
    if frozen is None:
        frozen = reference_copy(policy, kl.reference_dtype)
    return frozen, True


# ---------------------------------------------------------------------------- tasks


def eval_tasks(config: RunConfig) -> dict[str, list[Task]]:
    """The held-out tasks per evaluation level (``level``, or ``level@split``; default split: the
    family's tuning split, as its registry entry names it)."""
    env = config.env
    split = tasks_lib.eval_split(env.name)
    return {
        level: tasks_lib.make_tasks(
            env.name, *tasks_lib.parse_level(level, split), env.num_eval_tasks, dict(env.kwargs)
        )
        for level in env.eval_levels
    }


def train_tasks(config: RunConfig) -> dict[str, list[Task]]:
    """Train tasks per curriculum level (generated, or found in the cache)."""
    env = config.env
    return {
        level: tasks_lib.make_tasks(env.name, level, "train", env.num_train_tasks, dict(env.kwargs))
        for level in config.curriculum.levels
    }


def report_levels(config: RunConfig) -> list[str]:
    """The before/after table's sets, ``level@split`` (none when ``num_report_tasks`` is 0)."""
    env = config.env
    return tasks_lib.report_levels(
        env.name, env.report_levels, env.eval_levels, env.num_report_tasks
    )


def report_tasks(config: RunConfig) -> dict[str, list[Task]]:
    """The report split's tasks per ``report_levels`` entry."""
    env = config.env
    return {
        key: tasks_lib.make_tasks(
            env.name, *tasks_lib.parse_level(key, ""), env.num_report_tasks, dict(env.kwargs)
        )
        for key in report_levels(config)
    }


# ---------------------------------------------------------------------------- tokenizer


class _ExpertTexts:
    """``play_wave``'s actor for the tokenizer's corpus: the env's expert plays, and each
    observation (as the agent reads it, with the admissible commands) and command is kept."""

    def __init__(self, texts: list[str]):
        self.texts = texts

    def start(self, ep: Episode) -> None:
        pass

    def act(self, turn: int, episodes: list[Episode]) -> list[str | None]:
        actions: list[str | None] = []
        for ep in episodes:
            if not ep.live:
                actions.append(None)
                continue
            self.texts.append(render_observation(ep.obs, first=turn == 0, show_admissible=True))
            action = ep.info.get("expert_action") or None
            if action:
                self.texts.append(action)
            else:
                ep.live = False  # no expert here: the episode ends
            actions.append(action)
        return actions

    def observe(self, ep: Episode, result) -> None:
        pass


def expert_texts(pool: ActorPool, tasks: list[Task], rollout) -> list[str]:
    """The tokenizer's corpus: the system prompt, then the observations (as the agent reads
    them, with the admissible commands) and commands of the expert's episodes on ``tasks``."""
    texts = [rollout.system_prompt]
    actor = _ExpertTexts(texts)
    with logs.episode_bar("tokenizer corpus", len(tasks)) as progress:
        for start in range(0, len(tasks), pool.capacity):
            batch = tasks[start : start + pool.capacity]
            play_wave(pool, [Episode(task=t) for t in batch], rollout.max_turns, actor)
            progress(len(batch))
    return texts


def corpus_tasks(config: RunConfig, train: dict[str, list[Task]]) -> list[Task]:
    """The train tasks the built tokenizer learns from: each level's first
    ``model.tokenizer_tasks`` (all of them when 0)."""
    limit = config.model.tokenizer_tasks or None
    return [t for ts in train.values() for t in ts[:limit]]


def tokenizer(config: RunConfig, workdir: str, corpus: Callable[[], list[str]]):
    """The run's tokenizer: ``model.tokenizer``'s or the checkpoint's, else the run's own in
    ``workdir/tokenizer``, built on first use from ``corpus()`` (``model.tokenizer_vocab`` ids).

    Multi-host: process 0 builds it (or finds it) and sends its files to every process, which
    saves them (atomically: the workdir may be shared) and loads them.
    """
    cfg = config.model
    path = os.path.join(workdir, "tokenizer")
    if cfg.tokenizer:
        return load_tokenizer(cfg.tokenizer)
    if cfg.checkpoint:
        return load_tokenizer(cfg.checkpoint)

    def make():
        texts = corpus()
        logging.info("building the tokenizer from %d texts of the train tasks", len(texts))
        return build_tokenizer(texts, cfg.tokenizer_vocab, path)

    if jax.process_count() == 1:
        if os.path.isfile(os.path.join(path, "tokenizer.json")):
            return load_tokenizer(path)
        return make()

    def files() -> dict[str, bytes]:
        if not os.path.isfile(os.path.join(path, "tokenizer.json")):
            make()
        return {f.name: f.read_bytes() for f in sorted(pathlib.Path(path).iterdir()) if f.is_file()}

    saved = multihost.broadcast_object(files)
    if not multihost.is_primary():
        os.makedirs(path, exist_ok=True)
        for name, data in saved.items():
            tmp = os.path.join(path, f".{name}.{jax.process_index()}.tmp")
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, os.path.join(path, name))
    return load_tokenizer(path)


def fingerprint(
    config: RunConfig, eval_tasks: dict[str, list[Task]], train_tasks: dict[str, list[Task]]
) -> dict[str, dict[str, str]]:
    """What every process of a run must agree on: its resolved config, the code, the tasks."""
    lists = {f"eval {level}": tasks for level, tasks in eval_tasks.items()}
    lists.update({f"train {level}": tasks for level, tasks in train_tasks.items()})
    return {
        "config": {k: repr(v) for k, v in workdir_config.flat_fields(config).items()},
        "code": multihost.code_fingerprint(),
        "tasks": multihost.task_fingerprint(lists),
    }


def tokenizer_fingerprint(tok) -> dict[str, str]:
    """What every process must agree on once the tokenizer is loaded."""
    return {
        "vocabulary": multihost.digest(sorted(tok.get_vocab().items())),
        "special tokens": multihost.digest(tok.all_special_tokens),
    }


def tool_calling(config: RunConfig) -> ToolCalling | None:
    """The run's tool calling: the function tools the env offers (``Env.tool_schemas`` of
    ``env.name`` with ``env.kwargs``) in ``rollout.tool_format``, or the policy's model family's
    format (``Family.tool_format``); None when the env's actions are text.

    Raises:
      ConfigError: the env offers tools but the template is a fixed layout, or decoding is
        constrained, or no format is named and the family has none, or the name is unknown.
    """
    schemas = env_registry.tool_schemas(config.env.name, dict(config.env.kwargs))
    if not schemas:
        return None
    where = f"config.env.name={config.env.name!r} with config.env.kwargs={dict(config.env.kwargs)}"
    if config.model.template != "checkpoint":
        raise ConfigError(
            f"{where} offers function tools, which the checkpoint's own chat template renders; "
            f"config.model.template is {config.model.template!r}: expected 'checkpoint' (a "
            "config.model.checkpoint or config.model.tokenizer whose template renders tools)"
        )
    if config.rollout.constrain_actions:
        raise ConfigError(
            f"{where} offers function tools: the policy writes tool calls, not admissible "
            "commands; expected config.rollout.constrain_actions=False"
        )
    name = config.rollout.tool_format
    if not name:
        family = model_config(config).family
        name = registry.family(family).tool_format
        if not name:
            raise ConfigError(
                f"{where} offers function tools, but the model family {family!r} names no "
                f"tool-call format: set config.rollout.tool_format to one of "
                f"{sorted(tool_calls.FORMATS)} (or register one: tool_calls.register_format)"
            )
    try:
        return tool_calls.ToolCalling(schemas, tool_calls.get_format(name))
    except ValueError as e:
        raise ConfigError(f"config.rollout.tool_format: {e}") from None


def chat_template(config: RunConfig, tok) -> ChatTemplate:
    """``model.template``; a checkpoint's own is cut into pieces and checked against the
    tokenizer here, before any model is built (rollout/chat_checkpoint.py): prefix-stable, or
    under ``model.template_mode='append_only'`` its first turn, stop token and piece boundaries.
    With an env that offers tools (``tool_calling``), derived with them and checked on tool turns
    (in either mode)."""
    template = get_template(
        config.model.template,
        tok,
        directory=config.model.tokenizer or config.model.checkpoint,
        system_prompt=config.rollout.system_prompt,
        # Constrained decoding writes admissible commands only: never a think block, never
        # whitespace around an action.
        actions_think=not config.rollout.constrain_actions,
        tools=tool_calling(config),
        append_only=config.model.template_mode == "append_only",
    )
    logging.info(
        "chat template: %s%s (stop token %r)%s",
        template.name,
        f" from {template.source}" if template.source else "",
        template.stop_token,
        ", append-only: each turn kept as fed" if template.append_only else "",
    )
    return template


# ---------------------------------------------------------------------------- models


def device_mesh(config: RunConfig) -> Mesh | None:
    """The run's (data, fsdp, tp) mesh, or (data, fsdp, tp, expert) given four sizes (-1: all
    devices the others leave); None for a single device.

    With ``config.rollout_mesh`` the learner's mesh is the first ``prod(config.mesh)`` devices,
    or with a -1 all the rollout's leave (a mesh even of one device: the rollout's are others).
    An expert size left -1 by the config (validated without a device count) is checked here
    against the model, once resolved.
    """
    if config.rollout_mesh:
        mesh = make_mesh(config.mesh, jax.devices()[: _learner_device_count(config)])
    else:
        mesh = make_mesh(config.mesh) if math.prod(config.mesh) != 1 else None
    if mesh is not None and -1 in config.mesh:
        check_expert_axis(tuple(mesh.devices.shape), config.model)
    return mesh


def _learner_device_count(config: RunConfig, num_devices: int | None = None) -> int:
    """The learner's devices beside ``config.rollout_mesh``'s: ``prod(config.mesh)``, or with a
    -1 left in it (a config validated without a device count) all that the rollout's leave."""
    if -1 not in config.mesh:
        return math.prod(config.mesh)
    num_devices = jax.device_count() if num_devices is None else num_devices
    return num_devices - math.prod(config.rollout_mesh)


def rollout_device_mesh(config: RunConfig, devices=None) -> Mesh | None:
    """``config.rollout_mesh``'s mesh: the devices after the learner's among ``devices``
    (default ``jax.devices()``); None: rollouts run on the learner's mesh.

    Raises:
      ConfigError: the two meshes need more devices than there are, or the run is multi-host
        (each process already samples on its own devices there).
    """
    if not config.rollout_mesh:
        return None
    devices = list(jax.devices() if devices is None else devices)
    first, size = _learner_device_count(config, len(devices)), math.prod(config.rollout_mesh)
    if jax.process_count() > 1:
        raise ConfigError(
            f"config.rollout_mesh={config.rollout_mesh} is for one host; a multi-host run samples "
            "on each process's own devices already: leave it empty"
        )
    if first + size > len(devices):
        raise ConfigError(
            f"config.mesh={config.mesh} and config.rollout_mesh={config.rollout_mesh} need "
            f"{first} + {size} devices; this run has {len(devices)}"
        )
    return make_mesh(config.rollout_mesh, devices[first : first + size])


def policy(config: RunConfig, vocab_size: int, mesh: Mesh | None = None) -> CausalLM:
    """The policy, each parameter created in its layout on ``mesh``: the checkpoint's weights,
    or a fresh model of ``vocab_size`` ids (exactly the tokenizer's: it can never sample an id
    the tokenizer cannot decode) initialised from the run's seed."""
    cfg = config.model
    dtype = DTYPES[cfg.dtype]
    if cfg.checkpoint:
        from agentrl_jax.models.hf_checkpoint import load_hf_model

        return load_hf_model(
            cfg.checkpoint,
            mesh=mesh,
            dtype=dtype,
            remat=cfg.remat,
            scan_layers=cfg.scan_layers,
            moe_impl=cfg.moe_impl,
        )
    model_cfg = model_config(config, vocab_size=vocab_size)
    # One compiled initialiser, each parameter created in its layout on the mesh.
    seed = config.seed
    model_cls = registry.family(model_cfg).policy
    return create_sharded_model(lambda: model_cls(model_cfg, rngs=nnx.Rngs(seed)), mesh)


def critic(config: RunConfig, policy: CausalLM) -> ValueModel | None:
    """The value model, its trunk a copy of ``policy``'s (None when the estimator needs none)."""
    if not config.needs_critic:
        return None
    critic_cls = registry.family(policy.cfg).critic
    return critic_cls.from_policy(policy, rngs=nnx.Rngs(config.seed + 1))


def checkpointer(config: RunConfig, workdir: str) -> Checkpointer:
    """The run's checkpoints, ``workdir/checkpoints`` (the best by ``eval/success_rate``)."""
    return Checkpointer(
        os.path.join(workdir, "checkpoints"),
        keep_last=config.checkpoint.keep_last,
        keep_best=config.checkpoint.keep_best,
        best_metric="eval/success_rate",
    )


# ---------------------------------------------------------------------------- the whole


@dataclasses.dataclass
class Parts:
    """What playing a run's policy takes, built once (``build``).

    Attributes:
      config, workdir: the run's.
      eval_tasks: the held-out tasks per evaluation level (``eval_tasks``).
      pool: the actor pool of the run's env family.
      mesh: the learner's mesh (None: one device).
      multihost: whether the run has more than one process.
      tokenizer, template: the tokenizer and the chat template.
      policy: the policy model (fresh, or the checkpoint's weights).
      local_mesh: multi-host: this process's mesh, where it samples (else None).
      rollout_mesh: one host with ``config.rollout_mesh``: the rollout's own devices, where
        it samples (else None).
      sampler, worker: the sampler (holding no weights until ``sync_sampler``) and the rollout
        worker (a ``ShardedRolloutWorker`` multi-host).
    """

    config: RunConfig
    workdir: str
    eval_tasks: dict[str, list[Task]]
    pool: ActorPool
    mesh: Mesh | None
    multihost: bool
    tokenizer: Any
    template: ChatTemplate
    policy: CausalLM
    local_mesh: Mesh | None
    rollout_mesh: Mesh | None
    sampler: Sampler
    worker: RolloutWorker

    @functools.cached_property
    def train_tasks(self) -> dict[str, list[Task]]:
        """Train tasks per curriculum level (generated or found in the cache on first use)."""
        return train_tasks(self.config)

    @functools.cached_property
    def report_tasks(self) -> dict[str, list[Task]]:
        """The report split's tasks per ``report_levels`` entry (generated on first use)."""
        return report_tasks(self.config)

    def close(self) -> None:
        self.pool.close()


def build(config: RunConfig, workdir: str) -> Parts:
    """Builds a run's parts, in the order a run needs them.

    The held-out tasks, the actor pool and the mesh first; multi-host, the processes then check
    that they agree on config, code and tasks before any other collective (hosts that parsed
    another config, run other code or list other tasks would otherwise hang in a collective or
    silently train apart), and on the tokenizer once it is loaded. Then the chat template, the
    policy, the sampler and the rollout worker.

    Raises:
      multihost.DisagreementError: the processes disagree.
    """
    evals = eval_tasks(config)
    env = config.env
    pool = ActorPool(
        env.name,
        dict(env.kwargs),
        num_workers=env.num_workers,
        envs_per_worker=env.envs_per_worker,
        concurrent_envs=env.concurrent_steps,
    )
    try:
        return _build(config, workdir, evals, pool)
    except BaseException:
        pool.close()
        raise


def _build(config: RunConfig, workdir: str, evals, pool: ActorPool) -> Parts:
    mesh = device_mesh(config)
    is_multihost = jax.process_count() > 1
    rollout_mesh = rollout_device_mesh(config)  # checked before anything is built
    train = functools.cache(lambda: train_tasks(config))  # if a step below needs them
    if is_multihost:
        multihost.check_agreement(fingerprint(config, evals, train()))
    tok = tokenizer(
        config,
        workdir,
        lambda: expert_texts(pool, corpus_tasks(config, train()), config.rollout),
    )
    if is_multihost:
        multihost.check_agreement({"tokenizer": tokenizer_fingerprint(tok)})
    template = chat_template(config, tok)
    model = policy(config, len(tok), mesh)
    # Multi-host: each process samples on its own devices, from a local copy of the policy.
    local_mesh = multihost.local_mesh(model.cfg) if is_multihost else None
    # Multi-host: this process's devices; one host with config.rollout_mesh: devices of its own.
    sampler_mesh = next((m for m in (local_mesh, rollout_mesh) if m is not None), mesh)
    sampler = Sampler(
        model,
        stop=StopConfig(eos_ids=(template.stop_id(tok),)),
        pad_id=tok.pad_token_id,
        mesh=sampler_mesh,
    )
    worker_cls = multihost.ShardedRolloutWorker if is_multihost else RolloutWorker
    parts = Parts(
        config=config,
        workdir=workdir,
        eval_tasks=evals,
        pool=pool,
        mesh=mesh,
        multihost=is_multihost,
        tokenizer=tok,
        template=template,
        policy=model,
        local_mesh=local_mesh,
        rollout_mesh=rollout_mesh,
        sampler=sampler,
        worker=worker_cls(pool, sampler, tok, template, config.rollout, tools=tool_calling(config)),
    )
    if train.cache_info().currsize:
        parts.train_tasks = train()  # the cached property's value, made once
    return parts
