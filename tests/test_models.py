"""The Qwen2 modules on their own: padding, the KV cache, remat, the value model, presets."""

import functools
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentrl_jax.models import CausalLM, KVCache, ModelConfig, ValueModel, decoder, preset
from agentrl_jax.models.testing import TEST_CONFIG, random_model
from agentrl_jax.rl.lm_head import token_logprobs


def _init(cls, cfg, seed=0):
    return random_model(cls, cfg, seed=seed)


@pytest.fixture(scope="module")
def policy():
    return _init(CausalLM, TEST_CONFIG)


@jax.jit
def _forward(model, tokens_bt, mask_bt=None):
    return model(tokens_bt, mask_bt=mask_bt)


@jax.jit
def _values(model, tokens_bt, mask_bt):
    return model(tokens_bt, mask_bt=mask_bt)


def _tokens(shape, seed=0):
    return jnp.asarray(np.random.RandomState(seed).randint(3, TEST_CONFIG.vocab_size, shape))


def test_forward_shapes_and_dtypes(policy):
    logits, cache = _forward(policy, _tokens((2, 5)))
    assert logits.shape == (2, 5, TEST_CONFIG.vocab_size)
    assert logits.dtype == jnp.float32
    assert cache is None
    assert bool(jnp.all(jnp.isfinite(logits)))

    cfg16 = TEST_CONFIG.replace(dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
    bf16 = _init(CausalLM, cfg16)
    assert bf16.trunk.layers[0].attn.q_weight_dnh[...].dtype == jnp.bfloat16
    logits_bf16, _ = _forward(bf16, _tokens((2, 5)))
    assert logits_bf16.dtype == jnp.float32  # logits are always f32 for stable log-probs
    # The same weights in bf16: logits agree to bf16 precision (not to f32's).
    diff = float(jnp.max(jnp.abs(logits_bf16 - logits)))
    assert 0 < diff <= 0.05 * float(jnp.max(jnp.abs(logits)))


def test_padding_left_and_right_matches_unpadded(policy):
    seq = _tokens((1, 6), seed=1)
    ref, _ = _forward(policy, seq)
    pad = jnp.zeros((1, 3), jnp.int32)
    left = jnp.concatenate([pad, seq], axis=1)
    right = jnp.concatenate([seq, pad], axis=1)
    batch = jnp.concatenate([left, right], axis=0)
    mask = jnp.concatenate([jnp.arange(9)[None] >= 3, jnp.arange(9)[None] < 6], axis=0).astype(
        jnp.int32
    )
    logits, _ = _forward(policy, batch, mask)
    assert float(jnp.max(jnp.abs(logits[0, 3:] - ref[0]))) <= 1e-5
    assert float(jnp.max(jnp.abs(logits[1, :6] - ref[0]))) <= 1e-5


# A Gemma 3 style decoder: a sliding-window layer (window 500) before a global one, each with its
# RoPE base, q/k norms, (1 + w) and sandwich norms, scaled embeddings, GELU.
_GEMMA3_STYLE = TEST_CONFIG.replace(
    family="gemma3_text",
    attention_bias=False,
    qk_norm=True,
    norm_plus_one=True,
    sandwich_norms=True,
    embed_scale=True,
    hidden_act="gelu_tanh",
    query_pre_attn_scalar=24,
    layer_types=("sliding_attention", "full_attention"),
    sliding_window=500,
    rope_local_theta=10_000.0,
)


def _masked_ce_loss(model, tokens, mask):
    """The mean next-token loss over a padded batch's real tokens, and the logits."""
    logits, _ = model(tokens, mask_bt=mask)
    logp = token_logprobs(logits, tokens)[:, 1:]
    weight = mask[:, :-1] * mask[:, 1:]
    return -jnp.sum(logp * weight) / jnp.sum(weight), logits


@pytest.mark.parametrize("family", ["qwen2", "gemma3_sliding"])
@pytest.mark.parametrize("t", [384, pytest.param(3072, marks=pytest.mark.slow)])
def test_long_teacher_forcing_attends_in_causal_bands_equal_to_one_pass(family, t, monkeypatch):
    cfg = TEST_CONFIG if family == "qwen2" else _GEMMA3_STYLE.replace(sliding_window=t // 6)
    cfg = cfg.replace(max_position_embeddings=4096)  # (the window a sixth of the row: it binds)
    if t == 384:
        # The chunk budget scaled to an eighth of the length: 16 query chunks of 24, as
        # 3,072-token rows give 16 of 192 under the real one.
        monkeypatch.setattr(decoder, "_SCORES_PER_CHUNK", 384 * 24)
    model = _init(CausalLM, cfg)
    # ALFWorld's whole-episode rows (3,072 tokens; the default run's 384, the budget scaled):
    # one row full, one left-padded, one right-padded. Each row's queries go in 16 chunks,
    # which the bands group by 2.
    mask = np.zeros((3, t), np.int32)
    mask[0] = 1
    mask[1, t - t * 3 // 4 :] = 1
    mask[2, : t * 2 // 3] = 1
    tokens, mask = _tokens((3, t), seed=4) * mask, jnp.asarray(mask)
    assert decoder.causal_bands(cfg, 3, t) == 8

    chunks = []
    lax_map = jax.lax.map
    monkeypatch.setattr(
        jax.lax, "map", lambda f, xs: chunks.append(xs[0].shape[0]) or lax_map(f, xs)
    )

    def logits_and_grads():
        chunks.clear()
        # A new function each time: traced again under the current _CAUSAL_BANDS.
        step = jax.jit(nnx.value_and_grad(lambda *a: _masked_ce_loss(*a), has_aux=True))
        (loss_value, logits), grads = step(model, tokens, mask)
        return np.asarray(logits), float(loss_value), jax.tree.leaves(grads), list(chunks)

    banded, banded_loss, banded_grads, banded_chunks = logits_and_grads()
    monkeypatch.setattr(decoder, "_CAUSAL_BANDS", 1)
    one_pass, one_pass_loss, one_pass_grads, one_pass_chunks = logits_and_grads()
    # Per layer, 8 bands of 2 query chunks (over t / 8, 2 t / 8, ... t keys) against 16 chunks
    # over all t keys (the sliding layer too: its window is a mask over the same keys).
    assert banded_chunks == [2] * 8 * cfg.num_layers
    assert one_pass_chunks == [16] * cfg.num_layers
    # The real tokens' logits (a left-padding query sees no key: nothing reads it) and the
    # update's loss and gradients: equal up to f32 rounding (the sums' order).
    real = np.asarray(mask, bool)
    np.testing.assert_allclose(banded[real], one_pass[real], rtol=0, atol=1e-5)
    assert abs(banded_loss - one_pass_loss) <= 1e-6
    for a, b in zip(banded_grads, one_pass_grads, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    # Rows shorter than one chunk of scores keep the one-pass path.
    assert decoder.causal_bands(cfg, 64, math.isqrt(decoder._SCORES_PER_CHUNK)) == 1


@pytest.mark.parametrize("platform", ["cpu", "tpu"])
def test_cache_multi_turn_matches_full_forward(policy, platform):
    """Prefill of ragged prompts, single-token decode steps, then a second ragged chunk; with
    the keys in either layout (slot-minor on CPU, [B, K, S, H] on accelerators)."""
    full = _tokens((2, 14), seed=2)
    lens1 = np.array([5, 3])  # first chunk: prompt lengths
    lens2 = np.array([2, 5])  # a later chunk (the next observation); same width as the first
    cache = KVCache.create(TEST_CONFIG, batch=2, size=32, platform=platform)
    assert cache.keys_slot_minor == (platform == "cpu")
    assert cache.keys[0].shape[-1] == (32 if platform == "cpu" else TEST_CONFIG.head_dim)
    step = jax.jit(lambda m, t, c, n: m(t, cache=c, num_new_b=n))

    def rows(starts, width, lengths):
        out = np.zeros((2, width), np.int32)
        for b in range(2):
            out[b, : lengths[b]] = full[b, starts[b] : starts[b] + lengths[b]]
        return jnp.asarray(out)

    got = {b: [] for b in range(2)}
    pos = np.zeros(2, int)
    for lengths in (lens1, np.array([1, 1]), np.array([1, 1]), lens2):
        chunk = rows(pos, int(lengths.max()), lengths)
        logits, cache = step(policy, chunk, cache, jnp.asarray(lengths, jnp.int32))
        for b in range(2):
            got[b].append(np.asarray(logits[b, : lengths[b]]))
        pos += lengths
    np.testing.assert_array_equal(cache.lengths, pos)
    for b in range(2):
        ref, _ = _forward(policy, full[b : b + 1, : pos[b]])
        diff = np.abs(np.concatenate(got[b]) - np.asarray(ref[0])).max()
        assert diff <= 1e-5, (b, diff)
    # The stacked view is the same whatever the layout: the other layout's cache holds the same.
    other = KVCache.create(
        TEST_CONFIG, batch=2, size=32, platform="tpu" if platform == "cpu" else "cpu"
    )
    pos = np.zeros(2, int)
    for lengths in (lens1, np.array([1, 1]), np.array([1, 1]), lens2):
        chunk = rows(pos, int(lengths.max()), lengths)
        _, other = step(policy, chunk, other, jnp.asarray(lengths, jnp.int32))
        pos += lengths
    np.testing.assert_allclose(other.k, cache.k, rtol=0, atol=1e-6)
    np.testing.assert_allclose(other.v, cache.v, rtol=0, atol=1e-6)


def test_cache_last_only_gives_each_rows_last_position_and_the_same_cache(policy):
    """A prefill that needs only the next token's logits: the last layer queries at each row's
    last new token (an inactive row: its chunk's first position) and still writes every key."""
    chunk = _tokens((3, 7), seed=3)
    num_new = jnp.asarray([7, 4, 0], jnp.int32)
    history = _tokens((3, 5), seed=4)

    @functools.partial(jax.jit, static_argnums=1)
    def run(model, last_only):
        cache = KVCache.create(TEST_CONFIG, batch=3, size=16)
        _, cache = model.trunk(history, cache=cache, num_new_b=jnp.asarray([5, 2, 3]))
        return model.trunk(chunk, cache=cache, num_new_b=num_new, last_only=last_only)

    full_btd, full_cache = run(policy, False)
    last_b1d, last_cache = run(policy, True)
    assert last_b1d.shape == (3, 1, TEST_CONFIG.hidden_size)
    expected = full_btd[jnp.arange(3), jnp.asarray([6, 3, 0])]
    np.testing.assert_allclose(last_b1d[:, 0], expected, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(last_cache.lengths, full_cache.lengths)
    for got, ref in zip(last_cache.keys + last_cache.values, full_cache.keys + full_cache.values):
        np.testing.assert_array_equal(got, ref)


def _ce_loss(model, tokens):
    logits, _ = model(tokens)
    logp = jax.nn.log_softmax(logits[:, :-1])
    return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))


def test_remat_gives_same_grads():
    cfg = TEST_CONFIG.replace(num_layers=1)  # one layer exercises remat; keeps compiles short
    tokens = _tokens((2, 8), seed=3)
    plain = _init(CausalLM, cfg)
    remat = _init(CausalLM, cfg.replace(remat=True))
    loss_a, grads_a = jax.jit(nnx.value_and_grad(_ce_loss))(plain, tokens)
    loss_b, grads_b = jax.jit(nnx.value_and_grad(_ce_loss))(remat, tokens)
    assert abs(float(loss_a) - float(loss_b)) <= 1e-6
    for a, b in zip(jax.tree.leaves(grads_a), jax.tree.leaves(grads_b), strict=True):
        assert float(jnp.max(jnp.abs(a - b))) <= 1e-6
    assert float(sum(jnp.sum(jnp.abs(g)) for g in jax.tree.leaves(grads_a))) > 0
    # And remat is really there: the traced program checkpoints the layer, the plain one not.
    remat_primitive = re.compile(r"\bremat\d*\[")  # jax.checkpoint's primitive, e.g. remat2
    assert remat_primitive.search(str(jax.make_jaxpr(_ce_loss)(remat, tokens)))
    assert not remat_primitive.search(str(jax.make_jaxpr(_ce_loss)(plain, tokens)))


def test_value_model_from_policy(policy):
    value = ValueModel.from_policy(policy)
    tokens = _tokens((2, 7), seed=4)
    mask = jnp.ones((2, 7), jnp.int32).at[1, :2].set(0)
    policy_leaves = jax.tree.leaves(nnx.state(policy.trunk))
    value_leaves = jax.tree.leaves(nnx.state(value.trunk))
    for p, v in zip(policy_leaves, value_leaves, strict=True):
        np.testing.assert_array_equal(p, v)
        # Copies, not aliases: donating one model's buffers must not free the other's.
        assert p.unsafe_buffer_pointer() != v.unsafe_buffer_pointer()
    hidden_p, _ = _forward(policy.trunk, tokens, mask)
    hidden_v, _ = _forward(value.trunk, tokens, mask)
    np.testing.assert_array_equal(hidden_p, hidden_v)
    values = _values(value, tokens, mask)
    assert values.shape == (2, 7) and values.dtype == jnp.float32
    np.testing.assert_array_equal(values, 0.0)  # zero-initialised head

    # The head reads the trunk: a unit head weight gives each token's first hidden unit.
    value.value_weight_d[...] = jnp.zeros_like(value.value_weight_d[...]).at[0].set(1.0)
    value.value_bias[...] = jnp.asarray(0.5)
    np.testing.assert_allclose(_values(value, tokens, mask), hidden_p[..., 0] + 0.5, atol=1e-6)

    # Training the critic's trunk leaves the policy's alone.
    before = np.asarray(policy.trunk.embed_vd[...])
    value.trunk.embed_vd[...] = value.trunk.embed_vd[...] + 1.0
    np.testing.assert_array_equal(policy.trunk.embed_vd[...], before)


def test_fresh_value_model_head():
    value = _init(ValueModel, TEST_CONFIG, seed=1)
    tokens = _tokens((3, 4))
    out = _values(value, tokens, None)
    hidden, _ = _forward(value.trunk, tokens)
    expected = np.asarray(hidden) @ np.asarray(value.value_weight_d[...])
    expected += float(value.value_bias[...])
    assert out.shape == (3, 4)
    np.testing.assert_allclose(out, expected, atol=1e-5)


@pytest.mark.parametrize(
    "name",
    [
        "qwen3-0.6b",
        "qwen3-1.7b",
        "qwen3-8b",
        "llama3.2-1b",
        "llama3.1-8b",
        "gemma3-1b",
        "qwen3-30b-a3b",
    ],
)
def test_family_preset_matches_transformers(name):
    """A family preset's config.json builds transformers' own model (on the meta device) with
    as many parameters as ours, and reads back as the preset; our module tree has as many."""
    torch = pytest.importorskip("torch")
    import transformers

    from agentrl_jax.models import registry
    from agentrl_jax.models.hf_checkpoint import config_from_hf, config_to_hf

    cfg = preset(name)
    hf = config_to_hf(cfg)
    hf_cfg = transformers.AutoConfig.for_model(**hf)
    with torch.device("meta"):
        hf_model = transformers.AutoModelForCausalLM.from_config(hf_cfg)
    assert type(hf_model).__name__ == registry.family(cfg).architectures[0]
    assert cfg.num_params == sum(p.numel() for p in hf_model.parameters())
    assert config_from_hf(hf) == cfg.replace(scan_layers=False)
    abstract = nnx.eval_shape(lambda: registry.family(cfg).policy(cfg, rngs=nnx.Rngs(0)))
    count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))
    assert count == cfg.num_params


def test_preset_parameter_counts_match_transformers():
    """Our count formula and module tree against transformers' own Qwen2 (on the meta device)."""
    torch = pytest.importorskip("torch")
    import transformers

    from agentrl_jax.models.hf_checkpoint import config_to_hf

    for name in ("qwen2.5-0.5b", "qwen2.5-7b"):
        cfg = preset(name)
        hf_cfg = transformers.Qwen2Config(**config_to_hf(cfg))
        with torch.device("meta"):
            hf_model = transformers.Qwen2ForCausalLM(hf_cfg)
        assert cfg.num_params == sum(p.numel() for p in hf_model.parameters()), name
    tiny = preset("tiny")
    abstract = nnx.eval_shape(lambda: CausalLM(tiny, rngs=nnx.Rngs(0)))
    count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))
    assert count == tiny.num_params
    assert 1_000_000 < tiny.num_params < 10_000_000


def test_backend_dtypes():
    from agentrl_jax.models.config import backend_dtypes

    assert backend_dtypes("cpu") == {"dtype": jnp.float32, "param_dtype": jnp.float32}
    assert backend_dtypes("gpu")["dtype"] == jnp.bfloat16
    assert preset("tiny", **backend_dtypes("tpu")).dtype == jnp.bfloat16


def test_config_errors():
    with pytest.raises(ValueError, match="unknown model preset 'nope'"):
        preset("nope")
    with pytest.raises(ValueError, match="num_heads=6 must be a multiple of num_kv_heads=4"):
        ModelConfig(
            vocab_size=8,
            hidden_size=8,
            intermediate_size=8,
            num_layers=1,
            num_heads=6,
            num_kv_heads=4,
            head_dim=2,
        )
    with pytest.raises(ValueError, match="ModelConfig.hidden_size must be a positive int, got 0"):
        TEST_CONFIG.replace(hidden_size=0)
    with pytest.raises(ValueError, match="head_dim=3 must be even"):
        TEST_CONFIG.replace(head_dim=3)
