"""LoRA on the Qwen2 decoder (models/lora.py) and its PEFT round trip (models/peft.py).

Parity bars (f32, fixed by issue #32, never relaxed): our adapter loaded by ``peft`` onto
transformers' Qwen2, an adapter written by ``peft`` loaded into our model, and the merged model
saved as a Hugging Face checkpoint all give logits within 1e-5 of the other side's.
"""

import json
import math
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from agentrl_jax import sharding
from agentrl_jax.models import CausalLM, KVCache, ValueModel, lora
from agentrl_jax.models.config import LORA_TARGETS, LoraConfig, ModelConfig
from agentrl_jax.models.decoder import lora_slots
from agentrl_jax.models.params import stack_layers
from agentrl_jax.models.testing import TEST_CONFIG, random_model

TOL = 1e-5  # fixed by the issue: f32 max abs diff
LORA = LoraConfig(rank=4, alpha=8.0)


def _tokens(shape=(3, 9), seed=0):
    return np.random.RandomState(seed).randint(0, TEST_CONFIG.vocab_size, shape)


def _padded_batch():
    """A full row, a left-padded row and a right-padded row."""
    tokens = _tokens()
    mask = np.ones(tokens.shape, np.int64)
    mask[1, :4] = 0
    mask[2, 6:] = 0
    return tokens, mask


@jax.jit
def _forward(model, tokens, mask):
    return model(tokens, mask_bt=mask)[0]


def _max_diff(a, b, mask=None) -> float:
    diff = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
    return float((diff if mask is None else diff[mask.astype(bool)]).max())


def _randomize_adapters(model, *, seed=1, std=0.1):
    """Every adapter (A and B) drawn N(0, std), in place: B nonzero, so the adapter matters."""
    rng = np.random.RandomState(seed)
    state = lora.adapters(model)
    for _, var in nnx.to_flat_state(state):
        old = var.get_value()
        var.set_value(jax.device_put(rng.normal(0, std, old.shape).astype(old.dtype), old.sharding))
    lora.with_adapters(model, state)
    return model


# ---------------------------------------------------------------------------------------------
# Config


def test_lora_config_validation():
    assert LoraConfig(rank=8, targets="q, v").targets == ("q", "v")
    assert LoraConfig(rank=8, targets=["down", "q"]).targets == ("q", "down")  # canonical order
    assert LoraConfig(rank=8, targets="all").targets == LORA_TARGETS
    assert LoraConfig(rank=8, alpha=16).scale == 2.0
    assert TEST_CONFIG.replace(lora=LoraConfig(rank=0)).lora is None  # rank 0: off
    bad = [
        (dict(rank=-1), "LoraConfig.rank"),
        (dict(rank=True), "LoraConfig.rank"),
        (dict(rank=4.0), "LoraConfig.rank"),
        (dict(rank=4, alpha=0), "LoraConfig.alpha"),
        (dict(rank=4, alpha="8"), "LoraConfig.alpha"),
        (dict(rank=4, dropout=1.0), "LoraConfig.dropout"),
        (dict(rank=4, dropout=-0.1), "LoraConfig.dropout"),
        (dict(rank=4, targets="q,qq"), r"LoraConfig.targets: \['qq'\] not among"),
        (dict(rank=4, targets=["q", "q"]), "LoraConfig.targets names a projection twice"),
        (dict(rank=4, targets=[]), "LoraConfig.targets is empty"),
        (dict(rank=4, targets=3), "LoraConfig.targets must be"),
        (dict(rank=4, param_dtype=jnp.int32), "LoraConfig.param_dtype"),
    ]
    for kwargs, message in bad:
        with pytest.raises(ValueError, match=message):
            LoraConfig(**kwargs)
    with pytest.raises(ValueError, match="ModelConfig.lora must be a LoraConfig"):
        TEST_CONFIG.replace(lora={"rank": 4})


def test_adapter_parameter_count():
    cfg = TEST_CONFIG.replace(lora=LORA)
    model = random_model(CausalLM, cfg)
    counted = sum(x.size for x in jax.tree.leaves(lora.adapters(model)))
    assert (
        counted
        == cfg.num_lora_params
        == 2 * 4 * ((64 + 64) + 2 * (64 + 32) + (64 + 64) + 2 * (64 + 96) + (96 + 64))
    )
    # Qwen2.5-7B, rank 64 on all seven projections: 161,480,704 trainable parameters (2.1%).
    big = ModelConfig(152064, 3584, 18944, 28, 28, 4, 128, lora=LoraConfig(rank=64))
    assert big.num_lora_params == 161_480_704


# ---------------------------------------------------------------------------------------------
# The model


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scanned"])
def test_fresh_adapter_changes_nothing(scan):
    """A kaiming-uniform, B zero (PEFT's init): the LoRA model computes the base's logits
    exactly; the adapters are f32 while the base stays bf16; A is U(+-1/sqrt(fan_in))."""
    cfg = TEST_CONFIG.replace(scan_layers=scan, param_dtype=jnp.bfloat16)
    base = random_model(CausalLM, cfg)
    tokens, mask = _padded_batch()
    before = np.asarray(_forward(base, tokens, mask))
    model = lora.apply_lora(base, LORA, seed=3)
    assert model.cfg.lora == LORA and base.cfg.lora is None
    np.testing.assert_array_equal(np.asarray(_forward(model, tokens, mask)), before)
    slots = lora_slots(model.cfg)
    flat = nnx.to_flat_state(lora.adapters(model))
    assert len(flat) == 2 * len(LORA_TARGETS) * (1 if scan else cfg.num_layers)
    for path, var in flat:
        value = np.asarray(var.get_value())
        assert value.dtype == np.float32, path
        slot = next(s for s in slots.values() if path[-1] in (s.a, s.b))
        if path[-1] == slot.b:
            assert not value.any(), path
        else:
            bound = 1 / math.sqrt(slot.fan_in)
            assert np.abs(value).max() <= bound and np.abs(value).max() > 0.8 * bound, path
    base_params = nnx.to_flat_state(nnx.state(model, lora.FROZEN))
    assert {np.dtype(v.get_value().dtype) for _, v in base_params} == {np.dtype(jnp.bfloat16)}
    with pytest.raises(ValueError, match="already has LoRA adapters"):
        lora.apply_lora(model, LORA)
    assert lora.apply_lora(base, None) is base and lora.apply_lora(base, LoraConfig()) is base


def test_scanned_and_remat_match_unrolled_with_adapters():
    """The adapters ride the scan (stacked [L, ...]) and remat: logits and adapter gradients of
    the scanned, rematerialised model equal the unrolled model's."""
    cfg = TEST_CONFIG.replace(lora=LORA)
    unrolled = random_model(CausalLM, cfg, seed=4)
    tokens, mask = _padded_batch()

    def loss(model):
        return jnp.sum(jnp.sin(model(tokens, mask_bt=mask)[0]) * mask[..., None])

    grad = nnx.jit(nnx.grad(loss, argnums=nnx.DiffState(0, lora.TRAINABLE)))
    ref_grads = grad(unrolled)
    # (Every remat policy gives the same gradients: tests/test_scan_layers.py; here the
    # adapters ride the scan and the checkpointed body.)
    for remat in ("full",):
        scanned_graphdef = nnx.graphdef(
            random_model(CausalLM, cfg.replace(scan_layers=True, remat=remat))
        )
        scanned = nnx.merge(scanned_graphdef, stack_layers(nnx.state(unrolled)))
        diff = _max_diff(_forward(scanned, tokens, mask), _forward(unrolled, tokens, mask), mask)
        assert diff <= TOL, (remat, diff)
        grads = grad(scanned)
        for (p, g), (_, r) in zip(
            nnx.to_flat_state(grads), nnx.to_flat_state(stack_layers(ref_grads)), strict=True
        ):
            assert _max_diff(g.get_value(), r.get_value()) <= 1e-4, (remat, p)


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scanned"])
def test_cached_pass_matches_teacher_forcing(scan):
    """The sampler's path (a KV cache; a scanned model's layers unrolled per call) with
    adapters: a prefill and decode steps give the teacher-forcing logits."""
    cfg = TEST_CONFIG.replace(lora=LORA, scan_layers=scan)
    model = random_model(CausalLM, cfg, seed=5)
    full = _tokens((2, 8), seed=6)
    cache = KVCache.create(cfg, batch=2, size=16)
    step = jax.jit(lambda m, t, c: m(t, cache=c))
    got = []
    logits, cache = step(model, jnp.asarray(full[:, :5]), cache)
    got.append(logits)
    for t in range(5, 8):
        logits, cache = step(model, jnp.asarray(full[:, t : t + 1]), cache)
        got.append(logits)
    ref = _forward(model, full, np.ones_like(full))
    assert _max_diff(jnp.concatenate(got, axis=1), ref) <= TOL


def test_trainable_filter_and_optimizer_hold_adapters_only():
    """An optimizer built on ``lora.TRAINABLE`` holds state for the adapters alone, and a step
    moves them and nothing else (the base is bit for bit the same)."""
    model = lora.apply_lora(random_model(CausalLM, TEST_CONFIG, seed=7), LORA)
    assert lora.trainable_filter(model) is lora.TRAINABLE
    assert lora.trainable_filter(TEST_CONFIG) is nnx.Param
    _, trainable, rest = lora.split(model)
    adapter_sizes = [x.size for x in jax.tree.leaves(trainable)]
    assert sum(adapter_sizes) == model.cfg.num_lora_params
    assert not any(isinstance(v, nnx.LoRAParam) for _, v in nnx.to_flat_state(rest))

    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=lora.TRAINABLE)
    moments = [x.size for x in jax.tree.leaves(nnx.state(optimizer, nnx.OptState)) if x.ndim > 0]
    assert sorted(moments) == sorted(adapter_sizes * 2)  # Adam's mu and nu, adapters only

    tokens, mask = _padded_batch()
    base_before = jax.tree.map(np.asarray, nnx.state(model, lora.FROZEN))
    adapters_before = jax.tree.map(np.asarray, lora.adapters(model))

    def loss(m):
        logits = m(tokens, mask_bt=mask)[0]
        return -jnp.mean(jax.nn.log_softmax(logits)[..., 0])

    @nnx.jit
    def step(model, optimizer):
        grads = nnx.grad(loss, argnums=nnx.DiffState(0, lora.TRAINABLE))(model)
        optimizer.update(model, grads)

    def moved():
        return {
            path[-1]: not np.array_equal(np.asarray(before.get_value()), np.asarray(v.get_value()))
            for (path, before), (_, v) in zip(
                nnx.to_flat_state(adapters_before),
                nnx.to_flat_state(lora.adapters(model)),
                strict=True,
            )
        }

    step(model, optimizer)
    # With B = 0, A's gradient is 0 (dA = x^T dy B^T): the first step moves B alone, as PEFT's.
    assert all(moved()[s.b] and not moved()[s.a] for s in lora_slots(model.cfg).values())
    step(model, optimizer)
    assert all(moved().values())
    for a, b in zip(
        jax.tree.leaves(base_before), jax.tree.leaves(nnx.state(model, lora.FROZEN)), strict=True
    ):
        np.testing.assert_array_equal(a, np.asarray(b))


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scanned"])
def test_merge(scan):
    """``merge``: a plain model whose W is W + A B alpha / r: the same logits (f32), in the
    chosen dtype (bf16 for the sampler), the LoRA model left usable; ``base_model`` drops the
    adapters unmerged."""
    cfg = TEST_CONFIG.replace(lora=LORA, scan_layers=scan)
    model = _randomize_adapters(random_model(CausalLM, cfg, seed=8))
    tokens, mask = _padded_batch()
    ours = _forward(model, tokens, mask)
    merged = lora.merge(model)
    assert merged.cfg.lora is None and merged.cfg == cfg.replace(lora=None)
    assert not jax.tree.leaves(lora.adapters(merged))
    assert _max_diff(_forward(merged, tokens, mask), ours, mask) <= TOL
    unmerged = _forward(lora.base_model(model), tokens, mask)
    assert _max_diff(unmerged, ours, mask) > 0.1  # the adapters matter
    bf16 = lora.merge(model, jnp.bfloat16)
    assert bf16.cfg.param_dtype == jnp.bfloat16
    assert {v.get_value().dtype for _, v in nnx.to_flat_state(nnx.state(bf16))} == {
        np.dtype(jnp.bfloat16)
    }
    # bf16 weights, f32 compute: within bf16's rounding of the weights.
    assert _max_diff(_forward(bf16, tokens, mask), ours, mask) <= 0.05
    np.testing.assert_array_equal(np.asarray(_forward(model, tokens, mask)), np.asarray(ours))


def test_bf16_pass_and_merged_copy_apply_one_scale():
    """At bf16 compute the adapters' pass scales by alpha / rank in f32, as ``merge`` (the
    sampler's copy) and PEFT do: not by the scale rounded to bf16 (16/48 -> 0.333984375, 2^-9
    more). Layer 0's MLP with an adapter on ``down`` alone and its base weight zero is the
    adapter term alone; the least-squares factor between the LoRA pass's output and the merged
    copy's is 1 within what bf16 rounding leaves over 4 x 32 x 64 outputs (A and B hold
    bf16-exact values: measured |factor - 1| <= 8e-5 over 6 seeds; the bf16 scale gives 2^-9,
    8 times the bound)."""
    cfg = TEST_CONFIG.replace(
        dtype=jnp.bfloat16, lora=LoraConfig(rank=48, alpha=16.0, targets="down")
    )
    model = random_model(CausalLM, cfg, seed=12)
    rng = np.random.RandomState(12)
    state = lora.adapters(model)
    for _, var in nnx.to_flat_state(state):
        value = jnp.asarray(rng.normal(0, 0.1, var.get_value().shape), jnp.bfloat16)
        var.set_value(value.astype(jnp.float32))
    lora.with_adapters(model, state)
    for layer in model.trunk.layers:
        down = layer.mlp.down_weight_fd
        down.set_value(jnp.zeros_like(down.get_value()))
    x = jnp.asarray(rng.normal(0, 1, (4, 32, cfg.hidden_size)), jnp.bfloat16)
    merged = lora.merge(model, jnp.bfloat16)
    got = np.asarray(model.trunk.layers[0].mlp(x), np.float64)
    want = np.asarray(merged.trunk.layers[0].mlp(x), np.float64)
    factor = float((got * want).sum() / (want * want).sum())
    assert abs(factor - 1.0) <= 2.0**-12, factor
    # Each output within a few bf16 roundings (2^-8 relative) of the merged copy's.
    assert np.abs(got - want).max() <= 2.0**-7 * np.abs(want).max()


def test_dropout_only_with_a_key():
    """Dropout acts only when the forward pass is given a key (the learner's), never in a
    cached pass; its masks differ by key, and the same key gives the same masks."""
    cfg = TEST_CONFIG.replace(lora=LORA.replace(dropout=0.5), scan_layers=True)
    model = _randomize_adapters(random_model(CausalLM, cfg, seed=9))
    tokens, mask = _padded_batch()
    plain = np.asarray(_forward(model, tokens, mask))
    no_drop = random_model(CausalLM, cfg.replace(lora=LORA, scan_layers=True), seed=9)
    no_drop = _randomize_adapters(no_drop)
    np.testing.assert_array_equal(np.asarray(_forward(no_drop, tokens, mask)), plain)
    call = jax.jit(lambda m, k: m(tokens, mask_bt=mask, lora_dropout_key=k)[0])
    a, b = np.asarray(call(model, jax.random.key(0))), np.asarray(call(model, jax.random.key(1)))
    assert _max_diff(a, plain, mask) > 0.01 and _max_diff(a, b, mask) > 0.01
    np.testing.assert_array_equal(a, np.asarray(call(model, jax.random.key(0))))
    with pytest.raises(ValueError, match="lora_dropout_key is for teacher forcing"):
        model(
            tokens, cache=KVCache.create(cfg, batch=3, size=16), lora_dropout_key=jax.random.key(0)
        )


@pytest.mark.parametrize(
    "mesh_shape,scan", [((2, 2, 2), False), ((1, 4, 2), True)], ids=["222-unrolled", "142-scanned"]
)
def test_adapter_shardings_follow_their_base(mesh_shape, scan):
    """On a mesh, each adapter is split like its base matrix on the axes they share (A on the
    base's in axes, B on its out axes), its rank axis replicated; the logits and the merged
    copy's layout agree with one device."""
    mesh = sharding.make_mesh(mesh_shape)
    cfg = TEST_CONFIG.replace(scan_layers=scan)
    base = random_model(CausalLM, cfg, seed=10, mesh=mesh)
    model = _randomize_adapters(lora.apply_lora(base, LORA))
    slots = lora_slots(model.cfg)
    flat = dict(nnx.to_flat_state(nnx.state(model)))
    checked = 0
    for path, var in flat.items():
        if not isinstance(var, nnx.LoRAParam):
            continue
        slot = next(s for s in slots.values() if path[-1] in (s.a, s.b))
        w = flat[(*path[:-1], slot.weight)].get_value()
        w_axes = dict(
            zip(
                flat[(*path[:-1], slot.weight)].get_metadata()["logical_axes"],
                w.sharding.spec + (None,) * (w.ndim - len(w.sharding.spec)),
            )
        )
        value = var.get_value()
        spec = value.sharding.spec + (None,) * (value.ndim - len(value.sharding.spec))
        for axis, entry in zip(var.get_metadata()["logical_axes"], spec, strict=True):
            assert entry == (None if axis == "lora_rank" else w_axes[axis]), (path, axis)
        # Each device holds its own slice of the same global array.
        assert value.sharding.mesh == mesh
        checked += 1
    assert checked == 2 * len(LORA_TARGETS) * (1 if scan else cfg.num_layers)
    # The q adapter on the (data, fsdp, tp) rules.
    prefix = ("trunk", "layers") if scan else ("trunk", "layers", 0)
    lead = (None,) if scan else ()
    q_a = flat[(*prefix, "attn", "q_lora_a_dr")].get_value().sharding.spec
    q_b = flat[(*prefix, "attn", "q_lora_b_rnh")].get_value().sharding.spec
    assert tuple(q_a) == (*lead, "fsdp", None)
    assert tuple(q_b) == (*lead, None, "tp", None)
    single = jax.device_put(nnx.state(model), jax.devices()[0])
    single = nnx.merge(nnx.graphdef(model), single)
    tokens, mask = _padded_batch()
    tokens = np.concatenate([tokens, tokens[:1]])
    mask = np.concatenate([mask, mask[:1]])
    with jax.set_mesh(mesh):
        on_mesh = _forward(model, tokens, mask)
    assert _max_diff(on_mesh, _forward(single, tokens, mask), mask) <= TOL
    merged = lora.merge(model, jnp.bfloat16)
    specs = sharding.state_specs(merged, mesh)
    for (path, var), (_, spec) in zip(
        nnx.to_flat_state(nnx.state(merged)), nnx.to_flat_state(specs), strict=True
    ):
        got = var.get_value().sharding.spec
        assert tuple(got) + (None,) * (len(spec) - len(got)) == tuple(spec), path


def test_value_model_takes_adapters():
    cfg = TEST_CONFIG
    critic = random_model(ValueModel, cfg, seed=11)
    tokens, mask = _padded_batch()
    before = np.asarray(critic(tokens, mask_bt=mask))
    adapted = lora.apply_lora(critic, LORA)
    np.testing.assert_array_equal(np.asarray(adapted(tokens, mask_bt=mask)), before)
    assert isinstance(lora.merge(adapted), ValueModel)


# ---------------------------------------------------------------------------------------------
# PEFT and transformers, both ways

torch = pytest.importorskip("torch")
peft_lib = pytest.importorskip("peft")

from agentrl_jax.models import hf_checkpoint as hc  # noqa: E402
from agentrl_jax.models import peft as our_peft  # noqa: E402
from agentrl_jax.models.testing import hf_logits, random_hf_checkpoint, torch_logits  # noqa: E402

_CKPTS: dict[bool, pathlib.Path] = {}


@pytest.fixture(scope="module")
def hf_bases(tmp_path_factory):
    """Random transformers-made base checkpoints, by ``tie_word_embeddings``."""

    def get(tie: bool) -> pathlib.Path:
        if tie not in _CKPTS:
            cfg = TEST_CONFIG.replace(tie_word_embeddings=tie)
            path = tmp_path_factory.mktemp("base")
            _CKPTS[tie] = random_hf_checkpoint(path, cfg, seed=int(tie))
        return _CKPTS[tie]

    return get


# (tied embeddings, scanned layers): each variant is covered once.
VARIANTS = pytest.mark.parametrize(
    "tie,scan", [(True, False), (False, True)], ids=["tied-unrolled", "untied-scanned"]
)


@VARIANTS
def test_our_adapter_in_peft(hf_bases, tie, scan, tmp_path):
    """Bar (a): our adapter (nonzero B), saved in PEFT's format and loaded by
    ``peft.PeftModel.from_pretrained`` onto transformers' Qwen2 from the same base: logits
    within 1e-5 of ours. Also read back by us, bit for bit."""
    hf_base = hf_bases(tie)
    lora_cfg = LoraConfig(rank=4, alpha=12.0, targets="q,k,v,o,gate,up,down")
    model = hc.load_hf_model(hf_base, scan_layers=scan, lora=lora_cfg)
    model = _randomize_adapters(model, seed=12, std=0.2)
    tokens, mask = _padded_batch()
    ours = np.asarray(_forward(model, tokens, mask))
    out = our_peft.save_peft_adapter(model, tmp_path / "adapter", base_model_name_or_path="x/y")
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 12 and config["peft_type"] == "LORA"
    assert config["base_model_name_or_path"] == "x/y"
    theirs = hf_logits(hf_base, tokens, mask, adapter_dir=out)
    diff = _max_diff(ours, theirs, mask)
    print(f"our adapter in peft ({'scanned' if scan else 'unrolled'}): max |logit diff| {diff:.2e}")
    assert diff <= TOL
    assert _max_diff(hf_logits(hf_base, tokens, mask), theirs, mask) > 0.1  # B matters
    back = our_peft.load_peft_adapter(hc.load_hf_model(hf_base, scan_layers=scan), out)
    assert back.cfg.lora == lora_cfg
    for (p, a), (_, b) in zip(
        nnx.to_flat_state(lora.adapters(model)), nnx.to_flat_state(lora.adapters(back)), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(a.get_value()), np.asarray(b.get_value()), p)


def _peft_adapter(base_dir, out_dir, *, seed, **config):
    """A LoRA adapter created and saved by ``peft`` itself (random nonzero A and B), and the
    PEFT model's logits function."""
    import transformers  # noqa: PLC0415

    hf = transformers.Qwen2ForCausalLM.from_pretrained(
        str(base_dir), attn_implementation="eager", dtype=torch.float32
    )
    model = peft_lib.get_peft_model(hf, peft_lib.LoraConfig(**config))
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.normal_(0.0, 0.2)
    model.save_pretrained(str(out_dir))
    return model.eval()


@pytest.mark.parametrize(
    "tie,scan,config",
    [
        (True, False, dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])),
        (False, True, dict(r=8, lora_alpha=16, target_modules="all-linear", lora_dropout=0.1)),
        (
            True,
            True,
            dict(r=4, lora_alpha=4, target_modules=["o_proj", "down_proj"], use_rslora=True),
        ),
    ],
    ids=["qv-tied-unrolled", "all-linear-untied-scanned", "rslora-tied-scanned"],
)
def test_peft_adapter_in_our_model(hf_bases, tie, scan, config, tmp_path):
    """Bar (b): an adapter created and saved by ``peft`` (``get_peft_model``, random nonzero B)
    loaded into our model (a warm start from someone's LoRA SFT): logits within 1e-5 of the
    PEFT model's."""
    hf_base = hf_bases(tie)
    theirs_model = _peft_adapter(hf_base, tmp_path / "adapter", seed=13, **config)
    tokens, mask = _padded_batch()
    theirs = torch_logits(theirs_model, tokens, mask)
    model = our_peft.load_peft_adapter(
        hc.load_hf_model(hf_base, scan_layers=scan), tmp_path / "adapter"
    )
    targets = config["target_modules"]
    expected = (
        LORA_TARGETS
        if targets == "all-linear"
        else tuple(t for t in LORA_TARGETS if f"{t}_proj" in targets)
    )
    assert model.cfg.lora.targets == expected and model.cfg.lora.rank == config["r"]
    assert model.cfg.lora.dropout == config.get("lora_dropout", 0.0)
    diff = _max_diff(_forward(model, tokens, mask), theirs, mask)
    print(f"peft adapter in ours ({config}): max |logit diff| {diff:.2e}")
    assert diff <= TOL
    assert _max_diff(hf_logits(hf_base, tokens, mask), theirs, mask) > 0.1  # B matters


@VARIANTS
def test_merged_export_loads_in_transformers(hf_bases, tie, scan, tmp_path):
    """Bar (c): ``save_hf_checkpoint`` of a LoRA policy writes the merged model as a plain Qwen2
    checkpoint; transformers' logits on it are within 1e-5 of ours."""
    hf_base = hf_bases(tie)
    model = hc.load_hf_model(hf_base, scan_layers=scan, lora=LORA)
    model = _randomize_adapters(model, seed=14, std=0.2)
    tokens, mask = _padded_batch()
    ours = _forward(model, tokens, mask)
    out = hc.save_hf_checkpoint(model, tmp_path / "merged")
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "float32"
    theirs = hf_logits(out, tokens, mask)
    diff = _max_diff(ours, theirs, mask)
    print(f"merged export in transformers ({'scanned' if scan else 'unrolled'}): {diff:.2e}")
    assert diff <= TOL
    assert _max_diff(hf_logits(hf_base, tokens, mask), theirs, mask) > 0.1


# ---------------------------------------------------------------------------------------------
# Refusals


@pytest.fixture(scope="module")
def saved_adapter(tmp_path_factory) -> pathlib.Path:
    model = lora.apply_lora(random_model(CausalLM, TEST_CONFIG), LORA)
    return our_peft.save_peft_adapter(model, tmp_path_factory.mktemp("lora") / "adapter")


@pytest.fixture
def adapter_dir(saved_adapter, tmp_path) -> pathlib.Path:
    """A copy of an adapter we saved, for a test to spoil."""
    return pathlib.Path(shutil.copytree(saved_adapter, tmp_path / "adapter"))


def _rewrite(directory, *, config=None, drop=(), add=None, reshape=None):
    from safetensors.numpy import load_file, save_file  # noqa: PLC0415

    if config:
        path = directory / our_peft.ADAPTER_CONFIG
        path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    tensors = load_file(str(directory / our_peft.ADAPTER_FILE))
    for key in drop:
        del tensors[key]
    tensors.update(add or {})
    for key, shape in (reshape or {}).items():
        tensors[key] = np.zeros(shape, np.float32)
    save_file(tensors, str(directory / our_peft.ADAPTER_FILE), metadata={"format": "pt"})


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(config={"use_dora": True}), "use_dora=True is not supported"),
        (dict(config={"bias": "all"}), "bias='all' is not supported"),
        (dict(config={"modules_to_save": ["lm_head"]}), "modules_to_save"),
        (dict(config={"rank_pattern": {"q_proj": 8}}), "rank_pattern"),
        (dict(config={"init_lora_weights": "pissa"}), "init_lora_weights='pissa'"),
        (dict(config={"peft_type": "IA3"}), "only 'LORA'"),
        (
            dict(add={"base_model.model.lm_head.lora_A.weight": np.zeros((4, 64), np.float32)}),
            "'base_model.model.lm_head.lora_A.weight' is not a LoRA adapter of a decoder",
        ),
        (
            dict(drop=["base_model.model.model.layers.1.mlp.up_proj.lora_B.weight"]),
            "layers.1.mlp.up_proj.lora_B.weight' is missing",
        ),
        (
            dict(
                reshape={"base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight": (32, 8)}
            ),
            r"has shape \(32, 8\), but r=4 and the model imply \(32, 4\)",
        ),
    ],
    ids=[
        "dora",
        "bias",
        "modules_to_save",
        "rank_pattern",
        "pissa",
        "ia3",
        "lm_head",
        "missing",
        "shape",
    ],
)
def test_unsupported_adapters_are_refused(adapter_dir, change, message):
    _rewrite(adapter_dir, **change)
    base = random_model(CausalLM, TEST_CONFIG)
    with pytest.raises(hc.CheckpointError, match=message):
        our_peft.load_peft_adapter(base, adapter_dir)


def test_missing_files(tmp_path, adapter_dir):
    base = random_model(CausalLM, TEST_CONFIG)
    with pytest.raises(FileNotFoundError, match="adapter_config.json not found"):
        our_peft.load_peft_adapter(base, tmp_path)
    (adapter_dir / our_peft.ADAPTER_FILE).unlink()
    with pytest.raises(FileNotFoundError, match="adapter_model.safetensors not found"):
        our_peft.load_peft_adapter(base, adapter_dir)
    with pytest.raises(ValueError, match="has no LoRA adapters"):
        our_peft.save_peft_adapter(base, tmp_path / "x")
