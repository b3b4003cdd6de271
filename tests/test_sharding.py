"""Meshes and logical-axis rules on 8 fake CPU devices: same numbers on every mesh."""

import inspect
import math
import os
import socket
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from agentrl_jax import sharding
from agentrl_jax.models import CausalLM, KVCache, ValueModel
from agentrl_jax.models.testing import TEST_CONFIG, random_model

MESHES = [(8, 1, 1), (2, 4, 1), (2, 2, 2)]
TOL = 1e-5  # fixed by the issue: f32 max abs diff against one device


def test_make_mesh():
    mesh = sharding.make_mesh((2, 2, 2))
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tp": 2}
    assert dict(sharding.make_mesh((-1, 2, 1)).shape) == {"data": 4, "fsdp": 2, "tp": 1}
    assert dict(sharding.make_mesh((1, 1, 1), jax.devices()[:1]).shape)["data"] == 1
    with pytest.raises(ValueError, match=r"needs 16 devices, but 8 are available"):
        sharding.make_mesh((4, 4, 1))
    with pytest.raises(ValueError, match="one size per axis"):
        sharding.make_mesh((8, 1))
    with pytest.raises(ValueError, match="not divisible by 3"):
        sharding.make_mesh((-1, 3, 1))


def test_logical_to_spec_rules():
    mesh = sharding.make_mesh((2, 2, 2))
    assert sharding.logical_to_spec(("vocab", "embed")) == P("tp", "fsdp")
    assert sharding.logical_to_spec(("embed", "q_heads", "head_dim")) == P("fsdp", "tp", None)
    assert sharding.logical_to_spec(("batch", "seq")) == P(("data", "fsdp"), None)
    # An axis that does not divide evenly is replicated: 3 kv heads on tp=2.
    assert sharding.logical_to_spec(("embed", "kv_heads"), (64, 3), mesh) == P("fsdp", None)
    # A mesh axis is used at most once per array.
    assert sharding.logical_to_spec(("embed", "embed"), (8, 8), mesh) == P("fsdp", None)
    with pytest.raises(KeyError, match="logical axis 'nope' has no entry"):
        sharding.logical_to_spec(("nope",))


def _loss(params, graphdef, tokens, mask):
    model = nnx.merge(graphdef, params)
    logits, _ = model(tokens, mask_bt=mask)
    logp = jax.nn.log_softmax(logits[:, :-1])
    nll = -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
    weight = mask[:, 1:] * mask[:, :-1]
    return jnp.sum(nll * weight) / jnp.sum(weight), logits


def _train_step(params, graphdef, tokens, mask):
    """Forward pass and one SGD step on a next-token cross-entropy."""
    (loss, logits), grads = jax.value_and_grad(_loss, has_aux=True)(params, graphdef, tokens, mask)
    new_params = jax.tree.map(lambda p, g: p - 0.5 * g, params, grads)
    return loss, logits, new_params


@pytest.fixture(scope="module")
def setup():
    # One layer: every sharded parameter kind, at half the compile time of two.
    model = random_model(CausalLM, TEST_CONFIG.replace(num_layers=1), seed=3)
    graphdef, params = nnx.split(model, nnx.Param)
    rng = np.random.RandomState(0)
    tokens = rng.randint(0, TEST_CONFIG.vocab_size, (8, 12)).astype(np.int32)
    mask = np.ones((8, 12), np.int32)
    mask[1, :5] = 0  # left padding
    mask[6, 9:] = 0  # right padding
    step = jax.jit(_train_step, static_argnums=1)
    ref = jax.device_get(step(params, graphdef, tokens, mask))
    return graphdef, params, tokens, mask, ref


def _expected_shard_shape(shape, spec, mesh):
    out = []
    for size, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        axes = () if axes is None else (axes,) if isinstance(axes, str) else axes
        out.append(size // math.prod(mesh.shape[a] for a in axes))
    return tuple(out)


@pytest.mark.parametrize("mesh_shape", MESHES, ids=lambda s: "x".join(map(str, s)))
def test_same_numbers_on_every_mesh(setup, mesh_shape):
    graphdef, params, tokens, mask, (ref_loss, ref_logits, ref_params) = setup
    mesh = sharding.make_mesh(mesh_shape)
    shardings = sharding.state_shardings(params, mesh)
    sharded = jax.device_put(params, shardings)
    data = sharding.named_sharding(mesh, ("batch", "seq"), tokens.shape)
    assert data.spec == P(("data", "fsdp"), None)
    step = jax.jit(
        _train_step,
        static_argnums=1,
        in_shardings=(shardings, data, data),
        out_shardings=(None, None, shardings),
    )
    with jax.set_mesh(mesh):  # also exercises the model's activation constraints
        loss, logits, new_params = step(sharded, graphdef, tokens, mask)
    data, fsdp, tp = mesh_shape
    assert logits.addressable_shards[0].data.shape == (8 // (data * fsdp), 12, 128 // tp)

    assert abs(float(loss) - float(ref_loss)) <= TOL
    assert float(np.abs(np.asarray(logits) - ref_logits).max()) <= TOL
    flat_new = dict(nnx.to_flat_state(new_params))
    for path, ref_var in nnx.to_flat_state(ref_params):
        got = flat_new[path].get_value()
        diff = float(np.abs(np.asarray(got) - ref_var.get_value()).max())
        assert diff <= TOL, (path, diff)

    # Parameters are really laid out as the rules say, before and after the step.
    for tree in (sharded, new_params):
        for path, var in nnx.to_flat_state(tree):
            value = var.get_value()
            axes = var.get_metadata()["logical_axes"]
            spec = sharding.logical_to_spec(axes, value.shape, mesh)
            assert value.sharding.spec == spec, path
            expected = _expected_shard_shape(value.shape, spec, mesh)
            assert {s.data.shape for s in value.addressable_shards} == {expected}, path
    emb = sharded["trunk"]["embed_vd"].get_value()
    tp, fsdp = mesh.shape["tp"], mesh.shape["fsdp"]
    assert emb.sharding.spec == P("tp", "fsdp")
    assert emb.addressable_shards[0].data.shape == (128 // tp, 64 // fsdp)
    gate = sharded["trunk"]["layers"][0]["mlp"]["gate_weight_df"].get_value()
    assert gate.addressable_shards[0].data.shape == (64 // fsdp, 96 // tp)


class _TwoParams(nnx.Module):
    """The smallest module with sharded parameters: compiles in a fraction of a Qwen2's time."""

    def __init__(self, rngs: nnx.Rngs):
        init = jax.nn.initializers.normal(1.0)
        self.table_vd = nnx.Param(init(rngs.params(), (128, 64)), logical_axes=("vocab", "embed"))
        self.scale_d = nnx.Param(jnp.ones((64,)), logical_axes=("norm",))


def test_create_sharded_model():
    mesh = sharding.make_mesh((2, 2, 2))
    model = sharding.create_sharded_model(lambda: _TwoParams(nnx.Rngs(0)), mesh)
    table = model.table_vd[...]
    assert table.sharding.spec == P("tp", "fsdp")
    assert {s.data.shape for s in table.addressable_shards} == {(64, 32)}
    assert model.scale_d[...].sharding.spec == P(None)
    plain = _TwoParams(nnx.Rngs(0))  # eager, unsharded: the same numbers
    np.testing.assert_allclose(table, plain.table_vd[...], atol=1e-6)
    assert float(jnp.std(table)) > 0.5  # really initialised

    # The Qwen2 policy's layout, from its abstract state alone (nothing is compiled).
    abstract = nnx.eval_shape(lambda: CausalLM(TEST_CONFIG, rngs=nnx.Rngs(0)))
    specs = sharding.state_specs(abstract, mesh)
    attn = specs["trunk"]["layers"][1]["attn"]
    assert attn["q_weight_dnh"] == P("fsdp", "tp", None)
    assert attn["o_weight_nhd"] == P("tp", None, "fsdp")
    assert specs["trunk"]["layers"][0]["mlp"]["down_weight_fd"] == P("tp", "fsdp")
    assert specs["trunk"]["final_norm"]["weight"] == P(None)


def test_value_model_from_sharded_policy():
    mesh = sharding.make_mesh((2, 2, 2))
    policy = random_model(CausalLM, TEST_CONFIG.replace(num_layers=1), mesh=mesh)
    value = ValueModel.from_policy(policy)
    for path, var in nnx.to_flat_state(nnx.state(value)):
        spec = sharding.logical_to_spec(var.get_metadata()["logical_axes"], var.shape, mesh)
        assert var.get_value().sharding == jax.sharding.NamedSharding(mesh, spec), path
    head = value.value_weight_d[...]
    assert head.sharding.spec == P("fsdp") and head.addressable_shards[0].data.shape == (32,)


def test_kv_cache_shardings():
    mesh = sharding.make_mesh((2, 2, 2))
    cache = KVCache.create(TEST_CONFIG, batch=8, size=16)
    shardings = sharding.kv_cache_shardings(cache, mesh)
    # Per layer: keys [B, K, H, S], values [B, K, S, H]; rows over (data, fsdp), heads over tp.
    assert len(shardings.keys) == len(shardings.values) == TEST_CONFIG.num_layers
    assert shardings.keys[0].spec == P(("data", "fsdp"), "tp", None, None)
    assert shardings.values[0].spec == P(("data", "fsdp"), "tp", None, None)
    assert shardings.lengths.spec == P(("data", "fsdp"))
    placed = jax.device_put(cache, shardings)
    assert placed.keys[0].addressable_shards[0].data.shape == (2, 1, 16, 16)
    assert placed.values[0].addressable_shards[0].data.shape == (2, 1, 16, 16)


def test_maybe_initialize_distributed_not_configured(monkeypatch):
    monkeypatch.delenv("AGENTRL_DISTRIBUTED", raising=False)
    assert sharding.maybe_initialize_distributed() is False
    with pytest.raises(ValueError, match="also needs num_processes and process_id"):
        sharding.maybe_initialize_distributed("localhost:1234")


def test_maybe_initialize_distributed_reads_the_scheduler_variables(monkeypatch):
    monkeypatch.delenv("AGENTRL_DISTRIBUTED", raising=False)
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "localhost:1234")
    monkeypatch.setenv("JAX_NUM_PROCESSES", "two")
    with pytest.raises(ValueError, match="JAX_NUM_PROCESSES='two' is not an integer"):
        sharding.maybe_initialize_distributed()
    monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
    monkeypatch.delenv("JAX_PROCESS_ID", raising=False)
    with pytest.raises(ValueError, match=r"num_processes=2, process_id=None"):
        sharding.maybe_initialize_distributed()


def test_distributed_timeouts_reach_jax_where_it_accepts_them(monkeypatch):
    # The installed JAX takes both: a hung host then fails the run instead of holding it.
    accepted = inspect.signature(jax.distributed.initialize).parameters
    assert {"initialization_timeout", "heartbeat_timeout_seconds"} <= set(accepted)
    calls = []

    def older_initialize(coordinator_address=None, num_processes=None, process_id=None,
                         initialization_timeout=300):  # fmt: skip
        calls.append(dict(initialization_timeout=initialization_timeout))

    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(jax.distributed, "initialize", older_initialize)
    assert sharding.maybe_initialize_distributed(
        "localhost:1", 1, 0, initialization_timeout_s=30, heartbeat_timeout_s=20
    )
    assert calls == [dict(initialization_timeout=30)]  # the one it lacks is left out

    def initialize(coordinator_address=None, num_processes=None, process_id=None,
                   initialization_timeout=300, heartbeat_timeout_seconds=100):  # fmt: skip
        calls.append(dict(coordinator_address=coordinator_address, num_processes=num_processes,
                          process_id=process_id, initialization_timeout=initialization_timeout,
                          heartbeat_timeout_seconds=heartbeat_timeout_seconds))  # fmt: skip

    monkeypatch.setattr(jax.distributed, "initialize", initialize)
    sharding.maybe_initialize_distributed("localhost:1", 1, 0, heartbeat_timeout_s=20)
    assert calls[-1] == dict(
        coordinator_address="localhost:1", num_processes=1, process_id=0,
        initialization_timeout=300, heartbeat_timeout_seconds=20,
    )  # fmt: skip


@pytest.mark.slow
def test_two_process_distributed_start(tmp_path):
    """Two local processes start the multi-controller runtime and see each other's devices."""
    with socket.socket() as probe:  # a free port for the coordinator
        probe.bind(("localhost", 0))
        port = probe.getsockname()[1]
    script = textwrap.dedent(
        f"""
        import sys, jax
        from agentrl_jax import sharding
        pid = int(sys.argv[1])
        assert sharding.maybe_initialize_distributed("localhost:{port}", 2, pid)
        mesh = sharding.make_mesh((-1, 1, 1))
        print(pid, jax.process_count(), jax.device_count(), dict(mesh.shape)["data"])
        """
    )
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    env["JAX_PLATFORMS"] = "cpu"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(i)], env=env, stdout=subprocess.PIPE, text=True
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=120)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sorted(outs) == [["0", "2", "4", "4"], ["1", "2", "4", "4"]]


def test_rollout_mesh_sampler_plays_on_its_own_devices_as_on_the_learners():
    """``config.rollout_mesh``: the sampler's copy of the policy moves to devices of its own
    (``build.sync_sampler`` with the rollout's mesh), device to device; laid out there as on the
    learner's mesh of the same shape, a turn is the same program on other devices: the same
    tokens and log-probs, bit for bit."""
    from agentrl_jax.run import build
    from agentrl_jax.sampling import Sampler, SamplingParams

    devices = jax.devices()
    learner_mesh = sharding.make_mesh((1, 2, 1), devices[:2])
    rollout_mesh = sharding.make_mesh((1, 2, 1), devices[2:4])
    policy = sharding.create_sharded_model(
        lambda: CausalLM(TEST_CONFIG, rngs=nnx.Rngs(0)), learner_mesh
    )
    params = nnx.state(policy)
    sampling = SamplingParams(temperature=1.0)
    on_learner = Sampler(policy, sampling=sampling, mesh=learner_mesh)
    apart = Sampler(policy, sampling=sampling, mesh=rollout_mesh)
    build.sync_sampler(apart, params, jnp.float32, rollout=rollout_mesh)
    placed = {d for x in jax.tree.leaves(apart.state) for d in x.devices()}
    assert placed == set(devices[2:4]) and apart._owned
    assert all(x.is_deleted() is False for x in jax.tree.leaves(params))  # the learner's stay
    prompts = np.random.default_rng(0).integers(0, TEST_CONFIG.vocab_size, (4, 9))
    keys = jax.random.split(jax.random.key(1), 4)
    outs = []
    for sampler in (on_learner, apart):
        out = sampler.step_turn(sampler.start(4, 32), prompts, 8, keys)
        outs.append((np.asarray(out.tokens), np.asarray(out.logprobs)))
        assert {d for d in out.tokens.devices()} <= set(sampler.mesh.devices.flat)
    np.testing.assert_array_equal(outs[0][0], outs[1][0])
    np.testing.assert_array_equal(outs[0][1], outs[1][1])
