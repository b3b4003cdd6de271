r"""Our bfloat16 logits against transformers' bfloat16, both measured against float32 truth.

    python -m launch.bench parity --out parity.json

A Qwen2.5-0.5B-shaped checkpoint (``--model``: another preset's shape and family) with random
weights (std 0.02; built and saved by transformers itself, so it is an independent reference for
our loader), 4 rows of 128 random ids with the
last rows padded. The truth is transformers' float32 forward (eager attention). Both sides then
run in bfloat16 on the same chip (transformers on PyTorch's device: CUDA where it sees one, else
the CPU): our model loaded with ``load_hf_model(dtype=bfloat16)`` (the compute dtype of the
shipped configs), transformers' cast with ``.to(bfloat16)``.

``<preset>/logits_max_abs_error``: the largest absolute difference from the truth over every
real position's logits; ``ours`` is ours, ``reference`` transformers'; lower is better, so the
ratio is theirs over ours. The tolerance is what bfloat16 costs transformers on the same inputs:
``within_tolerance`` holds when our error is at most twice theirs (each side rounds differently,
so neither is exactly the other's). ``<preset>/logits_mean_abs_error`` is the same for the mean.
``--quick``: the 1-layer tiny preset on the CPU, for the test suite.
"""

from __future__ import annotations

import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from agentrl_jax.benchmarks.report import Report, Row
from agentrl_jax.models import registry
from agentrl_jax.models.config import preset
from agentrl_jax.models.testing import positions_from_mask, random_family_checkpoint

TOLERANCE_FACTOR = 2.0  # ours within this factor of transformers' own bf16 error


def _hf_logits(ckpt: str, tokens: np.ndarray, mask: np.ndarray, dtype, device: str):
    import torch  # noqa: PLC0415 - the test extra's; on the accelerator image's python3
    import transformers  # noqa: PLC0415

    model = transformers.AutoModelForCausalLM.from_pretrained(
        ckpt, attn_implementation="eager", dtype=torch.float32
    )
    model = model.to(device=device, dtype=getattr(torch, dtype)).eval()
    as_tensor = lambda x: torch.as_tensor(np.asarray(x), dtype=torch.long, device=device)  # noqa: E731
    with torch.no_grad():
        out = model(
            input_ids=as_tensor(tokens),
            attention_mask=as_tensor(mask),
            position_ids=as_tensor(positions_from_mask(mask)),
        )
    logits = out.logits.float().cpu().numpy()
    del model
    return logits


def _our_logits(ckpt: str, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    from agentrl_jax.models.hf_checkpoint import load_hf_model  # noqa: PLC0415

    model = load_hf_model(ckpt, dtype=jnp.bfloat16)
    # The model is an argument, not a constant of the program (a 1B model's weights would be
    # copied into it: 5 GB more on the host).
    forward = jax.jit(lambda model, t, m: model(t, mask_bt=m)[0])
    logits = forward(model, jnp.asarray(tokens), jnp.asarray(mask))
    return np.asarray(logits.astype(jnp.float32))


def _torch_device() -> str:
    import torch  # noqa: PLC0415

    return "cuda" if torch.cuda.is_available() else "cpu"


def run(quick: bool, model: str | None = None) -> Report:
    """``model``: the preset whose shape and family are measured (default: qwen2.5-0.5b;
    ``--quick``: the tiny one)."""
    name = model or ("tiny" if quick else "qwen2.5-0.5b")
    cfg = preset(name)
    if quick:
        cfg = cfg.with_layers(1)
    batch, length = (2, 16) if quick else (4, 128)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, cfg.vocab_size, (batch, length)).astype(np.int32)
    mask = np.ones((batch, length), np.int32)
    mask[batch // 2 :, length - length // 4 :] = 0  # padded rows, as a batch of episodes has
    device = _torch_device()
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = str(random_family_checkpoint(tmp, cfg, std=0.02))
        truth = _hf_logits(ckpt, tokens, mask, "float32", device)
        theirs = _hf_logits(ckpt, tokens, mask, "bfloat16", device)
        ours = _our_logits(ckpt, tokens, mask)
    architecture = registry.family(cfg).architectures[0]
    real = mask.astype(bool)
    err_ours = np.abs(ours - truth)[real]
    err_theirs = np.abs(theirs - truth)[real]
    report = Report("parity")
    extra = {
        "batch": batch,
        "length": length,
        "truth_max_abs_logit": float(np.abs(truth[real]).max()),
        "reference_is": f"transformers {architecture} in bfloat16 on {device}",
    }
    max_row = Row(
        f"{name}/logits_max_abs_error",
        float(err_ours.max()),
        float(err_theirs.max()),
        "logit",
        higher_is_better=False,
        extra={
            **extra,
            "tolerance": TOLERANCE_FACTOR * float(err_theirs.max()),
            "within_tolerance": bool(err_ours.max() <= TOLERANCE_FACTOR * err_theirs.max()),
        },
    )
    report.add(max_row)
    report.add(
        Row(
            f"{name}/logits_mean_abs_error",
            float(err_ours.mean()),
            float(err_theirs.mean()),
            "logit",
            higher_is_better=False,
            extra=extra,
        )
    )
    report.facts.update(
        backend=jax.default_backend(),
        device_kind=getattr(jax.devices()[0], "device_kind", "unknown"),
        torch_device=device,
    )
    return report
