"""LoRA adapters in PEFT's format: ``adapter_config.json`` + ``adapter_model.safetensors``.

What Hugging Face's ``peft`` writes and reads (``PeftModel.save_pretrained`` /
``PeftModel.from_pretrained``) for a causal LM of any family: one pair of tensors per adapted
projection and layer, named as PEFT names them and laid out as torch's ``nn.Linear`` ([out, in]):

    base_model.model.model.layers.{i}.self_attn.{q,k,v,o}_proj.lora_A.weight   [rank, in]
    base_model.model.model.layers.{i}.self_attn.{q,k,v,o}_proj.lora_B.weight   [out, rank]
    base_model.model.model.layers.{i}.mlp.{gate,up,down}_proj.lora_{A,B}.weight

and PEFT computes ``lora_B(lora_A(x)) * lora_alpha / r`` (``/ sqrt(r)`` with ``use_rslora``).

    save_peft_adapter(policy, "runs/x/adapter", base_model_name_or_path="Qwen/Qwen2.5-7B")
    policy = load_peft_adapter(load_hf_model(base_dir), "someone/else/adapter")

The merged model (base + adapters, a plain checkpoint of its family for vLLM or transformers) is
``hf_checkpoint.save_hf_checkpoint(policy, out_dir)``: it merges a LoRA policy itself.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import re
from typing import Any, TypeVar

import jax
import numpy as np
from flax import nnx
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from agentrl_jax import sharding as sharding_lib
from agentrl_jax.models import lora as lora_lib
from agentrl_jax.models import registry
from agentrl_jax.models.config import LORA_TARGETS, LoraConfig, ModelConfig
from agentrl_jax.models.decoder import LoraSlot
from agentrl_jax.models.family import LLAMA_LORA_MODULES
from agentrl_jax.models.hf_checkpoint import (
    CheckpointError,
    TensorMap,
    read_json,
    save_hf_checkpoint,
)

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_FILE = "adapter_model.safetensors"
# A PEFT key of a decoder projection's adapter ("default" is the adapter's name, which
# PeftModel.save_pretrained leaves out; accepted when present). The modules' names are the
# family's (``Family.lora_modules``: target -> (HF module, projection)).
_KEY = re.compile(
    r"^base_model\.model\.model\.layers\.(\d+)\.(\w+)\.(\w+)\.lora_([AB])"
    r"(?:\.default)?\.weight$"
)

M = TypeVar("M", bound=nnx.Module)

__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_FILE",
    "load_peft_adapter",
    "peft_key",
    "save_base_and_adapter",
    "save_peft_adapter",
]


def peft_key(cfg: ModelConfig, layer: int, target: str, which: str) -> str:
    """PEFT's tensor name of layer ``layer``'s ``target`` adapter, ``which`` "A" or "B", in
    ``cfg``'s family's module names."""
    module, proj = registry.family(cfg).lora_modules[target]
    return f"base_model.model.model.layers.{layer}.{module}.{proj}.lora_{which}.weight"


def _tensor_maps(slot: LoraSlot) -> dict[str, TensorMap]:
    """Our A and B (one layer's) <-> PEFT's lora_A [rank, in] and lora_B [out, rank]."""
    r, ins, outs = slot.a_shape[-1], slot.a_shape[:-1], slot.b_shape[1:]
    return {
        # lora_A viewed [r, *in]; ours [*in, r].
        "A": TensorMap("lora_A", ((r,), ins), (*range(1, len(ins) + 1), 0)),
        # lora_B viewed [*out, r]; ours [r, *out].
        "B": TensorMap("lora_B", (outs, (r,)), (len(outs), *range(len(outs)))),
    }


def _adapter_paths(model: nnx.Module) -> dict[tuple[str, str], tuple]:
    """(target, "A" / "B") -> the state path of its (stacked or layer-0) adapter."""
    out = {}
    for path, var in nnx.to_flat_state(lora_lib.adapters(model)):
        del var
        for target, slot in registry.family(model.cfg).lora_slots(model.cfg).items():
            for which, name in (("A", slot.a), ("B", slot.b)):
                if path[-2:] == (slot.module, name):
                    out.setdefault((target, which), path)
    return out


def _layer_path(path: tuple, layer: int, scanned: bool) -> tuple:
    """A layer's adapter path: the stacked one's (sliced by the caller) or layer ``layer``'s."""
    if scanned:
        return path
    k = path.index("layers")
    return (*path[: k + 1], layer, *path[k + 2 :])


def adapter_config_dict(
    lora: LoraConfig,
    *,
    base_model_name_or_path: str | None = None,
    modules: Any = None,
) -> dict[str, Any]:
    """The ``adapter_config.json`` PEFT needs for ``lora`` on a causal LM whose family names its
    projections as ``modules`` (``Family.lora_modules``; default: Llama's names)."""
    alpha = int(lora.alpha) if float(lora.alpha).is_integer() else lora.alpha
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name_or_path,
        "r": lora.rank,
        "lora_alpha": alpha,
        "lora_dropout": lora.dropout,
        "target_modules": sorted((modules or LLAMA_LORA_MODULES)[t][1] for t in lora.targets),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "modules_to_save": None,
        "layers_to_transform": None,
        "layers_pattern": None,
        "rank_pattern": {},
        "alpha_pattern": {},
        "use_rslora": False,
        "use_dora": False,
        "lora_bias": False,
    }


def save_peft_adapter(
    model: nnx.Module,
    directory: str | pathlib.Path,
    *,
    base_model_name_or_path: str | None = None,
    dtype: Any = None,
) -> pathlib.Path:
    """Writes ``model``'s LoRA adapters as a PEFT adapter directory.

    ``peft.PeftModel.from_pretrained(transformers_qwen2, directory)`` then computes what
    ``model`` computes (tests/test_lora.py: f32 logits within 1e-5). Adapters are gathered to
    the host one at a time (every process takes part; process 0 writes).

    Args:
      model: a LoRA policy (``cfg.lora`` set), scanned or not, sharded or not.
      directory: created if needed; ``adapter_config.json`` and ``adapter_model.safetensors``
        in it are overwritten.
      base_model_name_or_path: what PEFT records as the base (a hub id or a local directory);
        ``from_pretrained`` of the adapter alone loads it from there.
      dtype: the tensors' dtype (default: the adapters' own, f32).

    Raises:
      ValueError: the model has no adapters.
    """
    cfg: ModelConfig = model.cfg
    if cfg.lora is None:
        raise ValueError("save_peft_adapter: the model has no LoRA adapters (cfg.lora is None)")
    directory = pathlib.Path(directory)
    dtype = np.dtype(cfg.lora.param_dtype if dtype is None else dtype)
    family = registry.family(cfg)
    slots = family.lora_slots(cfg)
    flat = dict(nnx.to_flat_state(lora_lib.adapters(model)))
    paths = _adapter_paths(model)
    tensors = {}
    for layer in range(cfg.num_layers):
        for target in cfg.lora.targets:
            maps = _tensor_maps(slots[target])
            for which in ("A", "B"):
                value = flat[_layer_path(paths[(target, which)], layer, cfg.scan_layers)]
                array = value.get_value()
                if cfg.scan_layers:
                    array = array[layer]
                host = sharding_lib.host_array(array)
                key = peft_key(cfg, layer, target, which)
                tensors[key] = maps[which].to_hf(host).astype(dtype)
    if jax.process_index() == 0:
        directory.mkdir(parents=True, exist_ok=True)
        config = adapter_config_dict(
            cfg.lora,
            base_model_name_or_path=base_model_name_or_path,
            modules=family.lora_modules,
        )
        (directory / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
        save_file(tensors, str(directory / ADAPTER_FILE), metadata={"format": "pt"})
    return directory


def save_base_and_adapter(
    model: nnx.Module,
    out: str | pathlib.Path,
    *,
    dtype: Any = None,
    tokenizer: Any = None,
    eos_token_id: int | None = None,
) -> tuple[pathlib.Path, pathlib.Path]:
    """Writes a LoRA policy as the base it was trained on and its adapter: ``out/base``, the
    frozen base (``lora.base_model``) as a Hugging Face checkpoint with ``tokenizer``, and
    ``out/adapter``, the adapters in PEFT's format, whose ``base_model_name_or_path`` is
    ``out/base`` (absolute). So ``AutoPeftModelForCausalLM.from_pretrained(out/adapter)`` (or
    ``PeftModel.from_pretrained`` on ``out/base``) computes what ``model`` does; the adapter
    never names a base it was not trained on. ``launch.export --what=adapter`` and the end of a
    LoRA run (``Trainer.export_adapter``) write it.

    Args:
      model: a LoRA policy (``cfg.lora`` set).
      out: created if needed.
      dtype: the storage dtype of the base's and the adapters' tensors alike (default: each
        their own: the run's base dtype, the adapters' f32).
      tokenizer: saved beside the base (``save_pretrained``), for serving.
      eos_token_id: the base's stop token for ``generate`` (``save_hf_checkpoint``).

    Returns:
      ``(out/base, out/adapter)``.

    Raises:
      ValueError: the model has no adapters.
    """
    if model.cfg.lora is None:
        raise ValueError("save_base_and_adapter: the model has no LoRA adapters (cfg.lora is None)")
    out = pathlib.Path(out)
    base_dir, adapter_dir = out / "base", out / "adapter"
    base = lora_lib.base_model(model)
    save_hf_checkpoint(base, base_dir, dtype=dtype, tokenizer=tokenizer, eos_token_id=eos_token_id)
    save_peft_adapter(
        model, adapter_dir, base_model_name_or_path=os.path.abspath(base_dir), dtype=dtype
    )
    return base_dir, adapter_dir


# Fields of adapter_config.json that would change what the adapter computes, and the values
# this loader implements (anything else is refused, naming the field).
_PLAIN = {
    "use_dora": (False, None),
    "bias": ("none", None),
    "lora_bias": (False, None),
    "fan_in_fan_out": (False, None),
    "modules_to_save": (None, []),
    "rank_pattern": ({}, None),
    "alpha_pattern": ({}, None),
    "layers_to_transform": (None, []),
    "layer_replication": (None, []),
    "target_parameters": (None, []),
    "trainable_token_indices": (None, {}, []),
    "use_qalora": (False, None),
    "alora_invocation_tokens": (None, []),
}


def _read_config(directory: pathlib.Path) -> dict[str, Any]:
    path = directory / ADAPTER_CONFIG
    config = read_json(path, "a PEFT adapter directory")
    if config.get("peft_type") != "LORA":
        raise CheckpointError(f"{path}: peft_type={config.get('peft_type')!r}; only 'LORA'")
    for field, allowed in _PLAIN.items():
        if field in config and config[field] not in allowed:
            raise CheckpointError(
                f"{path}: {field}={config[field]!r} is not supported (plain LoRA on the decoder "
                f"projections only; expected {' or '.join(repr(a) for a in allowed)})"
            )
    init = config.get("init_lora_weights", True)
    if init not in (True, False, "gaussian"):
        # PiSSA, OLoRA, CorDA, EVA and LoftQ adapters are saved against a changed base.
        raise CheckpointError(
            f"{path}: init_lora_weights={init!r} is not supported (its adapter is saved "
            "against a modified base)"
        )
    for field in ("r", "lora_alpha"):
        value = config.get(field)
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise CheckpointError(f"{path}: {field}={value!r} must be a positive number")
    if not isinstance(config["r"], int):
        raise CheckpointError(f"{path}: r={config['r']!r} must be an integer")
    return config


def load_peft_adapter(model: M, directory: str | pathlib.Path, *, param_dtype: Any = None) -> M:
    """``model``'s base with the LoRA adapters of a PEFT adapter directory (e.g. someone's LoRA
    SFT, written by ``peft``), computing what PEFT computes on the same base.

    The targets are the projections the file holds (every layer must have the same ones); rank,
    alpha and dropout come from ``adapter_config.json`` (``use_rslora``: alpha / sqrt(r) is
    kept as the equivalent alpha * sqrt(r) / r). The adapters are placed on the model's mesh by
    the rules (``lora.apply_lora``'s layout). Anything that would change the computation beyond
    plain LoRA on the decoder's projections (DoRA, trained biases, ``modules_to_save``,
    per-module ranks, LoRA on the embeddings or the LM head...) is refused, naming the field or
    tensor.

    Args:
      model: the base (a policy or value model; its own adapters, if any, are replaced).
      directory: holds ``adapter_config.json`` and ``adapter_model.safetensors``.
      param_dtype: the adapters' dtype (default f32).

    Raises:
      FileNotFoundError: a file is missing.
      CheckpointError: the config or a tensor is unsupported, missing or misshapen.
    """
    directory = pathlib.Path(directory)
    config = _read_config(directory)
    file = directory / ADAPTER_FILE
    if not file.is_file():
        raise FileNotFoundError(f"{file} not found (expected a PEFT adapter directory)")
    base = lora_lib.base_model(model)
    cfg: ModelConfig = base.cfg
    rank = config["r"]
    alpha = float(config["lora_alpha"])
    if config.get("use_rslora", False):
        alpha = alpha * math.sqrt(rank)  # PEFT's scale alpha / sqrt(r) == (alpha sqrt(r)) / r
    try:
        with safe_open(str(file), "numpy") as f:
            arrays = {key: f.get_tensor(key) for key in f.keys()}  # noqa: SIM118
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{file}: cannot read it as safetensors: {e}") from e

    family = registry.family(cfg)
    modules = family.lora_modules
    target_of = {proj: target for target, (_, proj) in modules.items()}
    found: dict[tuple[int, str, str], np.ndarray] = {}
    for key, array in arrays.items():
        match = _KEY.match(key)
        target = target_of.get(match.group(3)) if match else None
        if match is None or target is None or modules[target][0] != match.group(2):
            raise CheckpointError(
                f"{file}: tensor {key!r} is not a LoRA adapter of a decoder projection "
                f"({', '.join(p for _, p in modules.values())}); not supported"
            )
        layer = int(match.group(1))
        if layer >= cfg.num_layers:
            raise CheckpointError(
                f"{file}: tensor {key!r} is for layer {layer}, but the model has "
                f"{cfg.num_layers} layers"
            )
        found[(layer, target, match.group(4))] = array
    targets = tuple(t for t in LORA_TARGETS if any(k[1] == t for k in found))
    if not targets:
        raise CheckpointError(f"{file} holds no LoRA tensors")
    lora = LoraConfig(
        rank=rank,
        alpha=alpha,
        dropout=float(config.get("lora_dropout", 0.0)),
        targets=targets,
        **({} if param_dtype is None else {"param_dtype": param_dtype}),
    )
    lcfg = cfg.replace(lora=lora)
    slots = family.lora_slots(lcfg)
    per_layer: dict[tuple[str, str], list[np.ndarray]] = {}
    for target in targets:
        maps = _tensor_maps(slots[target])
        for which in ("A", "B"):
            tmap = maps[which]
            for layer in range(cfg.num_layers):
                key = peft_key(cfg, layer, target, which)
                array = found.get((layer, target, which))
                if array is None:
                    raise CheckpointError(
                        f"{file}: tensor {key!r} is missing (adapters on some layers only are "
                        "not supported)"
                    )
                if tuple(array.shape) != tmap.hf_shape:
                    raise CheckpointError(
                        f"{file}: tensor {key!r} has shape {tuple(array.shape)}, but r={rank} "
                        f"and the model imply {tmap.hf_shape}"
                    )
                ours = array.reshape(tmap.view_shape).transpose(tmap.perm)
                per_layer.setdefault((target, which), []).append(
                    ours.astype(np.dtype(lora.param_dtype))
                )

    which_of = {}
    for target, slot in slots.items():
        which_of[(slot.module, slot.a)] = (target, "A")
        which_of[(slot.module, slot.b)] = (target, "B")

    def value(path: tuple, var: nnx.Variable) -> np.ndarray:
        layers = per_layer[which_of[tuple(path[-2:])]]
        if cfg.scan_layers:
            return np.stack(layers)
        return layers[path[path.index("layers") + 1]]

    return lora_lib.attach_adapters(base, lora, value)
