"""The memory plan: every program of a run compiled abstractly, bytes per device, clear errors."""

import json
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from train_cli import REPO

from agentrl_jax.experiments import plan
from agentrl_jax.models.config import preset
from agentrl_jax.run.config import ConfigError, from_config_dict, load_config_file

# A Qwen3-MoE of 2 layers with 8 routed experts of width 32, 2 a token (the qwen3-30b-a3b
# preset's family, shrunk).
TINY_MOE = dict(
    vocab_size=512, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4,
    num_kv_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
)  # fmt: skip


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
    # The sampler reads the train state's float32 parameters (CPU: float32 compute, no copy).
    sampler = result["sampler"]
    assert sampler["mesh"] == [1, 2, 2] and sampler["dtype"] == "float32" and not sampler["owned"]
    turn = result["programs"][names.index("sampler_turn")]
    assert sampler["params_bytes"] == turn["analytic_bytes"]["params"] == analytic["params"]
    assert "sampler: mesh" in plan.format_table(result)


@pytest.mark.slow
def test_multi_host_plan_runs_the_sampler_on_one_hosts_copy():
    cd = load_config_file("configs/tiny_textworld.py")
    cd.mesh, cd.model.dtype = (2, 4, 1), "bfloat16"
    config = from_config_dict(cd, num_devices=8)
    one = plan.memory_plan(config, programs=("sampler_turn",))
    hosts = plan.memory_plan(config, programs=("sampler_turn",), local_devices=4)
    assert one["sampler"]["owned"] and one["sampler"]["mesh"] == [2, 4, 1]
    assert hosts["sampler"]["mesh"] == [2, 1, 2] and hosts["sampler"]["dtype"] == "bfloat16"
    # bf16 and split over tp = 2: a quarter of the float32 replica it replaced, and the norms.
    assert 3 * hosts["sampler"]["params_bytes"] < hosts["sampler"]["f32_replica_bytes"]
    turn = hosts["programs"][0]
    assert turn["analytic_bytes"]["params"] == hosts["sampler"]["params_bytes"]
    # The train state's float32 policy stays alive beside the sampler's copy.
    assert turn["per_device_bytes"]["resident"] >= one["programs"][0]["analytic_bytes"]["params"]
    with pytest.raises(ValueError, match=r"local_devices=3: expected a divisor of the mesh's 8"):
        plan.memory_plan(config, programs=("sampler_turn",), local_devices=3)


@pytest.mark.slow
def test_lora_plan_trains_adapters_only_against_the_base_as_reference():
    # The :test run with a KL reference, planned as a full fine-tune and with LoRA (rank 4, all
    # projections) on 4 fake CPU devices: the learner's programs only (the cheap ones).
    cd = load_config_file("configs/tiny_textworld.py:test")
    cd.mesh, cd.rl.kl_coef = (1, 2, 2), 0.01
    full_config = from_config_dict(cd, num_devices=4)
    cd.model.lora.rank = 4
    lora_config = from_config_dict(cd, num_devices=4)
    programs = ("score", "rl_update")
    full = plan.memory_plan(full_config, programs=programs)
    lora = plan.memory_plan(lora_config, programs=programs)
    assert full["model"]["lora"] is None
    assert lora["model"]["lora"] == {
        "rank": 4,
        "targets": ["q", "k", "v", "o", "gate", "up", "down"],
        "base_dtype": "float32",
    }
    by_name = lambda p: {x["name"]: x for x in p["programs"]}  # noqa: E731
    full_update, lora_update = by_name(full)["rl_update"], by_name(lora)["rl_update"]
    full_score, lora_score = by_name(full)["score"], by_name(lora)["score"]
    # Adam's moments are the adapters' alone (the :test run has no critic): 2 x 4 bytes per
    # adapter element on a device, far below the full fine-tune's.
    assert not lora_config.needs_critic
    from flax import nnx

    from agentrl_jax.models import CausalLM

    model_cfg = _abstract_policy(lora_config)[0]
    lora_cfg = model_cfg.replace(lora=lora_config.model.lora.lora_config())
    with_adapters = nnx.eval_shape(lambda: CausalLM(lora_cfg, rngs=nnx.Rngs(0)))
    adapters = nnx.state(with_adapters, nnx.LoRAParam)
    adapter_elems = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(adapters))
    lora_adam = lora_update["analytic_bytes"]["optimizer"]
    full_adam = full_update["analytic_bytes"]["optimizer"]
    assert 0 < lora_adam <= 2 * 4 * adapter_elems  # each device its shard of the adapters
    assert full_adam == 2 * full_update["analytic_bytes"]["params"]
    assert 10 * lora_adam < full_adam
    # The donated state is the smaller by the moments the frozen base no longer has.
    full_args = full_update["per_device_bytes"]["arguments"]
    assert lora_update["per_device_bytes"]["arguments"] < full_args - (full_adam - lora_adam) / 2
    # The reference is the policy's own base: nothing resident beside the update (the full
    # fine-tune keeps a float32 copy), and the score's second reading of it is not counted twice.
    assert full_update["per_device_bytes"]["resident"] > 0
    assert lora_update["per_device_bytes"]["resident"] == 0
    shared = lora_score["per_device_bytes"]["shared"]
    assert shared > 0 and "shared" not in full_score["per_device_bytes"]
    b = lora_score["per_device_bytes"]
    assert b["total"] == b["arguments"] + b["outputs"] + b["temporaries"] - b["aliased"] - shared
    # The frozen base in bf16: the update's donated state holds half its bytes.
    cd.model.lora.base_dtype = "bfloat16"
    bf16 = plan.memory_plan(from_config_dict(cd, num_devices=4), programs=("rl_update",))
    assert bf16["model"]["lora"]["base_dtype"] == "bfloat16"
    bf16_args = by_name(bf16)["rl_update"]["per_device_bytes"]["arguments"]
    base = lora_update["analytic_bytes"]["params"]  # the base's f32 bytes (adapters aside)
    lora_args = lora_update["per_device_bytes"]["arguments"]
    assert lora_args - bf16_args == pytest.approx(base / 2, rel=0.1)


def test_lora_sampler_copy_is_the_merged_base_in_the_compute_dtype():
    cd = load_config_file("configs/tiny_textworld.py")
    cd.mesh, cd.model.dtype, cd.model.lora.rank = (2, 4, 1), "bfloat16", 8
    config = from_config_dict(cd, num_devices=8)
    from flax import nnx

    from agentrl_jax import sharding
    from agentrl_jax.models import CausalLM
    from agentrl_jax.run.build import model_config, rl_learner

    model_cfg = model_config(config)
    lora_cfg = model_cfg.replace(lora=config.model.lora.lora_config())
    policy = nnx.eval_shape(lambda: CausalLM(lora_cfg, rngs=nnx.Rngs(0)))
    mesh = sharding.make_mesh(config.mesh, jax.devices()[:8])
    state = rl_learner(config, policy, None, mesh).abstract_state(policy)
    sampler_mesh, params, owned = plan.sampler_copy(model_cfg, state.policy, mesh, lora=True)
    assert owned and sampler_mesh is mesh
    leaves = jax.tree.leaves(params)
    assert {np.dtype(x.dtype).name for x in leaves} == {"bfloat16"}
    # No adapter in it: the merged model has the base's parameters only, in bf16.
    base = nnx.split_state(state.policy, nnx.LoRAParam, ...)[1]
    assert plan.device_bytes(params) * 2 == plan.device_bytes(base)
    assert len(leaves) == len(jax.tree.leaves(base)) < len(jax.tree.leaves(state.policy))


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


def _abstract_policy(config):
    from flax import nnx

    from agentrl_jax import sharding
    from agentrl_jax.models import CausalLM
    from agentrl_jax.run.build import model_config, rl_learner

    model_cfg = model_config(config)
    policy = nnx.eval_shape(lambda: CausalLM(model_cfg, rngs=nnx.Rngs(0)))
    mesh = sharding.make_mesh(config.mesh, jax.devices()[: int(np.prod(config.mesh))])
    state = rl_learner(config, policy, None, mesh).abstract_state(policy)
    return model_cfg, state.policy, mesh


def test_sampler_copy_is_planned_in_the_compute_dtype_on_the_hosts_mesh():
    # One host, float32 compute: the sampler reads the train state's own arrays.
    config = _config("configs/tiny_textworld.py:test", 8, mesh=(2, 4, 1))
    model_cfg, policy, mesh = _abstract_policy(config)
    sampler_mesh, params, owned = plan.sampler_copy(model_cfg, policy, mesh)
    assert sampler_mesh is mesh and params is policy and not owned
    # One host, bf16 compute over float32 parameters: a bf16 copy in the train state's layout.
    # (The tiny config's model: 4 query and 2 kv heads; the :test one has a single kv head.)
    cd = load_config_file("configs/tiny_textworld.py")
    cd.mesh, cd.model.dtype = (2, 4, 1), "bfloat16"
    model_cfg, policy, mesh = _abstract_policy(from_config_dict(cd, num_devices=8))
    sampler_mesh, params, owned = plan.sampler_copy(model_cfg, policy, mesh)
    assert owned and plan.device_bytes(params) * 2 == plan.device_bytes(policy)
    # Hosts of 4 devices: each one's copy is split over tp (the tiny model's 2 kv heads: 2).
    sampler_mesh, params, owned = plan.sampler_copy(model_cfg, policy, mesh, local_devices=4)
    assert dict(sampler_mesh.shape) == {"data": 2, "fsdp": 1, "tp": 2} and owned
    replica = 2 * model_cfg.num_params  # the whole policy in bf16 on every device
    assert replica / 2 <= plan.device_bytes(params) < 0.6 * replica  # split over tp = 2
    layer = params["trunk"]["layers"][0]["mlp"]["up_weight_df"].get_value()
    assert layer.dtype == jnp.bfloat16 and layer.sharding.shard_shape(layer.shape) == (128, 192)


def _tpu_plan_cli(*args):
    """launch.plan --topology, which finds libtpu where scripts/test.sh installs it (or skip)."""
    if not os.path.isdir(os.path.join(REPO, ".venv", "tpu_plan", "libtpu")):
        pytest.skip("libtpu is not in .venv/tpu_plan (scripts/test.sh installs it there)")
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
    cmd = [sys.executable, "-m", "launch.plan", "--config=configs/tiny_textworld.py:test", *args]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def test_plan_compiles_with_the_tpu_compiler_for_a_slice_it_does_not_have(tmp_path):
    out = tmp_path / "plan.json"
    proc = _tpu_plan_cli(
        "--devices=4",
        "--topology=v5e:2x2",
        "--config.mesh=(1,2,2)",
        "--programs=sampler_turn,rl_update",
        f"--out={out}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["platform"] == "tpu" and result["device_kind"].startswith("TPU v5")
    assert result["devices"] == 4 and result["mesh"] == [1, 2, 2]
    assert [p["name"] for p in result["programs"]] == ["sampler_turn", "rl_update"]
    for p in result["programs"]:
        b = p["per_device_bytes"]
        assert min(b["arguments"], b["outputs"], b["total"]) > 0, p
    # The CPU plan of the same programs is another compiler's: the figures differ.
    cpu = plan.memory_plan(
        _config("configs/tiny_textworld.py:test", 4, mesh=(1, 2, 2)),
        programs=("sampler_turn",),
    )
    assert cpu["platform"] == "cpu"
    tpu_turn, cpu_turn = result["programs"][0], cpu["programs"][0]
    assert tpu_turn["per_device_bytes"] != cpu_turn["per_device_bytes"]


def test_a_bad_topology_is_one_clear_line():
    proc = _tpu_plan_cli("--devices=4", "--topology=v5e:9x9x9", "--config.mesh=(1,2,2)")
    assert proc.returncode == 2
    assert "--topology='v5e:9x9x9': no TPU compiler for it" in proc.stderr.strip().splitlines()[-1]
    proc = _tpu_plan_cli("--devices=8", "--topology=v5e:2x2", "--config.mesh=(1,4,2)")
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert "--topology=v5e:2x2 has 4 chips; --devices=8" in last


def test_rollout_mesh_plans_the_sampler_on_devices_of_its_own():
    """``config.rollout_mesh``: the learner's programs on the first devices, the sampler's turn
    on the next ones with its own copy of the policy and nothing of the learner's beside it."""
    cd = load_config_file("configs/tiny_textworld.py:test")
    cd.mesh, cd.rollout_mesh = (1, 2, 1), (1, 1, 2)
    config = from_config_dict(cd, num_devices=4)
    assert config.mesh == (1, 2, 1) and config.rollout_mesh == (1, 1, 2)
    apart = plan.memory_plan(config, programs=("sampler_turn",))
    cd.rollout_mesh = ()
    shared = plan.memory_plan(from_config_dict(cd, num_devices=2), programs=("sampler_turn",))
    s = apart["sampler"]
    assert s["mesh"] == [1, 1, 2] and s["own_devices"] and s["owned"]
    assert not shared["sampler"]["own_devices"]
    assert apart["programs"][0]["per_device_bytes"]["resident"] == 0
    assert shared["programs"][0]["per_device_bytes"]["resident"] > 0  # moments beside it
    assert apart["devices"] == 2 and apart["rollout_devices"] == 2
    table = plan.format_table(apart)
    assert "devices: 2 (+ 2 for rollouts)" in table
    assert "on devices of its own (config.rollout_mesh)" in table
    cd.mesh, cd.rollout_mesh = (1, 4, 1), (1, 1, 2)
    with pytest.raises(ConfigError, match=r"rollout_mesh=\(1, 1, 2\) takes 2 of the 4 devices"):
        from_config_dict(cd, num_devices=4)
    cd.rollout_mesh = (1, 0, 2)
    with pytest.raises(ConfigError, match="config.rollout_mesh is .*; expected \\(\\) "):
        from_config_dict(cd, num_devices=8)


def test_rollout_mesh_with_an_expert_axis_plans_the_experts_split_over_it():
    """``config.rollout_mesh`` of four sizes: the plan reports the rollout mesh's axes, expert
    among them, and the sampler's copy there holds half the routed experts' weights a device on
    (1, 1, 1, 2)."""
    cd = load_config_file("configs/tiny_textworld.py:test")
    cd.model.preset = "qwen3-30b-a3b"
    cd.model.overrides = dict(TINY_MOE)
    cd.mesh, cd.rollout_mesh = (1, 1, 1), (1, 1, 1, 2)
    result = plan.memory_plan(from_config_dict(cd, num_devices=3), programs=("sampler_turn",))
    result = json.loads(json.dumps(result))
    s = result["sampler"]
    assert result["mesh_axes"] == ["data", "fsdp", "tp"] and result["rollout_devices"] == 2
    assert s["mesh"] == [1, 1, 1, 2] and s["mesh_axes"] == ["data", "fsdp", "tp", "expert"]
    assert s["own_devices"] and s["owned"] and s["dtype"] == "float32"
    table = plan.format_table(result)
    assert "sampler: mesh {'data': 1, 'fsdp': 1, 'tp': 1, 'expert': 2}" in table
    # The routed experts: 2 layers x 8 experts x 3 x [64, 32] float32, halved by expert=2.
    cfg = preset("qwen3-30b-a3b", **cd.model.overrides)
    experts = cfg.num_layers * cfg.num_experts * 3 * 64 * 32 * 4
    assert s["f32_replica_bytes"] - s["params_bytes"] == experts // 2


def test_async_plan_holds_the_background_rollout_beside_score_and_update():
    """``rl.max_staleness`` > 0 on the learner's devices: the rollout played ahead (the
    sampler's own copy of the policy, its KV cache and the turn's temporaries) is resident
    beside ``score`` and ``rl_update``; with ``rollout_mesh`` it runs on devices of its own."""
    cd = load_config_file("configs/tiny_textworld.py:test")
    cd.mesh = (1, 2, 1)
    learner = ("score", "rl_update")
    sync = plan.memory_plan(from_config_dict(cd, num_devices=2), programs=learner)
    cd.rl.max_staleness = 1
    ahead = plan.memory_plan(from_config_dict(cd, num_devices=2), programs=learner)
    copy = ahead["sampler"]["params_bytes"]
    assert copy > 0 and ahead["sampler"]["owned"]  # a copy of its own (the update donates)
    assert [p["name"] for p in ahead["programs"]] == list(learner)
    for a, s in zip(ahead["programs"], sync["programs"], strict=True):
        grown = a["per_device_bytes"]["peak"] - s["per_device_bytes"]["peak"]
        assert grown >= copy, (a["name"], grown, copy)
        assert grown == a["per_device_bytes"]["rollout"]  # the turn's total, in resident
    assert "beside score and rl_update" in plan.format_table(ahead)
    # Disaggregated rollouts: nothing of the sampler's beside the learner's programs.
    cd.rollout_mesh = (1, 1, 2)
    apart = plan.memory_plan(from_config_dict(cd, num_devices=4), programs=learner)
    for a, s in zip(apart["programs"], sync["programs"], strict=True):
        assert a["per_device_bytes"]["peak"] == s["per_device_bytes"]["peak"], a["name"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen3-0.6b", "llama3.2-1b", "gemma3-1b"])
def test_family_presets_plan(name):
    """Each family's smallest preset plans (its real shapes, 4 fake devices, FSDP and TP)."""
    cd = load_config_file("configs/tiny_textworld.py:test")
    cd.mesh, cd.model.preset, cd.model.overrides = (1, 2, 2), name, {}
    result = json.loads(json.dumps(plan.memory_plan(from_config_dict(cd, num_devices=4))))
    assert result["model"]["params"] == preset(name).num_params
    names = [p["name"] for p in result["programs"]]
    assert names == ["sampler_turn", "sft_step", "score", "rl_update"]
    assert all(p["per_device_bytes"]["total"] > 0 for p in result["programs"])


@pytest.mark.slow  # 1.5 min of CPU compiling; 6 to 13 min on a shared 2-core machine
def test_expert_axis_plans_the_experts_split_over_it():
    """``config.mesh`` with a fourth size: the plan builds the (data, fsdp, tp, expert) mesh
    and reports it (the sampler's too); every program compiles on it, and the SFT step holds
    half the routed experts' weights a device on (1, 2, 1, 2) that it holds on (1, 2, 1, 1)."""
    cd = load_config_file("configs/tiny_textworld.py:test")
    cd.model.preset = "qwen3-30b-a3b"
    cd.model.overrides = dict(TINY_MOE)
    plans = {}
    for mesh, programs in [((1, 2, 1, 1), ("sft_step",)), ((1, 2, 1, 2), None)]:
        cd.mesh = mesh
        config = from_config_dict(cd, num_devices=math.prod(mesh))
        plans[mesh] = json.loads(json.dumps(plan.memory_plan(config, programs=programs)))
    result = plans[(1, 2, 1, 2)]
    assert result["devices"] == 4 and result["mesh"] == [1, 2, 1, 2]
    assert result["mesh_axes"] == ["data", "fsdp", "tp", "expert"]
    assert result["sampler"]["mesh"] == [1, 2, 1, 2]
    assert result["sampler"]["mesh_axes"] == result["mesh_axes"]
    table = plan.format_table(result)
    assert "mesh {'data': 1, 'fsdp': 2, 'tp': 1, 'expert': 2}" in table
    assert "sampler: mesh {'data': 1, 'fsdp': 2, 'tp': 1, 'expert': 2}" in table
    names = [p["name"] for p in result["programs"]]
    assert names == ["sampler_turn", "sft_step", "score", "rl_update"]
    # The routed experts: 2 layers x 8 experts x 3 x [64, 32] float32, halved by expert=2.
    cfg = preset("qwen3-30b-a3b", **cd.model.overrides)
    experts = cfg.num_layers * cfg.num_experts * 3 * 64 * 32 * 4
    sft = {m: next(p for p in r["programs"] if p["name"] == "sft_step") for m, r in plans.items()}
    params = {m: p["analytic_bytes"]["params"] for m, p in sft.items()}
    assert params[(1, 2, 1, 1)] - params[(1, 2, 1, 2)] == experts // 2 // 2  # of fsdp's half
