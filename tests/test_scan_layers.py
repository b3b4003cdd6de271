"""Scanned decoder layers (``ModelConfig.scan_layers``): the same model as the unrolled one.

One stack of [L, ...] parameters run by ``lax.scan`` must give the unrolled model's logits,
gradients (every remat policy), sampler output, Hugging Face files and orbax round trip, and its
traced program must not grow with the number of layers. f32 throughout; tolerances are f32's.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file

from agentrl_jax import sharding
from agentrl_jax.models import hf_checkpoint as hc
from agentrl_jax.models.config import preset
from agentrl_jax.models.decoder import CausalLM, unroll_layers
from agentrl_jax.models.kv_cache import KVCache
from agentrl_jax.models.params import stack_layers, unstack_layers
from agentrl_jax.models.testing import TEST_CONFIG, random_model
from agentrl_jax.run.checkpoint import Checkpointer
from agentrl_jax.sampling import Sampler, SamplingParams
from agentrl_jax.sampling.testing import SMALL

SCANNED = TEST_CONFIG.replace(scan_layers=True)
TOL = 1e-5


@pytest.fixture(scope="module")
def scanned():
    return random_model(CausalLM, SCANNED, seed=3)


def _batch():
    rng = np.random.RandomState(0)
    tokens = jnp.asarray(rng.randint(3, TEST_CONFIG.vocab_size, (3, 9)))
    mask = jnp.asarray(np.array([[1] * 9, [0, 0, 0] + [1] * 6, [1] * 5 + [0] * 4], np.int32))
    return tokens, mask


def _loss(model, tokens, mask):
    """Next-token cross-entropy over the real tokens, and the logits."""
    logits, _ = model(tokens, mask_bt=mask)
    logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    nll = -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
    weights = mask[:, 1:].astype(jnp.float32)
    return jnp.sum(nll * weights) / jnp.sum(weights), logits


# ((loss, logits), gradients wrt every parameter): one compilation per model.
_value_and_grad = jax.jit(nnx.value_and_grad(_loss, has_aux=True))


def _flat(state):
    return {path: np.asarray(var.get_value()) for path, var in nnx.to_flat_state(state)}


def _max_diff(a, b):
    assert a.keys() == b.keys()
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in a)


def test_parameters_are_stacked_with_an_unsharded_layer_axis(scanned):
    q = scanned.trunk.layers.attn.q_weight_dnh
    assert q[...].shape == (TEST_CONFIG.num_layers, 64, 4, 16)
    assert q.get_metadata()["logical_axes"] == ("layers", "embed", "q_heads", "head_dim")
    mesh = sharding.make_mesh((2, 2, 2))
    specs = _flat_specs(sharding.state_specs(scanned, mesh))
    assert specs[("trunk", "layers", "attn", "q_weight_dnh")] == jax.sharding.PartitionSpec(
        None, "fsdp", "tp", None
    )
    norm_spec = specs[("trunk", "layers", "input_norm", "weight")]
    assert norm_spec == jax.sharding.PartitionSpec(None, None)
    assert specs[("trunk", "embed_vd")] == jax.sharding.PartitionSpec("tp", "fsdp")
    # Stacking and unstacking are exact inverses, metadata included.
    back = stack_layers(unstack_layers(nnx.state(scanned)))
    for (p1, v1), (p2, v2) in zip(
        nnx.to_flat_state(nnx.state(scanned)), nnx.to_flat_state(back), strict=True
    ):
        assert p1 == p2 and v1.get_metadata() == v2.get_metadata()
        np.testing.assert_array_equal(v1.get_value(), v2.get_value())


def _flat_specs(specs):
    flat = nnx.to_flat_state(specs)
    return dict(zip(flat.paths, flat.leaves, strict=True))


def test_forward_and_gradients_equal_unrolled(scanned):
    tokens, mask = _batch()
    unrolled = unroll_layers(scanned)
    assert not unrolled.cfg.scan_layers and len(unrolled.trunk.layers) == TEST_CONFIG.num_layers
    (loss_s, logits_s), grads_s = _value_and_grad(scanned, tokens, mask)
    (loss_u, logits_u), grads_u = _value_and_grad(unrolled, tokens, mask)
    assert float(jnp.max(jnp.abs(logits_s - logits_u))) <= TOL
    assert abs(float(loss_s) - float(loss_u)) <= TOL
    # Compared layer by layer: the stacked gradients unstacked onto the unrolled paths.
    assert _max_diff(_flat(unstack_layers(grads_s)), _flat(grads_u)) <= TOL


def test_cached_forward_equals_unrolled(scanned):
    """A direct call with a KV cache (the sampler unrolls first; this path slices in place)."""
    tokens, _ = _batch()
    num_new = jnp.asarray([9, 4, 0], jnp.int32)
    step = jax.jit(lambda m, t, c, n: m(t, cache=c, num_new_b=n))
    outs = [
        step(m, tokens, KVCache.create(SCANNED, 3, 16), num_new)
        for m in (scanned, unroll_layers(scanned))
    ]
    (logits_s, cache_s), (logits_u, cache_u) = outs
    assert float(jnp.max(jnp.abs(logits_s - logits_u))) <= TOL
    assert float(jnp.max(jnp.abs(cache_s.k - cache_u.k))) <= TOL
    assert float(jnp.max(jnp.abs(cache_s.v - cache_u.v))) <= TOL
    np.testing.assert_array_equal(cache_s.lengths, [9, 4, 0])


@pytest.mark.parametrize("remat", ["full", "save_dots"])
def test_every_remat_policy_gives_the_same_gradients(scanned, remat):
    tokens, mask = _batch()
    _, reference = _value_and_grad(scanned, tokens, mask)
    model = random_model(CausalLM, SCANNED.replace(remat=remat), seed=3)  # same weights
    _, grads = _value_and_grad(model, tokens, mask)
    assert _max_diff(_flat(grads), _flat(reference)) <= TOL
    # The layer body is checkpointed, with the policy asked for.
    jaxpr = str(jax.make_jaxpr(nnx.value_and_grad(_loss, has_aux=True))(model, tokens, mask))
    assert "remat" in jaxpr
    assert ("DotsSaveable(only_if_no_batch_dims=True)" in jaxpr) == (remat == "save_dots")


def test_traced_program_does_not_grow_with_depth():
    tokens = jnp.zeros((2, 5), jnp.int32)

    def program(num_layers, scan):
        cfg = TEST_CONFIG.replace(num_layers=num_layers, scan_layers=scan)
        model = random_model(CausalLM, cfg)
        return jax.jit(lambda m, t: m(t)[0]).lower(model, tokens).as_text()

    dots = {
        (n, scan): program(n, scan).count("dot_general") for n in (2, 8) for scan in (False, True)
    }
    assert dots[8, True] == dots[2, True]  # one layer body, whatever the depth
    assert dots[8, False] > dots[2, False]  # unrolled: one body per layer
    assert dots[2, True] < dots[2, False]


def test_hf_round_trip_between_scanned_and_unrolled(scanned, tmp_path):
    unrolled = unroll_layers(scanned)
    hc.save_hf_checkpoint(scanned, tmp_path / "from_scanned")
    hc.save_hf_checkpoint(unrolled, tmp_path / "from_unrolled")
    a = load_file(tmp_path / "from_scanned" / hc.SINGLE_FILE)
    b = load_file(tmp_path / "from_unrolled" / hc.SINGLE_FILE)
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    # Loaded either way round, the weights are the originals exactly.
    as_unrolled = hc.load_hf_model(tmp_path / "from_scanned")
    as_scanned = hc.load_hf_model(tmp_path / "from_unrolled", scan_layers=True)
    assert as_scanned.cfg.scan_layers and not as_unrolled.cfg.scan_layers
    assert _max_diff(_flat(nnx.state(as_unrolled)), _flat(nnx.state(unrolled))) == 0
    assert _max_diff(_flat(nnx.state(as_scanned)), _flat(nnx.state(scanned))) == 0
    # Onto a mesh: each device reads its slice of each layer, stacked.
    mesh = sharding.make_mesh((2, 2, 2))
    on_mesh = hc.load_hf_model(tmp_path / "from_unrolled", mesh=mesh, scan_layers=True)
    flat = _flat(nnx.state(scanned))
    for path, var in nnx.to_flat_state(nnx.state(on_mesh)):
        value = var.get_value()
        assert value.sharding.spec == sharding.logical_to_spec(
            var.get_metadata()["logical_axes"], value.shape, mesh
        )
        for shard in value.addressable_shards:
            np.testing.assert_array_equal(shard.data, flat[path][shard.index], err_msg=str(path))
    critic = hc.load_hf_value_model(tmp_path / "from_unrolled", scan_layers=True)
    assert _max_diff(_flat(nnx.state(critic.trunk)), _flat(nnx.state(scanned.trunk))) == 0


def test_orbax_round_trip_on_a_mesh(scanned, tmp_path):
    mesh = sharding.make_mesh((1, 4, 2))
    model = random_model(CausalLM, SCANNED, seed=3, mesh=mesh)
    ckpt = Checkpointer(str(tmp_path / "ckpt"), async_save=False)
    ckpt.save(1, {"policy": model}, {})
    # The template gives structure, shapes and shardings (as the trainer's restore does).
    template = random_model(CausalLM, SCANNED, seed=4, mesh=mesh)
    _, restored, _ = ckpt.restore_latest({"policy": template})
    ckpt.close()
    for (path, var), (_, ref) in zip(
        nnx.to_flat_state(nnx.state(restored["policy"])),
        nnx.to_flat_state(nnx.state(model)),
        strict=True,
    ):
        assert var.get_value().sharding == ref.get_value().sharding, path
        np.testing.assert_array_equal(var.get_value(), ref.get_value(), err_msg=str(path))


@pytest.mark.slow  # the cached forward's equality (test_cached_forward_equals_unrolled) is the core
def test_sampler_output_equals_unrolled():
    scanned = random_model(CausalLM, SMALL.replace(scan_layers=True), seed=1)
    unrolled = unroll_layers(scanned)
    sampling = SamplingParams(temperature=1.0)
    rng = np.random.RandomState(2)
    turns = [
        [rng.randint(3, SMALL.vocab_size, n).tolist() for n in (5, 11, 8)],
        [rng.randint(3, SMALL.vocab_size, n).tolist() for n in (3, 0, 6)],
    ]
    outs = {}
    for name, model in (("scanned", scanned), ("unrolled", unrolled)):
        sampler = Sampler(model, sampling=sampling)
        cache = sampler.start(3, 64)
        outs[name] = []
        for i, new_tokens in enumerate(turns):
            out = sampler.step_turn(cache, new_tokens, 7, jax.random.key(i))
            cache = out.cache  # donated to the next turn: read its arrays now
            fields = ("tokens", "lengths", "logprobs", "policy_logprobs")
            outs[name].append({f: np.asarray(getattr(out, f)) for f in fields})
            outs[name][-1].update(k=np.asarray(cache.k), cache_lengths=np.asarray(cache.lengths))
    for a, b in zip(outs["scanned"], outs["unrolled"], strict=True):
        for field in ("tokens", "lengths", "cache_lengths"):
            np.testing.assert_array_equal(a[field], b[field])
        for field in ("logprobs", "policy_logprobs", "k"):
            assert float(np.max(np.abs(a[field] - b[field]))) <= TOL, field


def test_presets_and_config_values():
    for name in ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b"):
        assert preset(name).scan_layers
    assert not preset("tiny").scan_layers
    assert TEST_CONFIG.replace(remat=True).remat == "full"
    assert TEST_CONFIG.replace(remat=False).remat == "none"
    with pytest.raises(ValueError, match=r"ModelConfig.remat='dots'; expected one of"):
        TEST_CONFIG.replace(remat="dots")
    with pytest.raises(ValueError, match=r"ModelConfig.scan_layers must be a bool, got 'yes'"):
        TEST_CONFIG.replace(scan_layers="yes")
