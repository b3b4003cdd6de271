"""The trainer: the only piece that knows every stage of an iteration.

    tasks (curriculum) -> rollouts (actor pool + sampler) -> old/ref log-probs, values
      -> advantages (kernels, by name) -> epochs of minibatch updates (Learner) -> metrics
      -> TensorBoard, checkpoints (orbax), evaluation

A run is: build or load the tokenizer, SFT on expert demonstrations, evaluate, RL iterations,
evaluate. Evaluations on the tuning split (``valid``) drive checkpoint selection; the two at the
ends of the phases also play the report split (``test``), which the before/after table reads.
Everything is deterministic given the seed on CPU: each iteration derives its JAX key and numpy
generator from (seed, iteration), so a resumed run repeats exactly what an
uninterrupted run does. Rerunning with the same workdir resumes from the last checkpoint.

Multi-host (``jax.process_count() > 1``): every process runs this same code; each plays its
share of the episodes with its own actor pool and a process-local copy of the policy, the
episodes are all-gathered so every host-side step sees the single-process data, and each process
feeds its devices' rows of the global batch (``run/multihost.py``). Only process 0 writes
TensorBoard, eval reports and progress bars; checkpoints go through orbax from all processes.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import math
import os
import pathlib
import time
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging
from flax import nnx
from jax.sharding import Mesh

from agentrl_jax import chaos, sharding, timing
from agentrl_jax.envs.actors import ActorPool
from agentrl_jax.envs.base import Task
from agentrl_jax.experiments import evaluate as evaluation
from agentrl_jax.models import ModelConfig, Qwen2ForCausalLM, Qwen2ValueModel, preset
from agentrl_jax.models.tokenizer import build_tokenizer, load_tokenizer
from agentrl_jax.rl import envrl_data, rng_streams, sft_data
from agentrl_jax.rl.learner import Learner
from agentrl_jax.rl.rl_update import RLUpdate
from agentrl_jax.rollout.chat import get_template
from agentrl_jax.rollout.curriculum import Curriculum
from agentrl_jax.rollout.rollout import Episode, RolloutWorker, play_wave, render_observation
from agentrl_jax.rollout.tasks import eval_split, make_tasks, parse_level, report_levels
from agentrl_jax.rollout.trajectory import Trajectory
from agentrl_jax.run import budget as budget_lib
from agentrl_jax.run import multihost, paths, workdir_config
from agentrl_jax.run.checkpoint import Checkpointer
from agentrl_jax.run.config import RunConfig
from agentrl_jax.run.tensorboard import SummaryWriter
from agentrl_jax.run.watchdog import Watchdog
from agentrl_jax.sampling import Sampler, SamplingParams, StopConfig
from agentrl_jax.sharding import create_sharded_model, make_mesh


def rollout_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    """Return, success, length, truncation and infrastructure failures of a batch of episodes.

    Rates and means are over the episodes the pool did not lose, including those a full context
    ended before their first action (no step: ``rollout/truncated``, nothing to train on).
    ``rollout/singleton_groups`` counts the groups that failures left with one episode: a group
    estimator (GRPO, RLOO, GiGPO, GAGPO) gives such an episode advantage 0, so it trains nothing.
    """
    counted = [t for t in trajs if not t.infra_failure]
    good = [t for t in counted if t.steps]
    played = collections.Counter(t.group for t in trajs)
    kept = collections.Counter(t.group for t in good)
    out = {
        "rollout/episodes": float(len(trajs)),
        "rollout/infra_failures": float(len(trajs) - len(counted)),
        "rollout/singleton_groups": float(sum(kept[g] == 1 < played[g] for g in kept)),
    }
    if counted:
        out.update(
            {
                "rollout/return": float(np.mean([t.episode_return for t in counted])),
                "rollout/success_rate": float(np.mean([t.won for t in counted])),
                "rollout/episode_length": float(np.mean([len(t.steps) for t in counted])),
                "rollout/truncated": float(np.mean([t.truncated for t in counted])),
                "rollout/tokens_per_episode": float(np.mean([t.num_tokens for t in counted])),
            }
        )
    return out


def iteration_summary(iteration: int, total: int, metrics: dict[str, float]) -> str:
    """The console's line for one RL iteration (``rl 3/12: success 0.50, ...``)."""

    def get(key: str) -> float:
        return metrics.get(key, float("nan"))

    parts = [
        f"success {get('rollout/success_rate'):.2f}",
        f"return {get('rollout/return'):.3f}",
        f"{get('rollout/episodes'):.0f} episodes "
        f"({get('rollout/infra_failures'):.0f} infra failures, "
        f"{100 * get('rollout/truncated'):.0f}% truncated)",
        f"policy loss {get('losses/policy_loss'):.4f}",
        f"rollout {get('time/rollout_s'):.1f} s, update {get('time/update_s'):.1f} s",
    ]
    if "eval/success_rate" in metrics:
        parts.append(f"eval success {metrics['eval/success_rate']:.2f}")
    return f"rl {iteration}/{total}: " + ", ".join(parts)


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
    for start in range(0, len(tasks), pool.capacity):
        batch = tasks[start : start + pool.capacity]
        play_wave(pool, [Episode(task=t) for t in batch], rollout.max_turns, actor)
    return texts


DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
# The frozen KL reference policy's item beside the numbered checkpoints (written once).
REFERENCE = "reference"


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
    )


def model_config(config: RunConfig, vocab_size: int | None = None) -> ModelConfig:
    """The policy's shape and numerics, without any weights.

    From the checkpoint's config.json (the only file read) when ``model.checkpoint`` is set, else
    ``model.preset`` with ``model.overrides``; ``vocab_size`` (a fresh model's tokenizer) goes
    under the overrides.
    """
    cfg = config.model
    numerics = {"dtype": DTYPES[cfg.dtype], "remat": cfg.remat, "scan_layers": cfg.scan_layers}
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


def casts(tree: Any, dtype: Any) -> bool:
    """Whether any floating array of ``tree`` (arrays or ``jax.ShapeDtypeStruct``) is not in
    ``dtype``: the sampler then needs a copy of its own (``sync_sampler``)."""
    floating = (x.dtype for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating))
    return any(d != np.dtype(dtype) for d in floating)


def sync_sampler(sampler: Sampler, policy: Any, dtype: Any, local: Mesh | None = None) -> None:
    """Gives ``sampler`` the policy's parameters ``policy`` (the train state's) in ``dtype``.

    The sampler's previous copy is released first (its arrays deleted when it owns them), so
    two copies never coexist. Then:

    - multi-host (``local``: this process's mesh): a copy in ``dtype`` split over the local
      devices (``multihost.local_copy``), owned by the sampler;
    - one host, parameters stored in another dtype than the compute one (f32 under bf16
      compute): a ``dtype`` copy in the train state's layout, owned by the sampler: half the
      bytes a decode step reads, and no per-turn cast of every weight;
    - one host, parameters already in ``dtype`` (f32 on CPU): the train state's own arrays,
      borrowed, no copy.
    """
    sampler.release()
    if local is not None:
        sampler.set_state(multihost.local_copy(policy, local, dtype), owned=True)
    elif casts(policy, dtype):
        sampler.set_state(sharding.cast_copy(policy, dtype), owned=True)
    else:
        sampler.set_state(policy)


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


class Trainer:
    """Runs SFT then RL for a RunConfig in ``workdir`` (TensorBoard, checkpoints, reports)."""

    def __init__(self, config: RunConfig, workdir: str):
        self.config = config
        self.workdir = paths.absolute(workdir)  # a URL (gs://...) is passed through unchanged
        if not paths.is_url(self.workdir):
            os.makedirs(self.workdir, exist_ok=True)
        cfg = config
        env_kwargs = dict(cfg.env.kwargs)
        logging.info("workdir: %s", self.workdir)

        # Held-out tasks per evaluation level; train tasks are made when first needed.
        split = eval_split(cfg.env.name)  # the family's tuning split (its registry entry)
        self.eval_tasks = {
            level: make_tasks(
                cfg.env.name, *parse_level(level, split), cfg.env.num_eval_tasks, env_kwargs
            )
            for level in cfg.env.eval_levels
        }
        self.pool = ActorPool(
            cfg.env.name,
            env_kwargs,
            num_workers=cfg.env.num_workers,
            envs_per_worker=cfg.env.envs_per_worker,
        )
        self.mesh = make_mesh(cfg.mesh) if math.prod(cfg.mesh) != 1 else None  # -1: all devices
        self.multihost = jax.process_count() > 1
        if self.multihost:
            # Before any other collective: hosts that parsed another config, run other code or
            # list other tasks would otherwise hang in a collective or silently train apart.
            multihost.check_agreement(self._fingerprint())
        self.tokenizer = self._tokenizer()
        if self.multihost:
            multihost.check_agreement({"tokenizer": self._tokenizer_fingerprint()})
        # A checkpoint's own template is cut into pieces and checked against the tokenizer here,
        # before any model is built (rollout/chat_checkpoint.py).
        self.template = get_template(
            cfg.model.template,
            self.tokenizer,
            directory=cfg.model.tokenizer or cfg.model.checkpoint,
            system_prompt=cfg.rollout.system_prompt,
        )
        logging.info(
            "chat template: %s%s (stop token %r)",
            self.template.name,
            f" from {self.template.source}" if self.template.source else "",
            self.template.stop_token,
        )
        self.policy = self._policy()
        self.critic = (
            Qwen2ValueModel.from_policy(self.policy, rngs=nnx.Rngs(cfg.seed + 1))
            if cfg.needs_critic
            else None
        )
        # Multi-host: each process samples on its own devices, from a local copy of the policy.
        self.local_mesh = multihost.local_mesh(self.policy.cfg) if self.multihost else None
        stop_id = self.template.stop_id(self.tokenizer)
        self.sampler = Sampler(
            self.policy,
            stop=StopConfig(eos_ids=(stop_id,)),
            pad_id=self.tokenizer.pad_token_id,
            mesh=self.local_mesh if self.multihost else self.mesh,
        )
        worker_cls = multihost.ShardedRolloutWorker if self.multihost else RolloutWorker
        self.worker = worker_cls(
            self.pool, self.sampler, self.tokenizer, self.template, cfg.rollout
        )
        self.budget = budget_lib.from_config(cfg.budget)
        self.learner = rl_learner(
            cfg, self.policy, self.critic, self.mesh, num_iterations=self.num_rl_iterations()
        )
        self.rl_update = RLUpdate(
            self.learner.spec,
            self.learner,
            self.tokenizer.pad_token_id,
            envrl_examples=functools.partial(
                envrl_data.examples,
                mode=cfg.rollout.context_mode,
                tokenizer=self.tokenizer,
                template=self.template,
            ),
        )
        # One phase's state at a time: the SFT state exists during SFT only, and the RL state
        # (policy, critic and their moments) is created when SFT has let go of its own.
        self.sft_learner: Learner | None = None
        self.sft_state = None
        self.state = None
        self.checkpointer = Checkpointer(
            os.path.join(self.workdir, "checkpoints"),
            keep_last=cfg.checkpoint.keep_last,
            keep_best=cfg.checkpoint.keep_best,
            best_metric="eval/success_rate",
        )
        # A chaos kill (tests only) waits for the checkpoint writes under way.
        chaos.settle_with(self.checkpointer.write_finished)
        self.writer = SummaryWriter(
            os.path.join(self.workdir, "tensorboard"), enabled=jax.process_index() == 0
        )
        self.curriculum = Curriculum(cfg.curriculum)
        self.ref_policy = None
        self.meta: dict[str, Any] = {"phase": "sft", "rl_iteration": 0, "evals": {}}
        self.watchdog = Watchdog(cfg.watchdog_s)
        # Where each RL iteration's wall time went, this process's iterations in order.
        self.profiles: list[timing.IterationProfile] = []

    # ------------------------------------------------------------------ setup

    @property
    def report_levels(self) -> list[str]:
        """The before/after table's sets, ``level@split`` (none when ``num_report_tasks`` is 0)."""
        env = self.config.env
        return report_levels(env.name, env.report_levels, env.eval_levels, env.num_report_tasks)

    @functools.cached_property
    def report_tasks(self) -> dict[str, list[Task]]:
        """The report split's tasks per ``report_levels`` entry (generated on first use)."""
        env = self.config.env
        return {
            key: make_tasks(env.name, *parse_level(key, ""), env.num_report_tasks, dict(env.kwargs))
            for key in self.report_levels
        }

    @functools.cached_property
    def train_tasks(self) -> dict[str, list]:
        """Train tasks per curriculum level (generated or found in the cache on first use)."""
        cfg = self.config
        return {
            level: make_tasks(
                cfg.env.name, level, "train", cfg.env.num_train_tasks, dict(cfg.env.kwargs)
            )
            for level in cfg.curriculum.levels
        }

    def _fingerprint(self) -> dict[str, dict[str, str]]:
        """What every process of a run must agree on: its resolved config, the code, the tasks."""
        lists = {f"eval {level}": tasks for level, tasks in self.eval_tasks.items()}
        lists.update({f"train {level}": tasks for level, tasks in self.train_tasks.items()})
        return {
            "config": {k: repr(v) for k, v in workdir_config.flat_fields(self.config).items()},
            "code": multihost.code_fingerprint(),
            "tasks": multihost.task_fingerprint(lists),
        }

    def _tokenizer_fingerprint(self) -> dict[str, str]:
        tok = self.tokenizer
        return {
            "vocabulary": multihost.digest(sorted(tok.get_vocab().items())),
            "special tokens": multihost.digest(tok.all_special_tokens),
        }

    def _tokenizer(self):
        cfg = self.config.model
        path = os.path.join(self.workdir, "tokenizer")
        if cfg.tokenizer:
            return load_tokenizer(cfg.tokenizer)
        if cfg.checkpoint:
            return load_tokenizer(cfg.checkpoint)
        if not self.multihost:
            if os.path.isfile(os.path.join(path, "tokenizer.json")):
                return load_tokenizer(path)
            return self._build_tokenizer(path)

        # Multi-host: process 0 builds it (or finds it) and sends its files to every process,
        # which saves them (atomically: the workdir may be shared) and loads them.
        def files() -> dict[str, bytes]:
            if not os.path.isfile(os.path.join(path, "tokenizer.json")):
                self._build_tokenizer(path)
            return {
                f.name: f.read_bytes() for f in sorted(pathlib.Path(path).iterdir()) if f.is_file()
            }

        saved = multihost.broadcast_object(files)
        if not multihost.is_primary():
            os.makedirs(path, exist_ok=True)
            for name, data in saved.items():
                tmp = os.path.join(path, f".{name}.{jax.process_index()}.tmp")
                with open(tmp, "wb") as f:
                    f.write(data)
                os.replace(tmp, os.path.join(path, name))
        return load_tokenizer(path)

    def _build_tokenizer(self, path: str):
        texts = self._expert_texts()
        logging.info("building the tokenizer from %d texts of the train tasks", len(texts))
        return build_tokenizer(texts, self.config.model.tokenizer_vocab, path)

    def _expert_texts(self) -> list[str]:
        """Observation and command text of expert episodes on the train tasks."""
        tasks = [t for level in self.train_tasks.values() for t in level]
        return expert_texts(self.pool, tasks, self.config.rollout)

    def _policy(self) -> Qwen2ForCausalLM:
        cfg = self.config.model
        dtype = DTYPES[cfg.dtype]
        if cfg.checkpoint:
            from agentrl_jax.models.hf_checkpoint import load_hf_model

            return load_hf_model(
                cfg.checkpoint,
                mesh=self.mesh,
                dtype=dtype,
                remat=cfg.remat,
                scan_layers=cfg.scan_layers,
            )
        # A fresh model gets exactly the tokenizer's vocabulary, so it can never sample an id
        # the tokenizer cannot decode.
        model_cfg = model_config(self.config, vocab_size=len(self.tokenizer))
        # One compiled initialiser, each parameter created in its layout on the mesh.
        seed = self.config.seed
        return create_sharded_model(
            lambda: Qwen2ForCausalLM(model_cfg, rngs=nnx.Rngs(seed)), self.mesh
        )

    # ------------------------------------------------------------------ checkpoints

    def _state_tree(self) -> dict[str, Any]:
        return {"train": self.sft_state if self.meta["phase"] == "sft" else self.state}

    def _freeze_reference(self) -> None:
        """The frozen KL reference: the policy as it enters RL, written once (every later
        checkpoint names it instead of holding another copy). None when the spec's KL needs no
        reference (its weight is 0)."""
        kl = self.learner.spec.kl
        if not kl.needs_reference:
            return
        self.ref_policy = reference_copy(self.state.policy, kl.reference_dtype)
        self.checkpointer.save_frozen(REFERENCE, self.ref_policy)

    def save(self, metrics: dict[str, float] | None = None) -> None:
        """Checkpoints everything; checkpoints are numbered in order (``meta['checkpoint']``).

        The metrics logged so far are flushed first: a run killed after this checkpoint resumes
        past them and never writes them again.
        """
        self.writer.flush()
        self.meta["checkpoint"] = int(self.meta.get("checkpoint", -1)) + 1
        with self.watchdog.guard(f"checkpoint {self.meta['checkpoint']}"):
            self._save(metrics)

    def _save(self, metrics: dict[str, float] | None) -> None:
        meta = dict(self.meta, curriculum=self.curriculum.state_dict())
        if self.ref_policy is not None:
            meta["reference"] = REFERENCE
        step = self.meta["checkpoint"]
        self.checkpointer.save(step, self._state_tree(), meta, metrics)
        chaos.maybe_kill("checkpoint", ready=lambda: self.checkpointer.on_disk(step) == "writing")

    def restore(self) -> bool:
        """Restores the newest checkpoint, if any; returns whether it did."""
        step = self.checkpointer.latest_step()
        if step is None:
            return False
        # The JSON meta says what the state tree holds (the SFT phase's state, or the RL state)
        # and which frozen reference goes with it, so the abstract tree can be built first:
        # shapes and shardings only, each array then read straight into its layout. (The SFT
        # optimizer's structure does not depend on the schedule's length.)
        saved = self.checkpointer.read_meta(step)
        if saved["phase"] == "sft":
            learner = sft_learner(self.config, self.policy, 1, self.mesh)
            template = {"train": learner.abstract_state(self.policy)}
        else:
            template = {"train": self.learner.abstract_state(self.policy, self.critic)}
            if saved.get("has_ref"):  # written before the reference was saved once
                template["ref"] = template["train"].policy
        state, meta = self.checkpointer.restore(step, template)
        if saved["phase"] == "sft":
            self.sft_state = state["train"]
        else:
            self.state = state["train"]
            self.ref_policy = state.get("ref")
            if meta.get("reference"):
                self.ref_policy = self.checkpointer.restore_frozen(
                    meta["reference"],
                    reference_copy(template["train"].policy, self.learner.spec.kl.reference_dtype),
                )
        self.curriculum.load_state_dict(meta.pop("curriculum"))
        meta.pop("has_ref", None)
        meta.pop("reference", None)
        self.meta = meta
        if meta["phase"] == "sft":
            done = f"SFT step {int(self.sft_state.step)}"
        else:
            done = f"RL iteration {int(meta['rl_iteration'])}"
        # tests/test_chaos.py reads this line to tell where a killed run resumed.
        logging.info("resumed from checkpoint %d (phase %s, after %s)", step, meta["phase"], done)
        return True

    # ------------------------------------------------------------------ phases

    def run(self) -> dict[str, Any]:
        self.restore()
        if self.meta["phase"] == "sft":
            self.run_sft()
        if self.meta["phase"] == "rl":
            self.run_rl()
        self.checkpointer.wait()
        return self.meta["evals"]

    def num_rl_iterations(self) -> int:
        """RL iterations the budget's RL episodes pay for."""
        per_iteration = self.config.rl.tasks_per_iteration * self.config.rollout.group_size
        return self.budget.rl_iterations(per_iteration)

    def demonstration_tasks(self) -> list[Task]:
        """The train tasks of the SFT demonstrations, drawn from the curriculum's first stage."""
        cfg = self.config
        np_rng = rng_streams.numpy_rng(cfg.seed, rng_streams.DEMONSTRATIONS)
        levels = Curriculum(cfg.curriculum).sample_levels(self.budget.num_demos, np_rng)
        return [self.train_tasks[lv][i % len(self.train_tasks[lv])] for i, lv in enumerate(levels)]

    @functools.cached_property
    def rl_tasks(self) -> dict[str, list[Task]]:
        """The train tasks RL draws from per level (``rl.task_pool``: all, or unseen in SFT)."""
        if self.config.rl.task_pool == "all":
            return self.train_tasks
        used = {t.id for t in self.demonstration_tasks()}
        return {lv: [t for t in ts if t.id not in used] for lv, ts in self.train_tasks.items()}

    def demonstrations(self) -> list[Trajectory]:
        """Expert episodes on the demonstration tasks (the won ones)."""
        tasks = self.demonstration_tasks()
        with self.watchdog.guard("the SFT demonstrations"):
            demos = self.worker.run(tasks, jax.random.key(0), expert=True, group_size=1)
        won = [d for d in demos if d.won and not d.infra_failure]
        logging.info("SFT: %d expert demonstrations, %d won", len(demos), len(won))
        return won

    def run_sft(self) -> None:
        """SFT on expert demonstrations (grain pipeline), checkpointed at each epoch's end."""
        cfg = self.config
        demos = self.demonstrations()
        pad = self.tokenizer.pad_token_id
        if demos:
            examples, stats = sft_data.demonstration_examples(
                demos, cfg.rollout.context_mode, pad_id=pad, max_len=cfg.rollout.max_seq_len
            )
            logging.info("SFT data: %s", stats)
            buckets = tuple(b for b in sft_data.DEFAULT_BUCKETS if b < cfg.rollout.max_seq_len)
            dataset = sft_data.SftDataset(
                examples,
                sft_data.SftDataConfig(
                    batch_size=cfg.sft.batch_size,
                    buckets=(*buckets, cfg.rollout.max_seq_len),
                    num_epochs=cfg.sft.epochs,
                    seed=cfg.seed,
                    group_by_length=cfg.sft.group_by_length,
                ),
                pad,
            )
            total = dataset.batches_per_epoch * cfg.sft.epochs
            self.sft_learner = sft_learner(cfg, self.policy, total, self.mesh)
            if self.sft_state is None:
                self.sft_state = self.sft_learner.init(self.policy)
            iterator = dataset.iterator(self.meta.get("sft_iterator"))
            from tqdm.auto import tqdm

            done = int(self.sft_state.step)
            logging.info(
                "SFT: %d steps (%d epochs of %d batches of %d)",
                total,
                cfg.sft.epochs,
                dataset.batches_per_epoch,
                cfg.sft.batch_size,
            )
            bar = tqdm(
                iterator, desc="sft", initial=done, total=total, disable=not multihost.is_primary()
            )
            epoch = done // dataset.batches_per_epoch + 1
            with self.watchdog.guard(f"SFT epoch {epoch}") as watchdog:
                for batch in bar:
                    batch = {k: batch[k] for k in sft_data.BATCH_KEYS}
                    self.sft_state, m = self.sft_learner.sft_step(
                        self.sft_state, self.sft_learner.place_batch(batch)
                    )
                    step = int(self.sft_state.step)
                    self.writer.scalars({k: float(v) for k, v in m.items()}, step)
                    if step % dataset.batches_per_epoch == 0 and step < total:
                        self.meta["sft_iterator"] = iterator.get_state()
                        watchdog.disarm()
                        self.save()
                        chaos.maybe_kill("sft_epoch")
                        epoch += 1
                        watchdog.arm(f"SFT epoch {epoch}")
                    chaos.maybe_kill("sft_step")
            nnx.update(self.policy, self.sft_state.policy)
            if self.critic is not None:
                # The critic's trunk starts from the SFT policy's.
                self.critic = Qwen2ValueModel.from_policy(self.policy, rngs=nnx.Rngs(cfg.seed + 1))
        # The SFT moments go before the RL state (policy, critic, their moments) is made.
        self.sft_state = self.sft_learner = None
        self.state = self.learner.init(self.policy, self.critic)
        metrics = self.evaluate("after_sft", report=True)
        self.writer.scalars(metrics, 0)
        self._freeze_reference()
        self.meta["phase"] = "rl"
        self.meta.pop("sft_iterator", None)
        self.save(metrics)

    def run_rl(self) -> None:
        cfg = self.config
        if self.ref_policy is None:
            # The frozen reference for the KL term: the policy as SFT left it.
            self._freeze_reference()
        total = self.num_rl_iterations()
        from tqdm.auto import tqdm

        start = int(self.meta["rl_iteration"])
        if start < total:
            logging.info(
                "RL: iterations %d-%d of %d, %d tasks x %d rollouts each (%s)",
                start + 1,
                total,
                total,
                cfg.rl.tasks_per_iteration,
                cfg.rollout.group_size,
                cfg.rl.algo,
            )
        bar = tqdm(
            range(start, total),
            desc="rl",
            initial=start,
            total=total,
            disable=not multihost.is_primary(),
        )
        for it in bar:
            clock = timing.PhaseClock()
            with clock.running():
                self._rl_loop_body(it, total, clock)
            self.profiles.append(timing.IterationProfile.of(it + 1, clock.elapsed(), clock))
        if total == start:
            self.meta["phase"] = "done"

    def _rl_loop_body(self, it: int, total: int, clock: timing.PhaseClock) -> None:
        """Iteration ``it``: the rollout and update, evaluation when due, logs, checkpoint."""
        cfg = self.config
        with self.watchdog.guard(f"RL iteration {it + 1}"):
            metrics = self.rl_iteration(it)
        self.meta["rl_iteration"] = it + 1
        last = it + 1 == total
        if last or (cfg.eval_every and (it + 1) % cfg.eval_every == 0):
            metrics.update(self.evaluate("after_rl" if last else f"rl_{it + 1}", report=last))
        if last:
            self.meta["phase"] = "done"
        with timing.phase("log"):
            # The phases so far (the checkpoint comes after the write): Trainer.profiles has them
            # all.
            metrics.update(timing.phase_metrics(clock))
            logging.info("%s", iteration_summary(it + 1, total, metrics))
            self.writer.scalars(metrics, it + 1)
            self.writer.flush()
        if metrics.get("train/skipped_nonfinite", 0.0) > 0:
            logging.warning(
                "iteration %d: %d update(s) skipped on a non-finite loss or gradient; "
                "not checkpointing this iteration",
                it + 1,
                int(metrics["train/skipped_nonfinite"]),
            )
            return
        if last or (it + 1) % cfg.checkpoint.every == 0:
            with timing.phase("checkpoint"):
                self.save(metrics)

    def rl_iteration(self, it: int) -> dict[str, float]:
        """One iteration: pick tasks, roll out, assign credit, update. Returns its metrics."""
        cfg, rl = self.config, self.config.rl
        rng = jax.random.fold_in(jax.random.key(cfg.seed), 1_000_000 + it)
        np_rng = rng_streams.numpy_rng(cfg.seed, rng_streams.RL_ITERATION, it)
        levels = self.curriculum.sample_levels(rl.tasks_per_iteration, np_rng)
        tasks = [self.rl_tasks[lv][np_rng.integers(len(self.rl_tasks[lv]))] for lv in levels]

        t0 = time.perf_counter()
        sampling = rl_sampling(cfg)
        # text: its own seconds (rendering, encoding, contexts, decoding); the sampler's copy of
        # the policy is released on exit, so it is not held through the update.
        with self.policy_in_sampler(), timing.phase("text"):
            trajs = self.worker.run(tasks, rng, sampling=sampling)
        t_rollout = time.perf_counter() - t0

        good = [t for t in trajs if not t.infra_failure and t.steps]
        metrics = rollout_metrics(trajs)
        metrics["curriculum/stage"] = float(self.curriculum.stage)
        if not good:
            logging.warning(
                "iteration %d: no usable episode (infrastructure failures, or episodes a full "
                "context ended before their first action)",
                it,
            )
            self.curriculum.update([])
            return metrics

        t1 = time.perf_counter()
        self.state, update_metrics = self.rl_update(self.state, self.ref_policy, good, np_rng, it)
        t_update = time.perf_counter() - t1
        with timing.phase("log"):
            self.curriculum.update([t.won for t in good])
        metrics.update(update_metrics)
        tokens = sum(t.num_tokens for t in good)
        metrics.update(
            {
                "time/rollout_s": t_rollout,
                "time/update_s": t_update,
                "time/rollout_fraction": t_rollout / max(t_rollout + t_update, 1e-9),
                "perf/rollout_tokens_per_s": tokens / max(t_rollout, 1e-9),
                "perf/update_tokens_per_s": tokens * rl.epochs / max(t_update, 1e-9),
            }
        )
        return metrics

    @contextlib.contextmanager
    def policy_in_sampler(self) -> Iterator[None]:
        """The current policy in the sampler for the ``with`` block (a rollout, an evaluation).

        Synced on entry (``_sync_sampler``) and released on exit, also when the block raises,
        both timed as ``sync``: the sampler's own copy of the policy is never held past the
        block (through the RL update, whose learner programs are planned without it).
        """
        self._sync_sampler()
        try:
            yield
        finally:
            with timing.phase("sync"):
                self.sampler.release()

    def _sync_sampler(self) -> None:
        """Gives the sampler the current policy (``sync_sampler``)."""
        policy = (self.state if self.sft_state is None else self.sft_state).policy
        with timing.phase("sync"):
            sync_sampler(self.sampler, policy, self.policy.cfg.dtype, self.local_mesh)

    def evaluate(self, name: str, *, report: bool = False) -> dict[str, float]:
        """Greedy episodes on every held-out level: reports under workdir/eval, metrics back.

        The tuning split's levels (``eval_tasks``) give ``eval/<level>/*`` and
        ``eval/success_rate`` (the checkpoint-selection metric); with ``report`` the report split's
        (``report_tasks``, e.g. ``simple@test``) give ``report/<level@split>/*``, kept apart so
        that nothing selects on them. A set equal to one already played is not played again.
        """
        with self.watchdog.guard(f"evaluation {name}"), timing.phase("evaluate", scope=True):
            return self._evaluate(name, report)

    def _evaluate(self, name: str, report: bool) -> dict[str, float]:
        sets = [("eval", level, tasks) for level, tasks in self.eval_tasks.items()]
        if report:
            sets += [("report", key, tasks) for key, tasks in self.report_tasks.items()]
        logging.info(
            "evaluation %s: %s",
            name,
            ", ".join(f"{level} ({len(tasks)} games)" for _, level, tasks in sets),
        )
        out, results, played = {}, {}, {}
        with self.policy_in_sampler():  # the next rollout or evaluation syncs a fresh copy
            for prefix, level, tasks in sets:
                ids = tuple((t.split, t.id) for t in tasks)
                if ids not in played:
                    played[ids] = evaluation.evaluate(
                        self.worker,
                        tasks,
                        jax.random.key(0),
                        greedy=True,
                        seed=self.config.seed,
                        transcripts=self.config.env.num_transcripts,
                    )
                result = results[level] = played[ids]
                if multihost.is_primary():
                    evaluation.write_report(
                        result,
                        os.path.join(self.workdir, "eval"),
                        f"{name}_{level.replace('@', '_')}",
                    )
                overall = result.overall
                out[f"{prefix}/{level}/success_rate"] = overall.success_rate
                out[f"{prefix}/{level}/mean_steps"] = overall.mean_steps
                out[f"{prefix}/{level}/mean_return"] = overall.mean_return
        out["eval/success_rate"] = out[f"eval/{next(iter(self.eval_tasks))}/success_rate"]
        self.meta["evals"][name] = {level: r.to_json() for level, r in results.items()}
        summary = [
            f"{level} success {r.success_rate:.2f} ({r.overall.wins}/{r.overall.episodes}, "
            f"{r.overall.mean_steps:.1f} steps, {r.overall.infra_failures} infra failures)"
            for level, r in results.items()
        ]
        logging.info("evaluation %s done: %s", name, "; ".join(summary))
        return out

    def before_after_results(
        self,
    ) -> list[tuple[str, evaluation.EvalResult, evaluation.EvalResult]]:
        """(set, result after SFT, result after RL) per report level (``simple@test``); a run
        without report evaluations (``num_report_tasks=0``, or an older run) gives its valid
        levels instead. Empty until both evaluations exist."""
        evals = self.meta["evals"]
        sft, rl = evals.get("after_sft", {}), evals.get("after_rl", {})
        keys = [k for k in self.report_levels if k in sft and k in rl]
        keys = keys or [k for k in self.eval_tasks if k in sft and k in rl]
        from_json = evaluation.EvalResult.from_json
        return [(k, from_json(sft[k]), from_json(rl[k])) for k in keys]

    def before_after(self) -> str:
        """The held-out success table after SFT alone and after RL (markdown, with intervals)."""
        rows = self.before_after_results()
        if not rows:
            return "(no before/after table: the run has no evaluation after SFT and after RL)"
        return evaluation.before_after_table(rows)

    def close(self) -> None:
        self.checkpointer.close()
        self.writer.close()
        self.pool.close()
