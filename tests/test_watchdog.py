"""The watchdog: a phase that runs past ``config.watchdog_s`` ends the process with a message."""

import os
import subprocess
import sys
import time

import pytest

from agentrl_jax.run.watchdog import EXIT_STATUS, Watchdog

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The trainer's RL loop (Trainer.run_rl, unchanged) over a stand-in whose iteration 2 sleeps.
RL_LOOP = """
import sys, time, types
sys.path.insert(0, {tests!r})
import train_cli
from agentrl_jax.run.config import from_config_dict
from agentrl_jax.run.state import RunState
from agentrl_jax.run.trainer import Trainer
from agentrl_jax.run.watchdog import Watchdog

config = from_config_dict(train_cli.tiny_config(watchdog_s={limit}))

def rl_iteration(it):
    print(f"iteration {{it + 1}}", flush=True)
    time.sleep({sleep} if it == 1 else 0.0)
    return {{}}

trainer = types.SimpleNamespace(
    config=config,
    ref_policy="frozen",
    run_state=RunState(phase="rl"),
    num_rl_iterations=lambda: 3,
    rl_iteration=rl_iteration,
    evaluate=lambda name, report=False: {{}},
    save=lambda metrics=None: None,
    writer=types.SimpleNamespace(scalars=lambda m, step: None, flush=lambda: None),
    watchdog=Watchdog(config.watchdog_s),
    profiles=[],
)
trainer._rl_loop_body = lambda *args: Trainer._rl_loop_body(trainer, *args)
Trainer.run_rl(trainer)
print("finished", trainer.run_state.phase, flush=True)
"""


def _run_rl_loop(limit, sleep):
    code = RL_LOOP.format(tests=os.path.join(REPO, "tests"), limit=limit, sleep=sleep)
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    return out, time.perf_counter() - start


def test_an_iteration_that_sleeps_past_the_limit_ends_the_process():
    out, seconds = _run_rl_loop(limit=1.0, sleep=60)
    assert out.returncode == EXIT_STATUS, out.stdout + out.stderr
    assert "iteration 2" in out.stdout and "iteration 3" not in out.stdout
    assert "finished" not in out.stdout
    assert (
        "watchdog: RL iteration 2 has run for more than config.watchdog_s=1s on process 0 of 1; "
        f"ending the process (exit status {EXIT_STATUS})"
    ) in out.stderr
    assert "in rl_iteration" in out.stderr  # the stuck thread's stack, to see where it hung
    assert seconds < 45  # ended by the watchdog, long before the 60 s sleep


def test_iterations_within_the_limit_run_to_the_end():
    out, _ = _run_rl_loop(limit=30.0, sleep=0.2)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "finished done" in out.stdout and "watchdog" not in out.stderr


def test_a_disarmed_or_zero_watchdog_never_fires():
    dog = Watchdog(0.05)
    with dog.guard("a fast phase"):
        pass
    time.sleep(0.2)  # past the limit, after the guard: nothing happens
    Watchdog(0).arm("anything")  # off
    time.sleep(0.1)


def test_negative_limit_is_an_error_naming_the_field():
    with pytest.raises(ValueError, match=r"config.watchdog_s=-1: expected >= 0 seconds"):
        Watchdog(-1)
