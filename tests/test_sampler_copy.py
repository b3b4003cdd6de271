"""The sampler's copy of the policy: compute dtype, split over the host's devices, one at a time.

On 8 fake CPU devices standing for one host: the train state lives on a (2, 4, 1) mesh in
float32; the sampler's copy (``multihost.local_copy``) goes to the host's (data, 1, tp) mesh,
``sync_sampler`` releases the previous copy before it builds the next (the trainer holds one for a
``with`` block only: ``Trainer.policy_in_sampler``), and a sampler on the
tp-split copy plays the same turns as one on a replicated copy.
"""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from agentrl_jax import sharding
from agentrl_jax.experiments.plan import device_bytes
from agentrl_jax.models import CausalLM
from agentrl_jax.models.testing import random_model
from agentrl_jax.run import build, multihost, trainer
from agentrl_jax.sampling import Sampler, SamplingParams
from agentrl_jax.sampling.testing import SMALL

# 4 query and 4 kv heads: tp takes 4 of the 8 devices, rows the other 2.
CFG = SMALL.replace(num_kv_heads=4)
BUCKETS = dict(cache_buckets=[64], chunk_buckets=[16], width_buckets=[8])
SAMPLED = SamplingParams(temperature=1.0)


@pytest.fixture(scope="module")
def policy():
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (tests/conftest.py fakes 8 CPU devices)")
    model = random_model(CausalLM, CFG, seed=4, mesh=sharding.make_mesh((2, 4, 1)))
    return model, nnx.state(model, nnx.Param)


def test_sampler_mesh_splits_heads_over_the_most_devices_they_divide():
    assert multihost.sampler_mesh_shape(CFG, 8) == (2, 1, 4)
    assert multihost.sampler_mesh_shape(SMALL, 8) == (4, 1, 2)  # 2 kv heads
    qwen_7b = CFG.replace(num_heads=28, num_kv_heads=4)
    assert multihost.sampler_mesh_shape(qwen_7b, 8) == (2, 1, 4)
    assert multihost.sampler_mesh_shape(qwen_7b, 4) == (1, 1, 4)
    assert multihost.sampler_mesh_shape(CFG.replace(num_heads=3, num_kv_heads=3), 8) == (8, 1, 1)


def test_local_copy_is_in_the_compute_dtype_and_split_over_the_local_mesh(policy):
    _, params = policy
    local = multihost.local_mesh(CFG)
    assert dict(local.shape) == {"data": 2, "fsdp": 1, "tp": 4}
    copy = multihost.local_copy(params, local, jnp.bfloat16)
    for got, want in zip(jax.tree.leaves(copy), jax.tree.leaves(params)):
        assert got.dtype == jnp.bfloat16 and got.sharding.mesh == local
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want).astype(jnp.bfloat16))
    layer = copy["trunk"]["layers"][0]
    assert _shard(layer["mlp"]["gate_weight_df"]) == (64, 128 // 4)  # MLP width over tp
    assert _shard(layer["attn"]["q_weight_dnh"]) == (64, 4 // 4, 16)  # heads over tp
    assert _shard(layer["attn"]["k_weight_dkh"]) == (64, 4 // 4, 16)
    assert _shard(copy["trunk"]["embed_vd"]) == (256 // 4, 64)  # vocabulary over tp
    # Bytes per device: every weight matrix and head bias is split 4 ways, the norms are whole.
    # The replica this replaces held every parameter in float32 on every device.
    split = sum(x.size * 2 // 4 for x in jax.tree.leaves(params) if x.ndim > 1)
    whole = sum(x.size * 2 for x in jax.tree.leaves(params) if x.ndim == 1)
    assert device_bytes(copy) == split + whole
    assert device_bytes(copy) * 7 < CFG.num_params * 4


def _shard(var) -> tuple[int, ...]:
    """The shape of one device's shard of a parameter."""
    x = var[...]
    return x.sharding.shard_shape(x.shape)


def _spy_on(monkeypatch, module, name, state):
    """Wraps ``module.name`` to record whether the sampler's old arrays were deleted when the
    new copy started to be built."""
    real = getattr(module, name)
    seen = []

    def spy(*args, **kwargs):
        seen.append(all(x.is_deleted() for x in state["old"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    return seen


def test_sync_releases_the_old_copy_before_building_the_new_one(policy, monkeypatch):
    model, params = policy
    local = multihost.local_mesh(CFG)
    sampler = Sampler(model, mesh=local)
    state = {"old": []}
    seen = _spy_on(monkeypatch, multihost, "local_copy", state)
    for _ in range(3):
        build.sync_sampler(sampler, params, jnp.bfloat16, local)
        state["old"] = jax.tree.leaves(sampler.state)
    # The first sync borrowed nothing it could delete (the module's own arrays stay alive).
    assert seen == [True, True, True]
    assert not any(x.is_deleted() for x in jax.tree.leaves(params))
    assert all(x.dtype == jnp.bfloat16 for x in state["old"])
    sampler.release()
    assert all(x.is_deleted() for x in state["old"]) and sampler.state is None

    # One host, float32 compute: the train state's arrays, borrowed, never deleted.
    single = Sampler(model, mesh=params["trunk"]["embed_vd"][...].sharding.mesh)
    build.sync_sampler(single, params, jnp.float32)
    assert single.state is params
    build.sync_sampler(single, params, jnp.float32)
    assert not any(x.is_deleted() for x in jax.tree.leaves(params))
    # One host, bf16 compute over float32 parameters: a bf16 copy in the train state's layout,
    # owned, and deleted by the next sync before it casts again.
    state["old"] = []
    seen = _spy_on(monkeypatch, sharding, "cast_copy", state)
    build.sync_sampler(single, params, jnp.bfloat16)
    state["old"] = jax.tree.leaves(single.state)
    for got, want in zip(state["old"], jax.tree.leaves(params)):
        assert got.dtype == jnp.bfloat16 and got.sharding.is_equivalent_to(want.sharding, got.ndim)
    build.sync_sampler(single, params, jnp.bfloat16)
    assert seen == [True, True]
    assert not any(x.is_deleted() for x in jax.tree.leaves(params))


def test_tp_split_sampler_plays_the_replicated_samplers_turns(policy):
    model, params = policy
    local = multihost.local_mesh(CFG)
    split = Sampler(model, mesh=local, **BUCKETS)
    build.sync_sampler(split, params, jnp.float32, local)
    assert _shard(split.state["trunk"]["layers"][0]["mlp"]["up_weight_df"]) == (64, 128 // 4)
    # The layout the sampler had before: every parameter whole on every device.
    everywhere = sharding.make_mesh((8, 1, 1))
    replicated = Sampler(model, mesh=everywhere, **BUCKETS)
    replicated.set_state(jax.device_put(params, NamedSharding(everywhere, PartitionSpec())))
    rng = np.random.default_rng(0)
    turns = [
        [rng.integers(1, CFG.vocab_size, n).tolist() for n in lengths]
        for lengths in ([5, 12, 1, 9], [3, 0, 7, 2], [2, 4, 0, 6], [1, 1, 3, 2])
    ]
    outs = []
    for sampler in (replicated, split):
        cache, got = sampler.start(4, 64), []
        for t, new in enumerate(turns):
            # Drawn at temperature 1 (greedy turns on a split mesh: test_sampler_sharding.py).
            out = sampler.step_turn(cache, new, 8, jax.random.key(t), sampling=SAMPLED)
            cache = out.cache
            got.append(out)
        outs.append(got)
    assert cache.keys[0].sharding.spec[1] == "tp"  # the KV cache's heads are split too
    for ref, got in zip(*outs):
        assert got.token_lists() == ref.token_lists()
        for a, b in ((got.policy_logprobs, ref.policy_logprobs), (got.logprobs, ref.logprobs)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-5)


def test_the_trainer_holds_the_policy_in_the_sampler_for_a_block_only():
    """``Trainer.policy_in_sampler``: synced on entry, released on exit, also when the block
    raises (a rollout that fails leaves no copy of the policy behind), both timed as ``sync``."""
    from agentrl_jax import timing

    calls = []
    run = types.SimpleNamespace(
        _sync_sampler=lambda: calls.append("sync"),
        sampler=types.SimpleNamespace(release=lambda: calls.append("release")),
    )
    clock = timing.PhaseClock()
    with clock.running():
        with trainer.Trainer.policy_in_sampler(run):
            calls.append("play")
        assert calls == ["sync", "play", "release"] and set(clock.seconds) == {"sync"}
        with pytest.raises(RuntimeError, match="env died"), trainer.Trainer.policy_in_sampler(run):
            raise RuntimeError("env died")
    assert calls[3:] == ["sync", "release"]


@pytest.mark.parametrize(
    "where, kind",
    [
        (dict(multihost=True, rollout=False, lora=True, casts=True, copy=True), "local"),
        (dict(multihost=False, rollout=True, lora=True, casts=True, copy=True), "moved"),
        (dict(multihost=False, rollout=False, lora=True, casts=True, copy=True), "merged"),
        (dict(multihost=False, rollout=False, lora=False, casts=True, copy=True), "cast"),
        (dict(multihost=False, rollout=False, lora=False, casts=False, copy=True), "copy"),
        (dict(multihost=False, rollout=False, lora=False, casts=False, copy=False), "borrowed"),
    ],
)
def test_where_the_samplers_weights_go_is_decided_once(policy, where, kind):
    """``build.sampler_weights`` decides; ``sync_sampler`` makes it so and ``plan.sampler_copy``
    plans it so: the sampler owns its weights for every kind but ``borrowed``."""
    from agentrl_jax.experiments import plan

    assert build.sampler_weights(**where) == kind
    if where["multihost"] or where["lora"] or where["casts"]:
        return  # planned in tests/test_plan.py (a host's mesh, LoRA's merge, the cast)
    model, params = policy
    mesh = params["trunk"]["embed_vd"][...].sharding.mesh
    sampler = Sampler(model, mesh=mesh)
    build.sync_sampler(sampler, params, jnp.float32, copy=where["copy"])
    made = sampler.state is not params
    sampler.release()
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), params
    )
    _, _, owned = plan.sampler_copy(
        CFG.replace(dtype=jnp.float32), abstract, mesh, copy=where["copy"]
    )
    assert made == owned == (kind != "borrowed")
