"""The memory plan: every program of a run compiled abstractly, bytes per device, clear errors."""

import json
import os
import subprocess
import sys

import jax
import pytest
from train_cli import REPO

from agentrl_jax.training import plan
from agentrl_jax.training.config import ConfigError, from_config_dict, load_config_file


def _config(spec, num_devices, **mesh):
    cd = load_config_file(spec)
    if mesh:
        cd.mesh = mesh["mesh"]
    return from_config_dict(cd, num_devices=num_devices)


@pytest.mark.slow
def test_tiny_plan_has_every_program_with_bytes_beside_the_analytic_state():
    # 4 of the conftest's 8 fake CPU devices: FSDP over 2, tensor parallel over 2.
    result = plan.memory_plan(_config("configs/tiny_textworld.py:test", 4, mesh=(1, 2, 2)))
    result = json.loads(json.dumps(result))  # what --out writes
    assert result["devices"] == 4 and result["mesh"] == [1, 2, 2]
    names = [p["name"] for p in result["programs"]]
    assert names == ["sampler_turn", "sft_step", "score", "rl_update"]
    for p in result["programs"]:
        b = p["per_device_bytes"]
        assert set(b) >= {"arguments", "outputs", "temporaries", "total"}, p["name"]
        assert min(b["arguments"], b["outputs"], b["total"]) > 0, p
        assert b["total"] == b["arguments"] + b["outputs"] + b["temporaries"] - b["aliased"]
        assert p["compile_s"] > 0
    update = result["programs"][names.index("rl_update")]
    analytic = update["analytic_bytes"]
    assert analytic["optimizer"] == 2 * analytic["params"]  # float32 parameters, Adam mu and nu
    # The donated state is among the arguments: parameters and moments, each device its shard.
    assert update["per_device_bytes"]["arguments"] >= analytic["params"] + analytic["optimizer"]
    assert update["per_device_bytes"]["aliased"] >= analytic["params"] + analytic["optimizer"]
    assert result["largest"] in names
    assert "largest program:" in plan.format_table(result)


def test_device_bytes_counts_one_shard():
    mesh = jax.make_mesh((4,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
    split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))
    x = jax.ShapeDtypeStruct((8, 3), "float32", sharding=split)
    assert plan.device_bytes({"a": x, "b": jax.ShapeDtypeStruct((5,), "int8")}) == 2 * 3 * 4 + 5


def test_rows_and_rollout_batch_follow_the_config():
    alfworld = _config("configs/alfworld_gagpo.py", None)
    # Step contexts: a row per step of every episode, padded to whole minibatches of 64.
    assert plan.iteration_rows(alfworld) == 6400  # 16 tasks x 8 rollouts x 50 turns
    assert plan.rollout_batch(alfworld) == 128  # 16 x 8 envs hold all 16 groups of 8
    textworld = _config("configs/textworld_qwen2_5_1_5b_ppo.py", None)
    assert plan.iteration_rows(textworld) == 256  # one row per episode
    assert (
        plan.rollout_batch(textworld) == textworld.env.num_workers * textworld.env.envs_per_worker
    )


def test_mesh_minus_one_takes_the_devices_left():
    assert _config("configs/tiny_textworld.py", 8, mesh=(1, -1, 2)).mesh == (1, 4, 2)
    with pytest.raises(ConfigError, match=r"needs a multiple of 3 devices; this run has 8"):
        _config("configs/tiny_textworld.py", 8, mesh=(3, -1, 1))
    with pytest.raises(ConfigError, match=r"config.mesh is \(-1, -1, 1\)"):
        _config("configs/tiny_textworld.py", 8, mesh=(-1, -1, 1))


def _plan_cli(*args):
    cmd = [sys.executable, "-m", "launch.plan", "--config=configs/tiny_textworld.py:test", *args]
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stderr.strip().splitlines()


def test_cli_bad_config_key_or_mesh_is_one_line_and_exit_2():
    rc, lines = _plan_cli("--devices=2", "--config.rl.minibatch=4")
    assert rc == 2 and len(lines) == 1
    assert lines[0].startswith("config error: config.rl has no key 'minibatch' (did you mean")
    rc, lines = _plan_cli("--devices=2")  # the :test config's mesh is (1, 1, 1)
    assert rc == 2 and len(lines) == 1
    assert lines[0].startswith(
        "config error: config.mesh=(1, 1, 1) needs 1 devices; this run has 2"
    )
