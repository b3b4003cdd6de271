"""Chaos during a real RL iteration: a worker SIGKILLed mid-episode, an env that hangs past the
pool's step timeout and one that raises. The iteration (the trainer's own rollout and update on
the tiny model, through a real actor pool) completes, the lost episodes are counted and never
trained on, and the before/after report counts them too."""

import functools
import json
import os
import pathlib
import signal
import types

import chaos_env
import jax
import numpy as np
import pytest
from flax import nnx
from train_cli import tiny_config

from agentrl_jax.envs.actors import ActorPool
from agentrl_jax.envs.base import Task
from agentrl_jax.models import CausalLM
from agentrl_jax.models.tokenizer import build_tokenizer
from agentrl_jax.rl import rl_batch
from agentrl_jax.rl.rl_update import RLUpdate
from agentrl_jax.rollout.chat import get_template
from agentrl_jax.rollout.curriculum import Curriculum
from agentrl_jax.rollout.rollout import RolloutWorker
from agentrl_jax.run import eval_report, evaluation
from agentrl_jax.run.build import model_config, rl_learner, rl_sampling
from agentrl_jax.run.config import from_config_dict
from agentrl_jax.run.state import RunState
from agentrl_jax.run.trainer import Trainer
from agentrl_jax.sampling import Sampler, StopConfig

STEP_TIMEOUT_S = 1.0
# One task per level of the curriculum's stage (sample_levels keeps its exact proportions): two
# calm games, one that raises on its first step and one that hangs on its last.
TASKS = {
    "calm": [Task("chaos-test", "train", "calm/0"), Task("chaos-test", "train", "calm/1")],
    "raise": [Task("chaos-test", "train", "raise/0", (("raise_at", 1),))],
    "hang": [Task("chaos-test", "train", "hang/0", (("hang_at", chaos_env.LENGTH),))],
}
# The report's games: as many episodes as an iteration (the same compiled sampler programs).
REPORT_TASKS = [Task("chaos-test", "test", f"calm/{i}") for i in range(3)] + [
    Task("chaos-test", "test", "raise/0", (("raise_at", 1),))
]


class KillingPool:
    """The actor pool, with one of its workers (drawn at random) SIGKILLed from outside before
    the second step of every wave while ``armed``: each episode that worker holds is mid-game."""

    def __init__(self, pool: ActorPool, seed: int):
        self.pool = pool
        self.rng = np.random.default_rng(seed)
        self.armed = True
        self.killed: list[int] = []
        self.errors: list[str] = []  # every lost episode's reason, as the pool gave it
        self._steps = 0

    @property
    def capacity(self) -> int:
        return self.pool.capacity

    def reset(self, tasks):
        self._steps = 0
        out = self.pool.reset(tasks)
        self.errors += [r.error for r in out if r.infra_failure]
        return out

    def step(self, actions):
        self._steps += 1
        if self.armed and self._steps == 2:
            pid = int(self.rng.choice(self.pool.worker_pids()))
            os.kill(pid, signal.SIGKILL)
            self.killed.append(pid)
        out = self.pool.step(actions)
        self.errors += [r.error for r in out if r is not None and r.infra_failure]
        return out


@pytest.fixture(scope="module")
def chaos_trainer(tmp_path_factory):
    """The Trainer's iteration on a stand-in holding a real actor pool of the chaos game (4
    workers x 2 envs, a worker SIGKILLed in each wave while armed), the tiny policy, its sampler
    and the RL update."""
    config = from_config_dict(
        tiny_config(
            "test",
            env=dict(name="chaos-test", kwargs=dict(hang_s=30.0), num_workers=4, envs_per_worker=2),
            rollout=dict(
                group_size=2,
                max_turns=chaos_env.LENGTH + 1,
                max_new_tokens=6,
                max_seq_len=256,
                constrain_actions=False,
            ),
            rl=dict(tasks_per_iteration=4, minibatch_size=4, kl_coef=0.0),
            curriculum=dict(stages=[[(level, float(len(t))) for level, t in TASKS.items()]]),
        ),
        num_devices=1,
    )
    texts = [
        f"Goal: reach room {chaos_env.LENGTH} {t.id} room {n} go on wait"
        for ts in TASKS.values()
        for t in ts
        for n in range(chaos_env.LENGTH + 1)
    ]
    tokenizer = build_tokenizer(texts * 4, 300, tmp_path_factory.mktemp("tok"))
    template = get_template(config.model.template)
    policy = CausalLM(model_config(config, len(tokenizer)), rngs=nnx.Rngs(0))
    sampler = Sampler(
        policy,
        stop=StopConfig(eos_ids=(template.stop_id(tokenizer),)),
        pad_id=tokenizer.pad_token_id,
    )
    learner = rl_learner(config, policy, None)
    pool = ActorPool(
        "chaos-test",
        dict(config.env.kwargs),
        num_workers=4,
        envs_per_worker=2,
        step_timeout_s=STEP_TIMEOUT_S,
    )
    killing = KillingPool(pool, seed=0)
    trainer = types.SimpleNamespace(
        config=config,
        pool=killing,
        sampler=sampler,
        worker=RolloutWorker(killing, sampler, tokenizer, template, config.rollout),
        learner=learner,
        rl_update=RLUpdate(learner.spec, learner, tokenizer.pad_token_id),
        state=learner.init(policy, None),
        sft_state=None,
        ref_policy=None,
        multihost=False,
        policy=policy,
        local_mesh=None,
        rollout_mesh=None,
        curriculum=Curriculum(config.curriculum),
        run_state=RunState(phase="rl"),
        rl_tasks=TASKS,
    )
    for name in (
        "rl_iteration",
        "_iteration_draws",
        "_play",
        "_learn",
        "policy_in_sampler",
        "_sync_sampler",
    ):
        setattr(trainer, name, functools.partial(getattr(Trainer, name), trainer))
    yield trainer
    pool.close()


def test_an_rl_iteration_survives_worker_kills_hangs_and_env_exceptions(
    chaos_trainer, monkeypatch, tmp_path
):
    run = chaos_trainer
    pool = run.pool.pool
    # What the update trains on: every call of the batch builder, spied on.
    built = []
    build_rows = rl_batch.build_rows

    def spy(trajs, *args, **kwargs):
        out = build_rows(trajs, *args, **kwargs)
        built.append((list(trajs), out))
        return out

    monkeypatch.setattr(rl_batch, "build_rows", spy)
    played = []
    run_episodes = RolloutWorker.run
    monkeypatch.setattr(
        RolloutWorker, "run", lambda *a, **k: played.extend(out := run_episodes(*a, **k)) or out
    )
    # The before/after report of sampled play on other games (the raising one: 2 episodes lost
    # each time), played with the iteration's sampling (its compiled programs).
    sampling = rl_sampling(run.config)
    report = functools.partial(
        evaluation.evaluate, run.worker, REPORT_TASKS, jax.random.key(1), greedy=False,
        sampling=sampling,
    )  # fmt: skip
    run.pool.armed = False
    run._sync_sampler()
    before = report()

    run.pool.armed = True
    played.clear()
    counts = dict(pool.metrics)
    metrics = run.rl_iteration(0)
    delta = {k: pool.metrics[k] - counts[k] for k in pool.metrics}

    # Chaos happened: the SIGKILLed worker, the hung ones, both raising episodes.
    assert len(run.pool.killed) == 1 and run.pool.killed[0] not in pool.worker_pids()
    assert delta["worker_crashes"] == 1
    assert delta["worker_hangs"] >= 1 and delta["env_exceptions"] == 2
    assert delta["worker_restarts"] == delta["worker_crashes"] + delta["worker_hangs"]
    assert len(played) == 8
    failed = [t for t in played if t.infra_failure]
    assert all(t.infra_failure for t in played if t.task.id.startswith(("raise", "hang")))
    assert len(failed) >= 4 + 1  # both raising and both hanging episodes, and a killed one
    reasons = " ".join(run.pool.errors)
    assert "crashed during step" in reasons and f"hung > {STEP_TIMEOUT_S:g} s" in reasons
    assert "env raised RuntimeError: chaos: raise/0" in reasons

    # Counted: the iteration's metric and the pool's own count agree.
    assert metrics["rollout/infra_failures"] == len(failed) == delta["infra_failures"]
    assert metrics["rollout/episodes"] == 8.0

    # The iteration completed an update, on the surviving episodes only.
    good = [t for t in played if not t.infra_failure]
    assert good and metrics["train/updates"] >= 1
    assert np.isfinite(metrics["losses/policy_loss"])
    ((trained, rows),) = built
    assert [id(t) for t in trained] == [id(t) for t in good]
    # Row r holds episode r's ids; the padding rows after them train nothing.
    tokens, loss_mask = rows.rows.tokens, rows.rows.loss_mask
    for r, traj in enumerate(good):
        acted = tokens[r][loss_mask[r] > 0].tolist()
        assert acted == [i for s in traj.steps for i in s.action_ids]
    assert loss_mask[len(good) :].sum() == 0
    assert int(loss_mask.sum()) == sum(len(s.action_ids) for t in good for s in t.steps)

    # The before/after report counts the lost episodes apart from the rates.
    run.pool.armed = False
    run._sync_sampler()  # the update donated the state the sampler held
    after = report()
    (row,) = eval_report.before_after_rows([("chaos", before, after)])
    assert row["infra_failures"] == {"after_sft": 2, "after_rl": 2}
    assert row["after_sft"]["n"] == row["after_rl"]["n"] == 6  # the calm games' episodes
    header, _, line, *_ = eval_report.before_after_table([("chaos", before, after)]).splitlines()
    assert header.endswith("| infra failures |")
    assert line.startswith("| chaos | 6 |") and line.endswith("| 2 / 2 |")
    json_path, _ = eval_report.write_report(after, tmp_path, "after_rl_chaos")
    overall = json.loads(pathlib.Path(json_path).read_text())["overall"]
    assert (overall["episodes"], overall["infra_failures"]) == (6, 2)
