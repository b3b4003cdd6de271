"""Every consumer of a run's host randomness draws from its own numpy stream.

The demonstrations, each RL iteration and each SFT epoch's batch plan are seeded from the run's
seed; no two of them may share a stream (the demonstrations were once seeded ``[seed, 7]``: RL
iteration 7's stream). The seeds are recorded where the trainer's own code asks for them.
"""

import contextlib
import functools
import os
import types

import numpy as np
import pytest

from agentrl_jax.envs.base import Task
from agentrl_jax.rl import rng_streams
from agentrl_jax.rl.sft_data import SftDataConfig, SftDataset
from agentrl_jax.rollout.curriculum import Curriculum
from agentrl_jax.run import budget as budget_lib
from agentrl_jax.run.config import from_config_dict, load_config_file
from agentrl_jax.run.state import RunState
from agentrl_jax.run.trainer import Trainer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ITERATIONS = 64  # RL iterations (and SFT epochs) checked
SEEDS = (0, 3)


class _Stop(Exception):
    """Ends an RL iteration once it has drawn its tasks."""


@pytest.fixture
def recorded(monkeypatch):
    """The seed of every ``np.random.default_rng`` call, in call order."""
    seen = []
    real = np.random.default_rng

    def record(seed=None):
        seen.append(seed)
        return real(seed)

    monkeypatch.setattr(np.random, "default_rng", record)
    return seen


def _run(seed):
    cd = load_config_file(os.path.join(REPO, "configs", "tiny_textworld.py") + ":test")
    cd.seed = seed
    cd.rl.task_pool = "all"
    config = from_config_dict(cd)
    tasks = {"simple": [Task("textworld", "train", f"simple/{i}") for i in range(8)]}

    def stop(*args, **kwargs):
        raise _Stop

    run = types.SimpleNamespace(
        config=config,
        budget=budget_lib.from_config(config.budget),
        train_tasks=tasks,
        rl_tasks=tasks,
        curriculum=Curriculum(config.curriculum),
        run_state=RunState(phase="rl"),
        policy_in_sampler=contextlib.nullcontext,
        worker=types.SimpleNamespace(run=stop),
    )
    run._iteration_draws = functools.partial(Trainer._iteration_draws, run)
    run._play = functools.partial(Trainer._play, run)
    return run


def _demonstration_seed(run, recorded):
    del recorded[:]
    assert Trainer.demonstration_tasks(run)
    (seed,) = recorded
    return seed


def _rl_seeds(run, recorded):
    seeds = []
    for it in range(ITERATIONS):
        del recorded[:]
        with pytest.raises(_Stop):
            Trainer.rl_iteration(run, it)
        (seed,) = recorded
        seeds.append(seed)
    return seeds


def _sft_seeds(seed, recorded):
    rng = np.random.default_rng(0)
    examples = [
        {"tokens": np.arange(n, dtype=np.int32), "loss_mask": np.ones(n, np.float32)}
        for n in rng.integers(3, 30, 12)
    ]
    config = SftDataConfig(batch_size=2, buckets=(32,), seed=seed, group_by_length=2)
    data = SftDataset(examples, config, pad_id=0)
    seeds = []
    for epoch in range(ITERATIONS):
        del recorded[:]
        data._epoch_plan(epoch)
        (s,) = recorded
        seeds.append(s)
    return seeds


def _state(seed) -> tuple[int, ...]:
    """What a generator seeded with ``seed`` draws from (equal states: the same stream)."""
    return tuple(np.random.SeedSequence(seed).generate_state(4).tolist())


@pytest.mark.parametrize("seed", SEEDS)
def test_demonstrations_rl_iterations_and_sft_epochs_draw_from_their_own_streams(seed, recorded):
    run = _run(seed)
    demos = _demonstration_seed(run, recorded)
    rl = _rl_seeds(run, recorded)
    sft = _sft_seeds(seed, recorded)
    streams = {"demonstrations": [_state(demos)]}
    streams["RL iterations"] = [_state(s) for s in rl]
    streams["SFT epochs"] = [_state(s) for s in sft]
    owner = {}
    for name, states in streams.items():
        for i, state in enumerate(states):
            assert state not in owner, f"{name} {i} shares the stream of {owner[state]}"
            owner[state] = f"{name} {i}"
    # The same seed gives the same streams (a run stays reproducible).
    assert _demonstration_seed(_run(seed), recorded) == demos
    assert _rl_seeds(_run(seed), recorded) == rl


def test_numpy_rng_keeps_the_tags_apart_and_refuses_an_unknown_one():
    states = {}
    for stream in rng_streams.STREAMS.values():
        for index in [()] if stream == rng_streams.DEMONSTRATIONS else range(2000):
            index = index if isinstance(index, tuple) else (index,)
            gen = rng_streams.numpy_rng(5, stream, *index)
            state = tuple(gen.bit_generator.random_raw(2).tolist())
            assert state not in states, (stream, index, states.get(state))
            states[state] = (stream, index)
    draw = rng_streams.numpy_rng(5, rng_streams.RL_ITERATION, 3).random()
    assert np.random.default_rng([5, rng_streams.RL_ITERATION, 3]).random() == draw
    with pytest.raises(ValueError, match=r"^numpy_rng: stream is 9; expected one of the tags"):
        rng_streams.numpy_rng(0, 9)
