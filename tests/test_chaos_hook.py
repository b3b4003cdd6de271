"""The chaos hook: which reach of a point kills, with a real SIGKILL; a clear error otherwise.

The kills at every point of a real run, and the resumes, are in tests/test_train.py.
"""

import os
import signal
import subprocess
import sys

import pytest

from agentrl_jax import chaos

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code: str, spec: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != chaos.ENV_VAR}
    if spec is not None:
        env[chaos.ENV_VAR] = spec
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )


# Reaches "update" three times and "rollout" once, printing before each reach.
PROGRAM = """
from agentrl_jax import chaos
for i in (1, 2, 3):
    print("update", i, flush=True)
    chaos.maybe_kill("update")
print("rollout", 1, flush=True)
chaos.maybe_kill("rollout")
print("end", flush=True)
"""


def test_the_nth_reach_of_the_armed_point_dies_by_sigkill():
    out = _run(PROGRAM, "update:2")
    assert out.returncode == -signal.SIGKILL
    assert out.stdout.split() == ["update", "1", "update", "2"]  # nothing ran past the 2nd
    assert out.stderr.strip().endswith("chaos: SIGKILL at update #2")


def test_unset_or_never_reached_is_a_no_op():
    for spec in (None, "", "update:4", "checkpoint:1"):
        out = _run(PROGRAM, spec)
        assert out.returncode == 0, (spec, out.stderr)
        assert out.stdout.split()[-1] == "end"


def test_ready_is_awaited_on_the_nth_reach_only():
    code = """
from agentrl_jax import chaos
polls = []
def ready(name):
    polls.append(name)
    print("poll", name, len(polls), flush=True)
    return len(polls) >= 3
chaos.settle_with(lambda: ready("settled"))
chaos.maybe_kill("update")  # the 1st reach: nothing polled
chaos.maybe_kill("checkpoint", ready=lambda: ready("own"))  # another point: nothing polled
chaos.maybe_kill("update")  # the 2nd: settle_with's test, polled until true, then the kill
"""
    out = _run(code, "update:2")
    assert out.returncode == -signal.SIGKILL
    assert out.stdout.splitlines() == ["poll settled 1", "poll settled 2", "poll settled 3"]
    out = _run(code.replace('"checkpoint", ready', '"update", ready'), "update:2")
    assert out.returncode == -signal.SIGKILL  # a point's own test replaces settle_with's
    assert out.stdout.splitlines() == ["poll own 1", "poll own 2", "poll own 3"]
    # A condition that never holds fails the run instead of killing it somewhere else.
    never = "from agentrl_jax import chaos\n"
    never += "chaos.maybe_kill('checkpoint', ready=lambda: False, timeout_s=0.05)"
    out = _run(never, "checkpoint:1")
    assert out.returncode == 1 and "chaos: checkpoint #1 was never ready within 0.05s" in out.stderr


@pytest.mark.parametrize("spec", ["updat:1", "update", "update:0", "update:x", ":2"])
def test_bad_spec_is_an_error_naming_the_variable_and_the_points(spec):
    with pytest.raises(ValueError, match=rf"AGENTRL_CHAOS_KILL='{spec}': expected POINT:N .*"):
        chaos.parse(spec)
    out = _run("import agentrl_jax.chaos", spec)
    assert out.returncode == 1 and "sft_step, sft_epoch, rollout, update, checkpoint" in out.stderr


def test_parse():
    assert chaos.parse("sft_epoch:3") == ("sft_epoch", 3)
    assert chaos.parse(None) is None and chaos.parse("") is None
