"""The trainer: the only piece that knows every stage of an iteration.

    tasks (curriculum) -> rollouts (actor pool + sampler) -> old/ref log-probs, values
      -> advantages (kernels, by name) -> epochs of minibatch updates (Learner) -> metrics
      -> TensorBoard, checkpoints (orbax), evaluation

A run is: build its parts (``run/build.py``: tasks, actor pool, tokenizer, policy, sampler), SFT
on expert demonstrations, evaluate, RL iterations, evaluate. Where it is (phase, RL iteration,
evaluations so far) is a ``RunState`` (``run/state.py``), saved in every checkpoint's meta.
Evaluations on the tuning split (``valid``) drive checkpoint selection; the two at the ends of the
phases also play the report split (``test``), which the before/after table reads. Everything is
deterministic given the seed on CPU: each iteration derives its JAX key and numpy generator from
(seed, iteration), so a resumed run repeats exactly what an uninterrupted run does. Rerunning
with the same workdir resumes from the last checkpoint.

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
import io
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
from absl import logging
from flax import nnx

from agentrl_jax import chaos, timing
from agentrl_jax.envs.base import Task
from agentrl_jax.rl import envrl_data, rng_streams, sft_data
from agentrl_jax.rl.learner import Learner
from agentrl_jax.rl.rl_update import RLUpdate
from agentrl_jax.rollout import ahead
from agentrl_jax.rollout.ahead import PendingRollout
from agentrl_jax.rollout.curriculum import Curriculum
from agentrl_jax.rollout.trajectory import Trajectory
from agentrl_jax.run import budget as budget_lib
from agentrl_jax.run import build, eval_report, evaluation, logs, multihost, paths
from agentrl_jax.run.config import RunConfig
from agentrl_jax.run.state import REFERENCE, CheckpointMeta, RunState, restore_latest
from agentrl_jax.run.watchdog import Watchdog
from agentrl_jax.run.writers import build_writer


def rollout_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    """Return, success, length, truncation and infrastructure failures of a batch of episodes.

    Rates and means are over the episodes the pool did not lose, including those a full context
    ended before their first action (no step: ``rollout/truncated``, nothing to train on).
    ``rollout/singleton_groups`` counts the groups that failures left with one episode: a group
    estimator (GRPO, RLOO, GiGPO, GAGPO) gives such an episode advantage 0, so it trains nothing.
    Under tool calling, ``rollout/invalid_tool_call_rate`` is the share of the counted episodes'
    calls that were malformed (answered with an error tool turn; absent without tool calling).
    ``rollout/invalid_action_rate`` is the share of their steps whose command the env refused
    (``invalid_action`` in the step info; absent for envs that do not say).
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
    calls = [
        s.info["invalid_tool_call"]
        for t in counted
        for s in t.steps
        if "invalid_tool_call" in s.info
    ]
    if calls:
        out["rollout/invalid_tool_call_rate"] = float(np.mean(calls))
    refused = [
        s.info["invalid_action"] for t in counted for s in t.steps if "invalid_action" in s.info
    ]
    if refused:
        out["rollout/invalid_action_rate"] = float(np.mean(refused))
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


class Trainer:
    """Runs SFT then RL for a RunConfig in ``workdir`` (TensorBoard, checkpoints, reports).

    ``learning_curve``: ``(tensorboard logdir, PNG path) -> anything``, the plot of the run's
    learning curve that a run with ``config.logging.wandb`` on sends to W&B when its RL phase
    ends (``launch.train`` passes ``experiments.evaluate.plot_learning_curve``: learning curves
    are a layer above the trainer's, tests/test_layers.py). None: no curve is drawn.
    """

    def __init__(
        self,
        config: RunConfig,
        workdir: str,
        *,
        learning_curve: Callable[[str, str], object] | None = None,
    ):
        self.config = config
        self.learning_curve = learning_curve
        self.workdir = paths.absolute(workdir)  # a URL (gs://...) is passed through unchanged
        if not paths.is_url(self.workdir):
            os.makedirs(self.workdir, exist_ok=True)
        cfg = config
        logging.info("workdir: %s", self.workdir)
        # Held-out tasks, actor pool, mesh, tokenizer, template, policy, sampler, rollout worker
        # (run/build.py); the train and report tasks are made when first needed.
        self.parts = parts = build.build(config, self.workdir)
        self.eval_tasks, self.pool, self.multihost = parts.eval_tasks, parts.pool, parts.multihost
        self.mesh, self.local_mesh = parts.mesh, parts.local_mesh
        self.rollout_mesh = parts.rollout_mesh
        self.tokenizer, self.template = parts.tokenizer, parts.template
        self.policy, self.sampler, self.worker = parts.policy, parts.sampler, parts.worker
        # The trainer's own: replaced by one grown from the SFT policy when SFT ends.
        self.critic = build.critic(cfg, self.policy)
        self.budget = budget_lib.from_config(cfg.budget)
        # The RL learner of the policy as RL trains it: with LoRA (model.lora.rank > 0), the
        # adapters only (build.rl_policy; SFT trains the whole policy).
        self.learner = build.rl_learner(
            cfg,
            build.rl_policy(cfg, self.policy),
            self.critic,
            self.mesh,
            num_iterations=self.num_rl_iterations(),
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
        self.checkpointer = build.checkpointer(cfg, self.workdir)
        # A chaos kill (tests only) waits for the checkpoint writes under way.
        chaos.settle_with(self.checkpointer.write_finished)
        # TensorBoard, and W&B when config.logging.wandb is on (run/writers.py).
        self.writer = build_writer(cfg, self.workdir, enabled=jax.process_index() == 0)
        self.curriculum = Curriculum(cfg.curriculum)
        self.ref_policy = None
        self.run_state = RunState()
        self.watchdog = Watchdog(cfg.watchdog_s)
        # Where each RL iteration's wall time went, this process's iterations in order.
        self.profiles: list[timing.IterationProfile] = []
        # Asynchronous RL: rollouts played ahead of their iterations, by iteration.
        self.pending: dict[int, PendingRollout] = {}

    # ------------------------------------------------------------------ setup

    @property
    def report_levels(self) -> list[str]:
        """The before/after table's sets, ``level@split`` (none when ``num_report_tasks`` is 0)."""
        return build.report_levels(self.config)

    @property
    def report_tasks(self) -> dict[str, list[Task]]:
        """The report split's tasks per ``report_levels`` entry (generated on first use)."""
        return self.parts.report_tasks

    @property
    def train_tasks(self) -> dict[str, list[Task]]:
        """Train tasks per curriculum level (generated or found in the cache on first use)."""
        return self.parts.train_tasks

    # ------------------------------------------------------------------ checkpoints

    def _state_tree(self) -> dict[str, Any]:
        return {"train": self.sft_state if self.run_state.phase == "sft" else self.state}

    def _freeze_reference(self) -> None:
        """The frozen KL reference, when the run has one (``build.kl_reference``): the policy as
        it enters RL, written once (every later checkpoint names it instead of holding another
        copy)."""
        ref, frozen = build.kl_reference(self.learner, self.state.policy)
        if frozen:
            self.ref_policy = ref
            self.checkpointer.save_frozen(REFERENCE, self.ref_policy)

    def save(self, metrics: dict[str, float] | None = None) -> None:
        """Checkpoints everything; checkpoints are numbered in order (``run_state.checkpoint``).

        The metrics logged so far are flushed first: a run killed after this checkpoint resumes
        past them and never writes them again.
        """
        self.writer.flush()
        self.run_state.checkpoint += 1
        with self.watchdog.guard(f"checkpoint {self.run_state.checkpoint}"):
            self._save(metrics)

    def _save(self, metrics: dict[str, float] | None) -> None:
        self.run_state.pending = [p.to_json() for _, p in sorted(self.pending.items())]
        meta = CheckpointMeta(
            self.run_state,
            self.curriculum.state_dict(),
            reference=REFERENCE if self.ref_policy is not None else None,
        )
        step = self.run_state.checkpoint
        self.checkpointer.save(step, self._state_tree(), meta.to_json(), metrics)
        chaos.maybe_kill("checkpoint", ready=lambda: self.checkpointer.on_disk(step) == "writing")

    def restore(self) -> bool:
        """Restores the newest checkpoint, if any (``state.restore_latest``); returns whether
        it did."""
        restored = restore_latest(
            self.checkpointer,
            self.config,
            policy=self.policy,
            critic=self.critic,
            learner=self.learner,
            mesh=self.mesh,
        )
        if restored is None:
            return False
        self.run_state = restored.meta.run
        if self.run_state.phase == "sft":
            self.sft_state = restored.train
            done = f"SFT step {int(self.sft_state.step)}"
        else:
            self.state, self.ref_policy = restored.train, restored.reference
            done = f"RL iteration {self.run_state.rl_iteration}"
        self.curriculum.load_state_dict(restored.meta.curriculum)
        self.pending = {}
        for data in self.run_state.pending:
            pending = PendingRollout.from_json(data)
            self.pending[pending.iteration] = pending
        # tests/test_train.py reads this line to tell where a killed run resumed.
        logging.info(
            "resumed from checkpoint %d (phase %s, after %s)",
            restored.step,
            self.run_state.phase,
            done,
        )
        return True

    # ------------------------------------------------------------------ phases

    def run(self, stop_after: str | None = None) -> dict[str, Any]:
        """Runs the phases not done yet; returns the evaluations so far.

        ``stop_after="sft"``: stop once SFT is done and checkpointed (with its evaluation), the
        RL phase not begun: an SFT start that other runs resume from with other RL settings
        (``launch.study``'s ``shared_sft``)."""
        if stop_after not in (None, "sft"):
            raise ValueError(f"stop_after={stop_after!r}; expected None or 'sft'")
        self.restore()
        if self.run_state.phase == "sft":
            self.run_sft()
        if stop_after == "sft":
            self.checkpointer.wait()
            return self.run_state.evals
        if self.run_state.phase == "rl":
            self.run_rl()
            done = self.run_state.phase == "done"
            if done and self.config.logging.wandb.enabled and self.learning_curve is not None:
                self.log_learning_curve()
        self.checkpointer.wait()
        if self.run_state.phase == "done" and self.config.model.lora.enabled:
            self.export_adapter()
        return self.run_state.evals

    def log_learning_curve(self) -> None:
        """The run's learning curve (``self.learning_curve`` of its TensorBoard scalars) as a PNG
        image to every writer, at the last RL iteration's step: W&B shows it as media (only runs
        with ``config.logging.wandb`` on draw it, so the default run's files stay as they were)."""
        if jax.process_index() != 0:
            return
        self.writer.flush()
        with tempfile.TemporaryDirectory() as tmp:
            png = os.path.join(tmp, "learning_curve.png")
            self.learning_curve(os.path.join(self.workdir, "tensorboard"), png)
            with open(png, "rb") as f:
                data = f.read()
        from PIL import Image  # noqa: PLC0415 - matplotlib's own dependency

        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
        self.writer.image_png("learning_curve", data, self.run_state.rl_iteration, height, width)
        self.writer.flush()

    def export_adapter(self) -> str:
        """With LoRA: the trained adapters in PEFT's format, ``WORKDIR/adapter``
        (``adapter_config.json``, ``adapter_model.safetensors``), and beside them
        ``WORKDIR/base``, the base they were trained on (the policy as RL started: the SFT
        policy, not ``model.checkpoint``) as a Hugging Face checkpoint with the tokenizer, which
        the adapter names as its base (``peft.save_base_and_adapter``, as ``launch.export
        --what=adapter`` writes them). Returns the adapter's directory."""
        from agentrl_jax.models import peft

        base, out = peft.save_base_and_adapter(
            self.learner.policy_module(self.state),
            self.workdir,
            tokenizer=self.tokenizer,
            eos_token_id=self.template.stop_id(self.tokenizer),
        )
        logging.info("LoRA adapter (PEFT format): %s, on its base %s", out, base)
        return str(out)

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
        bar = logs.episode_bar("demonstrations", len(tasks))
        with self.watchdog.guard("the SFT demonstrations"), bar as progress:
            demos = self.worker.run(
                tasks, jax.random.key(0), expert=True, group_size=1, progress=progress
            )
        won = [d for d in demos if d.won and not d.infra_failure]
        logging.info("SFT: %d expert demonstrations, %d won", len(demos), len(won))
        return won

    def run_sft(self) -> None:
        """SFT on expert demonstrations (grain pipeline), checkpointed at each epoch's end."""
        cfg = self.config
        demos = self.demonstrations()
        if demos:
            self._sft_epochs(build.sft_dataset(cfg, demos, self.tokenizer.pad_token_id))
            nnx.update(self.policy, self.sft_state.policy)
            if self.critic is not None:
                # The critic's trunk starts from the SFT policy's.
                self.critic = build.critic(cfg, self.policy)
        # The SFT moments go before the RL state (policy, critic, their moments) is made.
        self.sft_state = self.sft_learner = None
        # With LoRA, the RL state is the SFT policy with fresh adapters (B = 0: the same policy).
        self.state = self.learner.init(build.rl_policy(cfg, self.policy), self.critic)
        metrics = self.evaluate("after_sft", report=True)
        self.writer.scalars(metrics, 0)
        self._freeze_reference()
        self.run_state.phase = "rl"
        self.run_state.sft_iterator = None
        self.save(metrics)

    def _sft_epochs(self, dataset: sft_data.SftDataset) -> None:
        """The SFT steps of every epoch of ``dataset`` not done yet (a restored run resumes at
        its checkpoint's epoch end)."""
        cfg = self.config
        total = dataset.batches_per_epoch * cfg.sft.epochs
        self.sft_learner = build.sft_learner(cfg, self.policy, total, self.mesh)
        if self.sft_state is None:
            self.sft_state = self.sft_learner.init(self.policy)
        iterator = dataset.iterator(self.run_state.sft_iterator)
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
                    self.run_state.sft_iterator = iterator.get_state()
                    watchdog.disarm()
                    self.save()
                    chaos.maybe_kill("sft_epoch")
                    epoch += 1
                    watchdog.arm(f"SFT epoch {epoch}")
                chaos.maybe_kill("sft_step")

    def run_rl(self) -> None:
        cfg = self.config
        if self.ref_policy is None:
            # The frozen reference for the KL term: the policy as SFT left it.
            self._freeze_reference()
        total = self.num_rl_iterations()
        from tqdm.auto import tqdm

        start = self.run_state.rl_iteration
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
            self.run_state.phase = "done"

    def _rl_loop_body(self, it: int, total: int, clock: timing.PhaseClock) -> None:
        """Iteration ``it``: the rollout and update, evaluation when due, logs, checkpoint."""
        cfg = self.config
        with self.watchdog.guard(f"RL iteration {it + 1}"):
            metrics = self.rl_iteration(it)
        self.run_state.rl_iteration = it + 1
        last = it + 1 == total
        if last or (cfg.eval_every and (it + 1) % cfg.eval_every == 0):
            metrics.update(self.evaluate("after_rl" if last else f"rl_{it + 1}", report=last))
        if last:
            self.run_state.phase = "done"
        with timing.phase("log"):
            # The phases so far (the checkpoint comes after the write): Trainer.profiles has them
            # all.
            metrics.update(timing.phase_metrics(clock))
            metrics["time/iteration_s"] = clock.elapsed()  # its wall time so far (no checkpoint)
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
        """One iteration: pick tasks, roll out, assign credit, update. Returns its metrics.

        With ``rl.max_staleness`` > 0 the rollout was played ahead (``async_iteration``).
        """
        if self.config.rl.max_staleness:
            return self.async_iteration(it)
        tasks, rng, np_rng = self._iteration_draws(it)
        trajs, seconds = self._play(tasks, rng, self.run_state.policy_version)
        return self._learn(it, trajs, np_rng, seconds)

    def _play(
        self, tasks: list[Task], rng: jax.Array, version: int
    ) -> tuple[list[Trajectory], float]:
        """An RL rollout of ``tasks`` by the current policy (RL version ``version``, which its
        steps are tagged with), now; its episodes and seconds.

        text: its own seconds (rendering, encoding, contexts, decoding); the sampler's copy of
        the policy is released on exit, so it is not held through the update."""
        t0 = time.perf_counter()
        bar = logs.episode_bar("rollout", len(tasks) * self.config.rollout.group_size)
        with self.policy_in_sampler(), timing.phase("text"), bar as progress:
            sampling = build.rl_sampling(self.config)
            trajs = self.worker.run(tasks, rng, sampling=sampling, progress=progress)
        ahead.tag_version(trajs, version)
        return trajs, time.perf_counter() - t0

    def _iteration_draws(self, it: int) -> tuple[list[Task], jax.Array, np.random.Generator]:
        """Iteration ``it``'s tasks (the curriculum's levels as it stands), its rollout's key,
        and its numpy generator (after the task draws; the update draws on from there)."""
        cfg = self.config
        rng = jax.random.fold_in(jax.random.key(cfg.seed), 1_000_000 + it)
        np_rng = rng_streams.numpy_rng(cfg.seed, rng_streams.RL_ITERATION, it)
        levels = self.curriculum.sample_levels(cfg.rl.tasks_per_iteration, np_rng)
        tasks = [self.rl_tasks[lv][np_rng.integers(len(self.rl_tasks[lv]))] for lv in levels]
        return tasks, rng, np_rng

    def async_iteration(self, it: int) -> dict[str, float]:
        """Iteration ``it`` of asynchronous RL (``rl.max_staleness`` = S > 0).

        Iteration ``it + S``'s rollout starts in the background, played by the policy as this
        iteration begins (its own copy of the weights in the sampler), while the learner trains
        on iteration ``it``'s, played S iterations ago. The iteration ends when both are done:
        the next iteration's rollout is then in ``pending``, which every checkpoint holds, so a
        resumed run trains on the same episodes. The rollouts the run does not have yet (the
        first S, or after resuming a checkpoint of an on-policy run) are played first, in the
        foreground, by the current policy.

        The background thread issues no cross-process collective: multi-host, it plays this
        process's share only, and the shares are gathered here, on the main thread, after the
        update (whose programs and gathers then run in the same order on every host).
        """
        stale, total = self.config.rl.max_staleness, self.num_rl_iterations()
        for later in range(it, min(it + stale, total)):
            if later not in self.pending:
                self.pending[later] = self._play_ahead(later, self.run_state.policy_version)
        later = it + stale
        if later >= total:
            return self._learn_pending(it, self.pending.pop(it))
        playing = self._start_ahead(later, self.run_state.policy_version)
        try:
            metrics = self._learn_pending(it, self.pending.pop(it))
        finally:
            t0 = time.perf_counter()
            with timing.phase("rollout_wait"):
                played, clock = playing.result()  # no rollout in flight past this iteration
            waited = time.perf_counter() - t0
        timing.add_background(clock)  # its device time counts in perf/device_busy_fraction
        with timing.phase("transfer"):
            played.trajs = self.worker.gather(played.trajs)  # a collective: every process's share
        self.pending[later] = played
        metrics["time/rollout_wait_s"] = waited
        return metrics

    def _play_ahead(self, it: int, version: int) -> PendingRollout:
        """Iteration ``it``'s rollout, played now by the current policy (RL version
        ``version``)."""
        tasks, rng, np_rng = self._iteration_draws(it)
        trajs, seconds = self._play(tasks, rng, version)
        return PendingRollout.of(it, trajs, np_rng, seconds)

    def _start_ahead(self, it: int, version: int):
        """Iteration ``it``'s rollout, started in a background thread by the current policy:
        the sampler gets its own copy of the weights (the update donates the train state's),
        released when the rollout ends. Returns its future (``PendingRollout`` and the thread's
        ``PhaseClock``), whose episodes are this process's share only
        (``RolloutWorker.run(gather=False)``): the caller gathers them on the main thread."""
        tasks, rng, np_rng = self._iteration_draws(it)
        self._sync_sampler(copy=True)
        sampling = build.rl_sampling(self.config)

        def play() -> list[Trajectory]:
            try:
                return self.worker.run(tasks, rng, sampling=sampling, gather=False)
            finally:
                self.sampler.release()

        return self._background.start(it, version, play, np_rng)

    @functools.cached_property
    def _background(self) -> ahead.PlayAhead:
        return ahead.PlayAhead()

    def _learn_pending(self, it: int, pending: PendingRollout) -> dict[str, float]:
        """The update on a rollout played ahead, the iteration's numpy generator where its task
        draws left it."""
        return self._learn(it, pending.trajs, pending.numpy_rng(), pending.seconds)

    def _learn(
        self, it: int, trajs: list[Trajectory], np_rng: np.random.Generator, t_rollout: float
    ) -> dict[str, float]:
        """Credit and the update on iteration ``it``'s episodes ``trajs``; its metrics."""
        rl = self.config.rl
        good = [t for t in trajs if not t.infra_failure and t.steps]
        metrics = rollout_metrics(trajs)
        if self.config.rl.max_staleness:
            metrics.update(ahead.staleness_metrics(trajs, self.run_state.policy_version))
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
        ref, _ = build.kl_reference(self.learner, self.state.policy, self.ref_policy)
        self.state, update_metrics = self.rl_update(self.state, ref, good, np_rng, it)
        self.run_state.policy_version += 1
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
        block (through the RL update, whose learner programs are planned without it; only
        asynchronous RL's rollout, ``_start_ahead``, holds one beside the update, and
        ``launch.plan`` counts it there).
        """
        with build.policy_in_sampler(self.sampler, self._sync_sampler):
            yield

    def _sync_sampler(self, *, copy: bool = False) -> None:
        """Gives the sampler the current policy (``sync_sampler``); ``copy``: always its own
        copy (a rollout that runs while the update changes the train state's)."""
        policy = (self.state if self.sft_state is None else self.sft_state).policy
        with timing.phase("sync"):  # a LoRA policy: its merged weights (the learner's graph)
            build.sync_sampler(
                self.sampler,
                policy,
                self.policy.cfg.dtype,
                self.local_mesh,
                graphdef=self.learner.policy_graphdef,
                copy=copy,
                rollout=self.rollout_mesh,
            )

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
        with self.policy_in_sampler():  # the next rollout or evaluation syncs a fresh copy
            out, results = eval_report.evaluate_policy(
                self.worker,
                self.config,
                self.eval_tasks,
                name=name,
                workdir=self.workdir,
                report_tasks=self.report_tasks if report else None,
            )
        self.run_state.evals[name] = {level: r.to_json() for level, r in results.items()}
        return out

    def before_after_results(
        self,
    ) -> list[tuple[str, evaluation.EvalResult, evaluation.EvalResult]]:
        """(set, result after SFT, result after RL) per report level (``simple@test``); a run
        without report evaluations (``num_report_tasks=0``, or an older run) gives its valid
        levels instead. Empty until both evaluations exist."""
        evals = self.run_state.evals
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
        return eval_report.before_after_table(rows)

    def close(self) -> None:
        if "_background" in self.__dict__:
            self._background.shutdown(wait=True)
        self.checkpointer.close()
        self.writer.close()
        self.pool.close()
