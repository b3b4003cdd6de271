"""The model families beside Qwen2, each against transformers' own class on a random tiny
checkpoint that transformers builds and saves (nothing downloaded).

Bars (issue #42; f32, fixed, never relaxed):
- logits within 1e-4 of transformers on a padded batch, row by row: no padding, left padding,
  right padding (unrolled and scanned layers);
- cached decoding (the sampler, two turns) equals teacher forcing: log-probs within 1e-5;
- our saved checkpoint loads in transformers with the same logits (1e-4);
- the PEFT round trip within 1e-5 both ways: our adapter in ``peft`` on transformers' model,
  and an adapter made by ``peft`` in ours.

Run with ``-s`` to see each measured difference.
"""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft_lib = pytest.importorskip("peft")

from agentrl_jax.models import hf_checkpoint as hc  # noqa: E402
from agentrl_jax.models import lora, registry  # noqa: E402
from agentrl_jax.models import peft as our_peft  # noqa: E402
from agentrl_jax.models.config import LORA_TARGETS as LORA_ALL  # noqa: E402
from agentrl_jax.models.config import LoraConfig  # noqa: E402
from agentrl_jax.models.testing import (  # noqa: E402
    hf_logits,
    random_transformers_checkpoint,
    torch_logits,
)
from agentrl_jax.sampling import Sampler, SamplingParams  # noqa: E402
from agentrl_jax.sampling.testing import TeacherForcer  # noqa: E402

TOL = 1e-4  # logits against transformers (issue #42)
PEFT_TOL = 1e-5  # the PEFT round trip (issue #42, as issue #32's for Qwen2)
CACHE_TOL = 1e-5  # sampled log-probs against teacher forcing (as tests/test_sampler.py)

VOCAB = 128
# Shared by every family's tiny config: every width divides by 2 and 4.
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)


def _qwen3(variant: str):
    """Qwen3: q/k norms, no biases, a head dim (24) other than hidden / heads (16)."""
    return transformers.Qwen3Config(
        **COMMON,
        num_hidden_layers=2,
        head_dim=24,
        rms_norm_eps=1e-6,
        tie_word_embeddings=variant == "tied",
        rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
    )


def _llama(variant: str):
    """Llama 3.x: no biases, llama3 RoPE scaling (a short original context, so the low, medium
    and high frequencies all occur), tied (3.2 1B / 3B) or untied (3.1 8B) embeddings."""
    return transformers.LlamaConfig(
        **COMMON,
        num_hidden_layers=2,
        head_dim=16,
        rms_norm_eps=1e-5,
        tie_word_embeddings=variant == "tied",
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500_000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    )


def _gemma3(variant: str):
    """Gemma 3 text: sliding layers (window 4, shorter than the batch's rows) around a global
    one, each kind with its RoPE base (the global one scaled linearly when ``capped``), a head
    dim (32) other than hidden / heads, query_pre_attn_scalar 24, and, when ``capped``,
    soft-capped logits."""
    capped = variant == "capped"
    return transformers.Gemma3TextConfig(
        **COMMON,
        num_hidden_layers=3,
        head_dim=32,
        rms_norm_eps=1e-6,
        query_pre_attn_scalar=24,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={
            "full_attention": (
                {"rope_type": "linear", "factor": 2.0, "rope_theta": 100_000.0}
                if capped
                else {"rope_type": "default", "rope_theta": 1_000_000.0}
            ),
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        },
        final_logit_softcapping=30.0 if capped else None,
    )


def _qwen3_moe(variant: str):
    """Qwen3-MoE: 8 experts of width 32, 2 a token. ``sparse``: every layer routed, top-k
    weights renormalised, untied; ``mixed``: layer 1 dense (``mlp_only_layers``), raw top-k
    weights, tied (unrolled only: scanning needs every layer alike)."""
    mixed = variant == "mixed"
    return transformers.Qwen3MoeConfig(
        **COMMON,
        num_hidden_layers=3,
        head_dim=24,
        rms_norm_eps=1e-6,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        norm_topk_prob=not mixed,
        mlp_only_layers=[1] if mixed else [],
        tie_word_embeddings=mixed,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
    )


# family -> (its variants, a transformers config per variant, the weights' std). Variants cover
# tied and untied embeddings and each optional piece of the architecture once. The std puts the
# logits at several units (the bars then sit well below what the weights move) but not much
# more: Gemma's embeddings are scaled by sqrt(64) = 8, and at std 0.3 its logits reach ~20,
# where f32 rounding alone moves them by several 1e-6 (transformers' own f32 against its f64:
# 3e-6); run in f64, ours and transformers + PEFT agree there within 1e-14.
FAMILIES = {
    "qwen3": (("tied", "untied"), _qwen3, 0.3),
    "llama": (("tied", "untied"), _llama, 0.3),
    "gemma3_text": (("capped", "plain"), _gemma3, 0.2),
    "qwen3_moe": (("sparse", "mixed"), _qwen3_moe, 0.3),
}
# The projections LoRA adapts per family (default: all seven): Qwen3-MoE's attention only, its
# experts and dense MLPs get no adapters.
LORA_TARGETS = {"qwen3_moe": ("q", "k", "v", "o")}
_HF_PROJ = dict(q="q_proj", k="k_proj", v="v_proj", o="o_proj")
CASES = [(family, v) for family, (variants, *_) in FAMILIES.items() for v in variants]
IDS = [f"{family}-{v}" for family, v in CASES]

_CKPTS: dict[tuple[str, str], pathlib.Path] = {}


@pytest.fixture(scope="module", params=CASES, ids=IDS)
def case(request, tmp_path_factory):
    """(family, variant, checkpoint dir): one random transformers checkpoint per case."""
    family, variant = request.param
    if request.param not in _CKPTS:
        _, make_config, std = FAMILIES[family]
        seed = CASES.index(request.param)
        _CKPTS[request.param] = random_transformers_checkpoint(
            tmp_path_factory.mktemp(f"{family}-{variant}"), make_config(variant), seed=seed, std=std
        )
    return family, variant, _CKPTS[request.param]


# Rows: no padding, left padding, right padding; 12 tokens (longer than a sliding window).
ROWS = ("none", "left", "right")


def _padded_batch():
    tokens = np.random.RandomState(0).randint(0, VOCAB, (3, 12))
    mask = np.ones(tokens.shape, np.int64)
    mask[1, :4] = 0
    mask[2, 9:] = 0
    return tokens, mask


@jax.jit
def _forward(model, tokens, mask):
    return model(tokens, mask_bt=mask)[0]


def _row_diffs(ours, ref, mask) -> dict[str, float]:
    """Max |difference| over each row's real tokens, by padding mode."""
    diff = np.abs(np.asarray(ours, np.float64) - np.asarray(ref, np.float64))
    return {row: float(diff[i][mask[i].astype(bool)].max()) for i, row in enumerate(ROWS)}


def _fmt(diffs: dict[str, float]) -> str:
    return ", ".join(f"{row} {d:.1e}" for row, d in diffs.items())


def test_config_names_the_family(case):
    family, _, ckpt = case
    cfg = hc.load_config(ckpt)
    assert cfg.family == family and registry.family(cfg).model_type == family
    hf = json.loads((ckpt / "config.json").read_text())
    # Our config.json for the same model reads back as the same config.
    assert hc.config_from_hf(hc.config_to_hf(cfg)) == cfg
    assert hf["model_type"] == hc.config_to_hf(cfg)["model_type"]


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scanned"])
def test_logits_match_transformers(case, scan):
    family, variant, ckpt = case
    if scan and any(hc.load_config(ckpt).sparse_layers) and variant == "mixed":
        pytest.skip("sparse and dense layers mixed: scanning needs every layer alike")
    tokens, mask = _padded_batch()
    model = hc.load_hf_model(ckpt, scan_layers=scan)
    ref = hf_logits(ckpt, tokens, mask)
    print(f"{family}-{variant} max |logit| {np.abs(ref).max():.1f}")
    assert np.abs(ref).max() > 1.0  # random weights large enough to make the check meaningful
    diffs = _row_diffs(_forward(model, tokens, mask), ref, mask)
    print(f"{family}-{variant} {'scanned' if scan else 'unrolled'} f32 logits: {_fmt(diffs)}")
    assert max(diffs.values()) <= TOL, diffs


def test_saved_checkpoint_loads_in_transformers(case, tmp_path):
    family, variant, ckpt = case
    tokens, mask = _padded_batch()
    model = hc.load_hf_model(ckpt)
    # Move the weights so the check cannot pass by copying the input files.
    state = nnx.state(model, nnx.Param)
    nnx.update(model, jax.tree.map(lambda x: x * 1.25, state))
    out = hc.save_hf_checkpoint(model, tmp_path / "saved")
    assert json.loads((out / "config.json").read_text())["model_type"] == family
    diffs = _row_diffs(_forward(model, tokens, mask), hf_logits(out, tokens, mask), mask)
    print(f"{family}-{variant} saved, in transformers: {_fmt(diffs)}")
    assert max(diffs.values()) <= TOL, diffs
    again = hc.load_hf_model(out)
    assert again.cfg == model.cfg
    for a, b in zip(
        jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(again)), strict=True
    ):
        np.testing.assert_array_equal(a, b)


def test_cached_decoding_equals_teacher_forcing(case):
    """Two sampled turns through the sampler's KV cache (the second appends an observation to
    the first's history); every drawn token's log-prob equals teacher forcing's on the whole
    conversation."""
    family, variant, ckpt = case
    worst = cached_decoding_vs_teacher_forcing(hc.load_hf_model(ckpt))
    print(f"{family}-{variant} sampler (2 turns) vs teacher forcing: log-prob diff {worst:.1e}")
    assert worst <= CACHE_TOL


def cached_decoding_vs_teacher_forcing(model) -> float:
    """The largest |difference| between the log-probs of the tokens the sampler draws in two
    turns (3 rows, each longer than any sliding window here) and teacher forcing's on the
    whole conversations."""
    sampler = Sampler(
        model,
        sampling=SamplingParams(temperature=1.0),
        pad_id=0,
        cache_buckets=[64],
        chunk_buckets=[16],
        width_buckets=[16],
    )
    rng = np.random.default_rng(1)
    prompts = [rng.integers(1, VOCAB, n).tolist() for n in (9, 3, 14)]
    observations = [rng.integers(1, VOCAB, n).tolist() for n in (5, 11, 2)]
    cache = sampler.start(3, 64)
    first = sampler.step_turn(cache, prompts, [6, 10, 8], jax.random.key(2))
    second = sampler.step_turn(first.cache, observations, [7, 5, 9], jax.random.key(3))
    conversations, scored = [], []
    for b in range(3):
        g1, g2 = first.token_lists()[b], second.token_lists()[b]
        conv = prompts[b] + g1 + observations[b] + g2
        conversations.append(conv)
        # Positions whose logits predict each drawn token, and the drawn tokens' log-probs.
        start1, start2 = len(prompts[b]) - 1, len(prompts[b] + g1 + observations[b]) - 1
        pos = [*range(start1, start1 + len(g1)), *range(start2, start2 + len(g2))]
        ours = [*np.asarray(first.policy_logprobs[b, : len(g1)])]
        ours += [*np.asarray(second.policy_logprobs[b, : len(g2)])]
        scored.append((pos, g1 + g2, np.asarray(ours)))
    logits = TeacherForcer(model, batch=3, length=64).logits(conversations)
    logprobs = np.asarray(jax.nn.log_softmax(jnp.asarray(logits), axis=-1))
    worst = 0.0
    for b, (pos, drawn, ours) in enumerate(scored):
        worst = max(worst, float(np.abs(ours - logprobs[b, pos, drawn]).max()))
    assert min(len(c) for c in conversations) > 16  # longer than any sliding window here
    return worst


def _randomize_adapters(model, *, seed, std=0.2):
    """Every adapter (A and B) drawn N(0, std): B nonzero, so the adapter matters."""
    rng = np.random.RandomState(seed)
    state = lora.adapters(model)
    for _, var in nnx.to_flat_state(state):
        old = var.get_value()
        var.set_value(jax.device_put(rng.normal(0, std, old.shape).astype(old.dtype)))
    lora.with_adapters(model, state)
    return model


def test_our_adapter_in_peft(case, tmp_path):
    """Our adapter (every projection, nonzero B), saved in PEFT's format and loaded by
    ``peft.PeftModel`` onto transformers' model of the same base: logits within 1e-5."""
    family, variant, ckpt = case
    targets = LORA_TARGETS.get(family, "all")
    model = hc.load_hf_model(ckpt, lora=LoraConfig(rank=4, alpha=12.0, targets=targets))
    model = _randomize_adapters(model, seed=12)
    tokens, mask = _padded_batch()
    out = our_peft.save_peft_adapter(model, tmp_path / "adapter", base_model_name_or_path="x/y")
    theirs = hf_logits(ckpt, tokens, mask, adapter_dir=out)
    diffs = _row_diffs(_forward(model, tokens, mask), theirs, mask)
    print(f"{family}-{variant} our adapter in peft: {_fmt(diffs)}")
    assert max(diffs.values()) <= PEFT_TOL, diffs
    assert max(_row_diffs(hf_logits(ckpt, tokens, mask), theirs, mask).values()) > 0.1


def test_peft_adapter_in_our_model(case, tmp_path):
    """An adapter created and saved by ``peft`` itself (``get_peft_model`` on transformers'
    model, random nonzero A and B) loaded into ours: logits within 1e-5 of the PEFT model's."""
    family, variant, ckpt = case
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(ckpt), attn_implementation="eager", dtype=torch.float32
    )
    targets = LORA_TARGETS.get(family)
    modules = [_HF_PROJ[t] for t in targets] if targets else "all-linear"
    config = peft_lib.LoraConfig(r=4, lora_alpha=8, target_modules=modules)
    peft_model = peft_lib.get_peft_model(hf, config)
    torch.manual_seed(13)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.normal_(0.0, 0.2)
    peft_model.save_pretrained(str(tmp_path / "adapter"))
    tokens, mask = _padded_batch()
    theirs = torch_logits(peft_model.eval(), tokens, mask)
    model = our_peft.load_peft_adapter(hc.load_hf_model(ckpt), tmp_path / "adapter")
    assert model.cfg.lora.rank == 4 and model.cfg.lora.targets == (targets or LORA_ALL)
    diffs = _row_diffs(_forward(model, tokens, mask), theirs, mask)
    print(f"{family}-{variant} peft's adapter in ours: {_fmt(diffs)}")
    assert max(diffs.values()) <= PEFT_TOL, diffs


def test_gemma3_legacy_fields_and_refusals():
    """Older Gemma 3 configs: ``sliding_window_pattern`` for the layer types, ``rope_theta`` /
    ``rope_local_base_freq`` / ``rope_scaling`` for the two RoPE kinds. Refused, naming the
    field: attention-score capping (transformers' Gemma 3 ignores it) and other rope types."""
    legacy = {
        "model_type": "gemma3_text",
        "architectures": ["Gemma3ForCausalLM"],
        **{k: v for k, v in COMMON.items()},
        "num_hidden_layers": 7,
        "head_dim": 32,
        "sliding_window": 8,
        "sliding_window_pattern": 3,
        "rope_theta": 1_000_000.0,
        "rope_local_base_freq": 10_000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        "query_pre_attn_scalar": 32,
    }
    cfg = hc.config_from_hf(legacy)
    assert cfg.sliding_layers == (True, True, False, True, True, False, True)
    assert (cfg.rope_theta, cfg.rope_local_theta) == (1_000_000.0, 10_000.0)
    assert cfg.rope_scaling.kind == "linear" and cfg.rope_scaling.factor == 8.0
    assert cfg.tie_word_embeddings and cfg.norm_plus_one and cfg.hidden_act == "gelu_tanh"
    # Ours reads back the same from the layout transformers 5 writes.
    assert hc.config_from_hf(hc.config_to_hf(cfg)) == cfg
    with pytest.raises(hc.CheckpointError, match=r"attn_logit_softcapping=50\.0 is not supported"):
        hc.config_from_hf({**legacy, "attn_logit_softcapping": 50.0})
    with pytest.raises(hc.CheckpointError, match=r"rope_scaling.rope_type='yarn'"):
        hc.config_from_hf({**legacy, "rope_scaling": {"rope_type": "yarn", "factor": 2.0}})
    with pytest.raises(hc.CheckpointError, match=r"model_type='gemma3' is not supported"):
        hc.config_from_hf({**legacy, "model_type": "gemma3"})
