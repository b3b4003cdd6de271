"""Small models and reference checkpoints for tests and benchmarks.

``TEST_CONFIG`` is a tiny Qwen2 whose every sharded axis divides by 2 and 4, so it runs on any of
the (data, fsdp, tp) test meshes over 8 fake CPU devices. ``random_hf_checkpoint`` writes a
randomly initialised Hugging Face Qwen2 (built by transformers itself, so it is an independent
reference for our loader), ``random_transformers_checkpoint`` one of any family from a
transformers config, and ``hf_logits`` runs either; they need torch (the ``test`` extra).
"""

from __future__ import annotations

import pathlib

import numpy as np

from agentrl_jax.models.config import ModelConfig

TEST_CONFIG = ModelConfig(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    rope_theta=10_000.0,
    max_position_embeddings=256,
)


def positions_from_mask(mask_bt: np.ndarray) -> np.ndarray:
    """[B, T] position ids that count only real tokens (as our model and HF generate do)."""
    return np.maximum(np.cumsum(mask_bt, axis=1) - 1, 0)


def random_hf_checkpoint(
    out_dir: str | pathlib.Path,
    cfg: ModelConfig = TEST_CONFIG,
    *,
    seed: int = 0,
    std: float = 0.2,
    dtype: str = "float32",
) -> pathlib.Path:
    """Saves a transformers Qwen2ForCausalLM with random weights (biases and norms included).

    ``std`` is large enough that logits vary well beyond float32 noise, so parity tests are
    meaningful; ``cfg.tie_word_embeddings`` picks the tied or untied variant; ``dtype`` (a torch
    dtype's name, e.g. ``"bfloat16"`` as Qwen2.5 ships) is what the file stores, cast by torch.
    """
    import torch  # noqa: PLC0415 (test-only dependency)
    import transformers  # noqa: PLC0415

    hf_config = transformers.Qwen2Config(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        rms_norm_eps=cfg.rms_norm_eps,
        tie_word_embeddings=cfg.tie_word_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
    )
    if cfg.head_dim != cfg.hidden_size // cfg.num_heads:
        raise ValueError("transformers' Qwen2 needs head_dim == hidden_size // num_heads")
    torch.manual_seed(seed)
    model = transformers.Qwen2ForCausalLM(hf_config)
    return _randomise_and_save(model, out_dir, std=std, dtype=dtype)


def random_transformers_checkpoint(
    out_dir: str | pathlib.Path, hf_config, *, seed: int = 0, std: float = 0.2
) -> pathlib.Path:
    """Saves transformers' own causal LM of ``hf_config`` (a ``transformers.*Config`` of any
    family: ``AutoModelForCausalLM.from_config``) with N(0, std) weights, norms included, in f32.
    """
    import torch  # noqa: PLC0415 (test-only dependency)
    import transformers  # noqa: PLC0415

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    return _randomise_and_save(model, out_dir, std=std, dtype="float32")


def random_family_checkpoint(
    out_dir: str | pathlib.Path, cfg: ModelConfig, *, seed: int = 0, std: float = 0.2
) -> pathlib.Path:
    """Saves transformers' own causal LM of ``cfg``'s family and shape (its config.json as
    ``hf_checkpoint.config_to_hf`` writes it) with N(0, std) weights, in f32."""
    import transformers  # noqa: PLC0415

    from agentrl_jax.models.hf_checkpoint import config_to_hf  # noqa: PLC0415

    hf_config = transformers.AutoConfig.for_model(**config_to_hf(cfg))
    return random_transformers_checkpoint(out_dir, hf_config, seed=seed, std=std)


def _randomise_and_save(model, out_dir, *, std: float, dtype: str) -> pathlib.Path:
    import torch  # noqa: PLC0415

    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, std)
    model = model.to(getattr(torch, dtype))
    out_dir = pathlib.Path(out_dir)
    model.save_pretrained(str(out_dir))
    return out_dir


def hf_logits(
    ckpt_dir: str | pathlib.Path,
    tokens_bt: np.ndarray,
    mask_bt: np.ndarray,
    *,
    adapter_dir: str | pathlib.Path | None = None,
):
    """[B, T, V] float32 logits of transformers' causal LM of the checkpoint's family (eager
    attention) on a batch; with ``adapter_dir``, of that PEFT adapter loaded onto it
    (``peft.PeftModel``)."""
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(ckpt_dir), attn_implementation="eager", dtype=torch.float32
    ).eval()
    if adapter_dir is not None:
        import peft  # noqa: PLC0415

        model = peft.PeftModel.from_pretrained(model, str(adapter_dir)).eval()
    return torch_logits(model, tokens_bt, mask_bt)


def torch_logits(model, tokens_bt: np.ndarray, mask_bt: np.ndarray) -> np.ndarray:
    """[B, T, V] float32 logits of a transformers (or PEFT) causal LM on a padded batch, with
    positions that count only real tokens."""
    import torch  # noqa: PLC0415

    with torch.no_grad():
        out = model(
            input_ids=torch.as_tensor(np.asarray(tokens_bt), dtype=torch.long),
            attention_mask=torch.as_tensor(np.asarray(mask_bt), dtype=torch.long),
            position_ids=torch.as_tensor(positions_from_mask(np.asarray(mask_bt))),
        )
    return out.logits.float().numpy()


def random_model(
    cls, cfg: ModelConfig = TEST_CONFIG, *, seed: int = 0, std: float = 0.08, mesh=None
):
    """``cls(cfg)`` (policy or value model) with N(0, std) weights and N(1, std) norm scales.

    Weights are drawn on the host with numpy into an abstractly traced model, so building a test
    model costs no XLA compilation (threefry initialisers take seconds to compile on CPU); with
    ``mesh``, each parameter is placed as ``agentrl_jax.sharding`` says.
    """
    import jax  # noqa: PLC0415
    from flax import nnx  # noqa: PLC0415

    from agentrl_jax import sharding  # noqa: PLC0415

    abstract = nnx.eval_shape(lambda: cls(cfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    rng = np.random.RandomState(seed)
    for path, var in nnx.to_flat_state(state):
        spec = var.get_value()
        value = rng.normal(0.0, std, spec.shape) + (1.0 if path[-1] == "weight" else 0.0)
        var.set_value(np.asarray(value, np.float32).astype(spec.dtype))
    if mesh is not None:
        state = jax.device_put(state, sharding.state_shardings(state, mesh))
    else:
        state = jax.device_put(state)
    return nnx.merge(graphdef, state)
