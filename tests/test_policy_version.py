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
        train_cli.tiny_config("test", rollout=dict(max_staleness=max_staleness)), num_devices=1
    )
    trainer = Trainer.__new__(Trainer)
    trainer.config = config
    trainer.curriculum = Curriculum(config.curriculum)
    trainer.run_state = RunState(phase="rl")
    trainer.pending = {}
    trainer.state = object()
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
    trajs = [_episode(0, versions=(3, 3)), _episode(1, versions=(2,)), _episode(2, usable=False)]
    metrics = trainer._learn(4, trajs, np.random.default_rng(0), 1.0)
    assert metrics["rollout/staleness"] == pytest.approx(4 - (3 + 3 + 2) / 3)
    assert updates == [[[3, 3], [2]]]


def test_an_on_policy_run_logs_no_staleness():
    trainer, _ = _trainer(max_staleness=0)
    metrics = trainer._learn(4, [_episode(0, versions=(4,))], np.random.default_rng(0), 1.0)
    assert "rollout/staleness" not in metrics
