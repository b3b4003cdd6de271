"""The sampler on a (data, fsdp, tp) = (2, 2, 2) mesh of fake CPU devices gives the same turns as
on one device, with the cache really sharded."""

import jax
import numpy as np
import pytest
from flax import nnx

from agentrl_jax import sharding
from agentrl_jax.models import CausalLM
from agentrl_jax.models.testing import random_model
from agentrl_jax.sampling import GREEDY, Sampler, StopConfig
from agentrl_jax.sampling.testing import SMALL

BUCKETS = dict(cache_buckets=[64], chunk_buckets=[16], width_buckets=[8])


def test_sharded_turns_equal_single_device():
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (tests/conftest.py fakes 8 CPU devices)")
    mesh = sharding.make_mesh((2, 2, 2))
    single = random_model(CausalLM, SMALL, seed=4)
    sharded = random_model(CausalLM, SMALL, seed=4, mesh=mesh)
    stop = StopConfig(eos_ids=(7,))
    rng = np.random.default_rng(0)
    turns = [
        [rng.integers(1, SMALL.vocab_size, n).tolist() for n in lengths]
        for lengths in ([5, 12, 1, 9], [3, 0, 7, 2])
    ]
    outs = []
    for model, mesh_arg in ((single, None), (sharded, mesh)):
        sampler = Sampler(model, sampling=GREEDY, stop=stop, mesh=mesh_arg, **BUCKETS)
        cache, turn_outs = sampler.start(4, 64), []
        for t, new in enumerate(turns):
            out = sampler.step_turn(cache, new, 8, jax.random.key(t))
            assert cache.keys[0].is_deleted()  # donated, also when sharded
            cache = out.cache  # the next turn donates it: read its lengths now
            turn_outs.append((out, np.asarray(cache.lengths)))
        outs.append(turn_outs)
    spec = cache.keys[0].sharding.spec  # [B, K, H, S']
    assert spec[0] == ("data", "fsdp") and spec[1] == "tp", spec
    assert nnx.state(sharded)["trunk"]["embed_vd"][...].sharding.mesh == mesh
    for (ref, ref_lengths), (got, got_lengths) in zip(*outs):
        assert got.token_lists() == ref.token_lists()
        np.testing.assert_allclose(
            np.asarray(got.policy_logprobs), np.asarray(ref.policy_logprobs), rtol=0, atol=1e-5
        )
        np.testing.assert_array_equal(got_lengths, ref_lengths)


def test_start_compiles_its_cache_once_per_shape():
    """A new episode's cache is made by one program per (batch, size), created sharded in place
    and compiled once: the rollout starts a cache for every wave."""
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (tests/conftest.py fakes 8 CPU devices)")
    mesh = sharding.make_mesh((2, 2, 2))
    model = random_model(CausalLM, SMALL, seed=4, mesh=mesh)
    compiles = []

    def listen(event, seconds, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(seconds)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        for mesh_arg in (mesh, None):
            sampler = Sampler(model, sampling=GREEDY, mesh=mesh_arg, **BUCKETS)
            first = sampler.start(4, 64)
            before = len(compiles)
            again = [sampler.start(4, 64) for _ in range(3)]
            assert len(compiles) == before, "start compiled again for the same shape"
            for cache in again:
                assert cache.keys[0].sharding == first.keys[0].sharding
                assert not np.asarray(cache.lengths).any()
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
