"""The policy's version: what each step is tagged with and what the staleness metric reads.

A trainer assembled by hand (``Trainer.__new__``) with only what an iteration's bookkeeping
reads: the config, the curriculum, a rollout worker that hands out fixed episodes and an RL
update that records its calls; no model is built.
"""

import contextlib
import types

import numpy as np
import pytest
import train_cli

from agentrl_jax.envs.base import Task
from agentrl_jax.rollout.curriculum import Curriculum
from agentrl_jax.rollout.trajectory import Step, Trajectory
from agentrl_jax.run.config import from_config_dict
from agentrl_jax.run.state import RunState
from agentrl_jax.run.trainer import Trainer


def _episode(group: int, *, versions=(0,), usable=True) -> Trajectory:
    task = Task("scripted", "train", str(group))
    steps = [Step([1, 2], [3], [-0.5], policy_version=v) for v in versions] if usable else []
    return Trajectory(task, group, steps=steps, infra_failure=not usable)


class _Worker:
    """Plays the next of ``batches`` (lists of episodes) at each call."""

    def __init__(self, batches):
        self.batches = list(batches)

    def run(self, tasks, rng, **kwargs):
        return self.batches.pop(0)


def _trainer(max_staleness: int = 0, batches=()) -> tuple[Trainer, list]:
    config = from_config_dict(
        train_cli.tiny_config("test", rl=dict(max_staleness=max_staleness)), num_devices=1
    )
    trainer = Trainer.__new__(Trainer)
    trainer.config = config
    trainer.curriculum = Curriculum(config.curriculum)
    trainer.run_state = RunState(phase="rl")
    trainer.pending = {}
    trainer.state = types.SimpleNamespace(policy=None)
    trainer.ref_policy = None
    trainer.worker = _Worker(batches)
    trainer.policy_in_sampler = contextlib.nullcontext
    trainer.learner = types.SimpleNamespace(
        lora=False, spec=types.SimpleNamespace(kl=types.SimpleNamespace(needs_reference=False))
    )
    trainer.__dict__["rl_tasks"] = {
        level: [Task("scripted", "train", str(i)) for i in range(3)]
        for level in config.env.train_levels
    }
    updates = []

    def rl_update(state, ref, trajs, np_rng, it):
        updates.append([[s.policy_version for s in t.steps] for t in trajs])
        return state, {}

    trainer.rl_update = rl_update
    return trainer, updates


def test_the_staleness_metric_reads_each_steps_policy_version():
    """``rollout/staleness`` is the learner's version minus the version each step was played
    by (``Step.policy_version``), the mean over the steps, whatever the rollout says."""
    trainer, updates = _trainer(max_staleness=2)
    trainer.run_state.policy_version = 4
    trajs = [_episode(0, versions=(3, 3)), _episode(1, versions=(2,)), _episode(2, usable=False)]
    metrics = trainer._learn(7, trajs, np.random.default_rng(0), 1.0)
    assert metrics["rollout/staleness"] == pytest.approx(4 - (3 + 3 + 2) / 3)
    assert updates == [[[3, 3], [2]]]
    assert trainer.run_state.policy_version == 5


def test_an_on_policy_run_logs_no_staleness():
    trainer, _ = _trainer(max_staleness=0)
    metrics = trainer._learn(4, [_episode(0, versions=(4,))], np.random.default_rng(0), 1.0)
    assert "rollout/staleness" not in metrics


def test_the_version_counts_applied_updates_not_iterations():
    """An iteration without a usable episode applies no update, so the policy the next
    iteration plays is the same version: its steps say 0, and one update makes it 1."""
    empty = [_episode(0, usable=False), _episode(1, usable=False)]
    played = [_episode(0), _episode(1)]
    trainer, updates = _trainer(batches=[empty, played])
    trainer.rl_iteration(0)
    assert trainer.run_state.policy_version == 0 and not updates
    trainer.rl_iteration(1)
    assert updates == [[[0], [0]]]
    assert trainer.run_state.policy_version == 1


def test_asynchronous_staleness_counts_updates_after_an_iteration_without_one():
    """``max_staleness=1``: iteration 0 has no usable episode, so iteration 1's rollout,
    played during it, is by version 0, and so is the learner when it trains on it: staleness
    0, not 1. Iteration 2's rollout was played while version 0 was trained into version 1."""
    empty = [_episode(0, usable=False), _episode(1, usable=False)]
    trainer, updates = _trainer(max_staleness=1, batches=[empty, [_episode(0)], [_episode(1)]])
    trainer._sync_sampler = lambda copy=False: None
    trainer.sampler = types.SimpleNamespace(release=lambda: None)
    trainer.worker.gather = lambda trajs: trajs
    trainer.num_rl_iterations = lambda: 3
    try:
        metrics = [trainer.async_iteration(it) for it in range(3)]
    finally:
        trainer._background.shutdown(wait=True)
    assert "rollout/staleness" not in metrics[0]  # no step to read
    assert [m["rollout/staleness"] for m in metrics[1:]] == [0.0, 1.0]
    assert updates == [[[0]], [[0]]]
    assert trainer.run_state.policy_version == 2


def test_the_version_is_saved_with_the_run_state():
    state = RunState(phase="rl", rl_iteration=3, policy_version=2)
    assert RunState.from_json(state.to_json()) == state
    assert "policy_version" not in RunState().to_json()  # the meta a run without one wrote
