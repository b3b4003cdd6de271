"""Load and save Hugging Face Qwen2 / Qwen2.5 checkpoints (config.json + safetensors).

Loading never builds the whole model on one device: the model is traced abstractly, each
parameter's sharding comes from ``agentrl_jax.sharding``'s rules, and
``jax.make_array_from_callback`` asks each device for just its own slice, which is read from the
memory-mapped safetensors file (``safe_open(...).get_slice``), re-laid-out and cast on the host.
Where a device's slice would be a column block of the file's [out, in] tensor and so make every
host read the whole file (the hidden dim sharded across hosts), the devices instead read
contiguous row blocks and the transpose into our layout runs on the devices.

Saving writes ``config.json`` and ``model.safetensors`` (or numbered shards plus
``model.safetensors.index.json``) in Hugging Face's names and layouts, so transformers and vLLM can
load a trained policy directly; given the run's stop token, also ``generation_config.json``, so
their generation stops where the rollouts stopped.

Public API::

    cfg = load_config(ckpt_dir)                              # ModelConfig from config.json
    policy = load_hf_model(ckpt_dir, mesh=mesh)              # CausalLM, already sharded
    critic = load_hf_value_model(ckpt_dir, mesh=mesh)        # trunk from the checkpoint
    save_hf_checkpoint(policy, out_dir, tokenizer=tok)       # transformers-loadable
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import pathlib
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from agentrl_jax import sharding as sharding_lib
from agentrl_jax.models import lora as lora_lib
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.decoder import CausalLM, ValueModel, stacked_layer_index

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# transformers' ``generate`` defaults (here: where it stops), read beside config.json.
GENERATION_CONFIG_FILE = "generation_config.json"
SUPPORTED_MODEL_TYPES = ("qwen2",)
SUPPORTED_ARCHITECTURES = ("Qwen2ForCausalLM",)

_log = logging.getLogger(__name__)


class CheckpointError(ValueError):
    """A checkpoint directory, its config.json or one of its tensors is not usable."""


# ---------------------------------------------------------------------------------------------
# config.json <-> ModelConfig


def read_json(
    path: pathlib.Path, expected: str = "a Hugging Face checkpoint file"
) -> dict[str, Any]:
    """The JSON object in ``path`` (FileNotFoundError naming ``expected`` when absent;
    CheckpointError when it is not one JSON object)."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found (expected {expected})")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def _check_dir(path: str | pathlib.Path) -> pathlib.Path:
    path = pathlib.Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint directory {path} does not exist")
    if not path.is_dir():
        raise CheckpointError(f"checkpoint path {path} is not a directory")
    return path


def _rope_theta(hf: dict[str, Any], source: pathlib.Path | str) -> float:
    """The RoPE base from either the legacy (``rope_theta``) or transformers-5 layout."""
    params = hf.get("rope_parameters") or {}
    legacy_scaling = hf.get("rope_scaling")
    for field, block in (("rope_parameters", params), ("rope_scaling", legacy_scaling or {})):
        kind = block.get("rope_type", block.get("type", "default"))
        if kind != "default":
            raise CheckpointError(
                f"{source}: {field}.rope_type={kind!r} is not supported (only default RoPE)"
            )
    theta = params.get("rope_theta", hf.get("rope_theta", 10_000.0))
    return float(theta)


def config_from_hf(
    hf: dict[str, Any], *, source: pathlib.Path | str = CONFIG_FILE, **overrides
) -> ModelConfig:
    """A ModelConfig from a Hugging Face Qwen2 ``config.json`` dict.

    Args:
      hf: the parsed config.json.
      source: where it came from, for error messages.
      **overrides: ModelConfig fields to set (e.g. ``dtype``, ``param_dtype``, ``remat``,
        ``scan_layers``).

    Raises:
      CheckpointError: for an unsupported model_type / architecture / attention variant, or a
        missing or invalid field, naming the file, field and value.
    """
    model_type = hf.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise CheckpointError(
            f"{source}: model_type={model_type!r} is not supported; "
            f"expected one of {list(SUPPORTED_MODEL_TYPES)}"
        )
    archs = hf.get("architectures") or list(SUPPORTED_ARCHITECTURES)
    unsupported = [a for a in archs if a not in SUPPORTED_ARCHITECTURES]
    if unsupported:
        raise CheckpointError(
            f"{source}: architectures={archs!r} is not supported; "
            f"expected {list(SUPPORTED_ARCHITECTURES)}"
        )
    if hf.get("hidden_act", "silu") != "silu":
        raise CheckpointError(
            f"{source}: hidden_act={hf['hidden_act']!r} is not supported; expected 'silu'"
        )
    if hf.get("use_sliding_window", False):
        raise CheckpointError(
            f"{source}: use_sliding_window=true is not supported (full attention only)"
        )

    def need_int(field: str, default: int | None = None) -> int:
        value = hf.get(field, default)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise CheckpointError(
                f"{source}: field {field!r} must be a positive integer, got {value!r}"
            )
        return value

    hidden, heads = need_int("hidden_size"), need_int("num_attention_heads")
    kv_heads = need_int("num_key_value_heads", heads)
    if hf.get("head_dim") is None and hidden % heads:
        raise CheckpointError(
            f"{source}: hidden_size={hidden} is not divisible by num_attention_heads={heads} "
            "and no head_dim is given"
        )
    head_dim = need_int("head_dim", hidden // heads)
    if heads % kv_heads:
        raise CheckpointError(
            f"{source}: num_attention_heads={heads} is not a multiple of "
            f"num_key_value_heads={kv_heads}"
        )
    fields = dict(
        vocab_size=need_int("vocab_size"),
        hidden_size=hidden,
        intermediate_size=need_int("intermediate_size"),
        num_layers=need_int("num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rope_theta=_rope_theta(hf, source),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        # Qwen2Config's own default is untied; checkpoints state it explicitly.
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        max_position_embeddings=need_int("max_position_embeddings", 32768),
    )
    fields.update(overrides)
    return ModelConfig(**fields)


def config_to_hf(
    cfg: ModelConfig, *, torch_dtype: str = "float32", eos_token_id: int | None = None
) -> dict[str, Any]:
    """The config.json dict transformers (and vLLM) need to rebuild ``cfg`` as its
    family's causal LM; with ``eos_token_id``, the token that ends a generation."""
    eos = {} if eos_token_id is None else {"eos_token_id": int(eos_token_id)}
    return {
        "architectures": list(SUPPORTED_ARCHITECTURES),
        "model_type": "qwen2",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": cfg.rms_norm_eps,
        # Both layouts: transformers >= 5 reads rope_parameters, older readers rope_theta.
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "use_sliding_window": False,
        "max_window_layers": cfg.num_layers,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        # transformers >= 5 writes "dtype"; older readers (and vLLM) look for "torch_dtype".
        "dtype": torch_dtype,
        "torch_dtype": torch_dtype,
        **eos,
    }


def load_config(path: str | pathlib.Path, **overrides) -> ModelConfig:
    """Reads ``<path>/config.json`` into a ModelConfig (``overrides`` as in ``config_from_hf``)."""
    path = _check_dir(path)
    return config_from_hf(read_json(path / CONFIG_FILE), source=path / CONFIG_FILE, **overrides)


# ---------------------------------------------------------------------------------------------
# Name and layout mapping


@dataclasses.dataclass(frozen=True)
class TensorMap:
    """How one of our parameters is stored in a Hugging Face checkpoint.

    The HF tensor is viewed with each of its dims split into ``groups`` (e.g. q_proj.weight
    [N*H, D] -> view [N, H, D] with groups ((N, H), (D,))); our parameter is
    ``view.transpose(perm)``.
    """

    hf_name: str
    groups: tuple[tuple[int, ...], ...]
    perm: tuple[int, ...]

    @property
    def hf_shape(self) -> tuple[int, ...]:
        return tuple(math.prod(g) for g in self.groups)

    @property
    def view_shape(self) -> tuple[int, ...]:
        return tuple(n for g in self.groups for n in g)

    @property
    def our_shape(self) -> tuple[int, ...]:
        view = self.view_shape
        return tuple(view[p] for p in self.perm)

    def to_hf(self, ours: np.ndarray) -> np.ndarray:
        """Our full array -> the HF tensor."""
        return np.ascontiguousarray(ours.transpose(np.argsort(self.perm))).reshape(self.hf_shape)

    def _plan(self, index: tuple[slice, ...]):
        """The HF index a part of our parameter reads, the read's view and the in-memory slice.

        A leading view dim of each group maps to a contiguous HF range; inner dims of a group
        are sliced after the read.
        """
        ours_shape = self.our_shape
        index = tuple(index) + (slice(None),) * (len(ours_shape) - len(index))
        view_ranges: list[tuple[int, int]] = [(0, 0)] * len(ours_shape)
        for i, p in enumerate(self.perm):
            start, stop, step = index[i].indices(ours_shape[i])
            assert step == 1, "shards are contiguous"
            view_ranges[p] = (start, stop)
        hf_index, inner, local_view = [], [], []
        v = 0
        for group in self.groups:
            rest = math.prod(group[1:])
            start, stop = view_ranges[v]
            hf_index.append(slice(start * rest, stop * rest))
            local_view.extend((stop - start, *group[1:]))
            inner.append(slice(None))
            inner.extend(slice(*view_ranges[v + k]) for k in range(1, len(group)))
            v += len(group)
        return tuple(hf_index), tuple(local_view), tuple(inner)

    def hf_index(self, index: tuple[slice, ...]) -> tuple[slice, ...]:
        """The part of the HF tensor that ``read(..., index)`` reads from the file."""
        return self._plan(index)[0]

    def read(self, hf_slice: Any, index: tuple[slice, ...]) -> np.ndarray:
        """Reads the part of our parameter at ``index`` from a safetensors slice handle.

        Only the HF rows (and columns) the part needs are read (``hf_index``).
        """
        hf_index, local_view, inner = self._plan(index)
        data = np.asarray(hf_slice[hf_index])
        return data.reshape(local_view)[inner].transpose(self.perm)


def tensor_maps(cfg: ModelConfig, *, prefix: tuple = ()) -> dict[tuple, TensorMap]:
    """Our parameter paths (as in ``nnx.to_flat_state``) -> their HF tensors.

    Layer parameters are keyed as an unrolled model's, ``(..., "layers", i, ...)``; a scanned
    model's stacked parameter ``(..., "layers", ...)`` is their L tensors stacked (see
    ``_layer_maps``).

    Args:
      cfg: the model config.
      prefix: the trunk's path prefix is ``prefix + ("trunk",)``; the LM head is at ``prefix``.
    """
    tm = TensorMap
    d, f, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    n, k, h = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    t = (*prefix, "trunk")
    maps = {
        (*t, "embed_vd"): TensorMap("model.embed_tokens.weight", ((v,), (d,)), (0, 1)),
        (*t, "final_norm", "weight"): TensorMap("model.norm.weight", ((d,),), (0,)),
    }
    for i in range(cfg.num_layers):
        hf, ours = f"model.layers.{i}.", (*t, "layers", i)
        attn, att = f"{hf}self_attn.", (*ours, "attn")
        maps.update(
            {
                (*ours, "input_norm", "weight"): TensorMap(
                    f"{hf}input_layernorm.weight", ((d,),), (0,)
                ),
                (*ours, "post_attn_norm", "weight"): TensorMap(
                    f"{hf}post_attention_layernorm.weight", ((d,),), (0,)
                ),
                # nn.Linear stores [out, in]; ours is [in, heads, head_dim].
                (*att, "q_weight_dnh"): TensorMap(
                    f"{attn}q_proj.weight", ((n, h), (d,)), (2, 0, 1)
                ),
                (*att, "k_weight_dkh"): TensorMap(
                    f"{attn}k_proj.weight", ((k, h), (d,)), (2, 0, 1)
                ),
                (*att, "v_weight_dkh"): TensorMap(
                    f"{attn}v_proj.weight", ((k, h), (d,)), (2, 0, 1)
                ),
                (*att, "q_bias_nh"): tm(f"{attn}q_proj.bias", ((n, h),), (0, 1)),
                (*att, "k_bias_kh"): tm(f"{attn}k_proj.bias", ((k, h),), (0, 1)),
                (*att, "v_bias_kh"): tm(f"{attn}v_proj.bias", ((k, h),), (0, 1)),
                (*att, "o_weight_nhd"): TensorMap(
                    f"{attn}o_proj.weight", ((d,), (n, h)), (1, 2, 0)
                ),
                (*ours, "mlp", "gate_weight_df"): TensorMap(
                    f"{hf}mlp.gate_proj.weight", ((f,), (d,)), (1, 0)
                ),
                (*ours, "mlp", "up_weight_df"): TensorMap(
                    f"{hf}mlp.up_proj.weight", ((f,), (d,)), (1, 0)
                ),
                (*ours, "mlp", "down_weight_fd"): TensorMap(
                    f"{hf}mlp.down_proj.weight", ((d,), (f,)), (1, 0)
                ),
            }
        )
    if not cfg.tie_word_embeddings:
        maps[(*prefix, "lm_head_dv")] = TensorMap("lm_head.weight", ((v,), (d,)), (1, 0))
    return maps


# ---------------------------------------------------------------------------------------------
# Loading


def _tensor_files(path: pathlib.Path) -> dict[str, pathlib.Path]:
    """Tensor name -> the safetensors file that holds it (single file or sharded index)."""
    index = path / INDEX_FILE
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index}: field 'weight_map' must be a non-empty object")
        files = {}
        for name, file in weight_map.items():
            shard = path / str(file)
            if not shard.is_file():
                raise CheckpointError(
                    f"{index}: weight_map[{name!r}] names {file!r}, which is not in {path}"
                )
            files[name] = shard
        return files
    single = path / SINGLE_FILE
    if single.is_file():
        with _open(single) as f:
            return dict.fromkeys(f.keys(), single)
    others = sorted(p.name for p in path.iterdir())
    raise FileNotFoundError(
        f"no {SINGLE_FILE} or {INDEX_FILE} in {path} (found: {others[:10]}); only safetensors "
        "checkpoints are supported"
    )


def _open(file: pathlib.Path):
    try:
        return safe_open(str(file), framework="numpy")
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{file} is not a readable safetensors file: {e}") from e


class _Reader:
    """Lazily opened safetensors files of one checkpoint; closes them all on exit."""

    def __init__(self, files: dict[str, pathlib.Path]):
        self.files = files
        self.handles: dict[pathlib.Path, Any] = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for handle in self.handles.values():
            handle.__exit__(None, None, None)
        self.handles.clear()

    def slice(self, name: str, expected_shape: Sequence[int], what: str):
        if name not in self.files:
            sources = sorted({p.name for p in self.files.values()})
            raise CheckpointError(f"tensor {name!r} ({what}) is missing from {sources}")
        file = self.files[name]
        if file not in self.handles:
            self.handles[file] = _open(file).__enter__()
        try:
            part = self.handles[file].get_slice(name)
        except SafetensorError as e:
            raise CheckpointError(f"{file}: cannot read tensor {name!r}: {e}") from e
        shape = tuple(part.get_shape())
        if shape != tuple(expected_shape):
            raise CheckpointError(
                f"{file}: tensor {name!r} has shape {shape}, but config.json implies "
                f"{tuple(expected_shape)} ({what})"
            )
        return part


def _describe(path: tuple) -> str:
    return ".".join(str(p) for p in path)


def _layer_maps(
    maps: dict[tuple, TensorMap], path: tuple, num_layers: int
) -> list[TensorMap] | None:
    """The TensorMaps of a parameter: one, or a stacked layer parameter's L (None: not in
    the checkpoint, as the value head)."""
    k = stacked_layer_index(path)
    if k is None:
        return [maps[path]] if path in maps else None
    return [maps[(*path[: k + 1], i, *path[k + 1 :])] for i in range(num_layers)]


def _union_length(spans: list[tuple[int, int]]) -> int:
    total, reach = 0, 0
    for a, b in sorted(spans):
        total += max(b - max(a, reach), 0)
        reach = max(reach, b)
    return total


def _most_read_by_a_process(
    sharding: jax.sharding.Sharding,
    shape: Sequence[int],
    hf_index_of: Callable[[tuple[slice, ...]], tuple[slice, ...]],
    hf_shape: Sequence[int],
    process_of: Callable[[Any], int],
) -> int:
    """The most elements of an HF tensor (row-major, ``hf_shape``) that one process reads.

    Each device of ``sharding`` (over an array of ``shape``) reads ``hf_index_of(its index)``;
    a read costs its span in the file, first to last element (what a range request or the page
    cache fetches: a column block of every row spans the whole tensor), and a process reads the
    union of its devices' spans.
    """
    strides = [math.prod(hf_shape[i + 1 :]) for i in range(len(hf_shape))]
    spans: dict[int, list[tuple[int, int]]] = {}
    for device, index in sharding.devices_indices_map(tuple(shape)).items():
        ranges = [s.indices(n)[:2] for s, n in zip(hf_index_of(index), hf_shape, strict=True)]
        if any(a >= b for a, b in ranges):
            continue
        first = sum(a * st for (a, _), st in zip(ranges, strides, strict=True))
        last = sum((b - 1) * st for (_, b), st in zip(ranges, strides, strict=True))
        spans.setdefault(process_of(device), []).append((first, last + 1))
    return max((_union_length(s) for s in spans.values()), default=0)


def _row_sharding(mesh: Mesh, rows: int, ndim: int, row_dim: int) -> NamedSharding | None:
    """Splits an HF-layout array's row dim over as many mesh axes as divide it (None: none do),
    so each device reads one contiguous row block of the file."""
    axes, count = [], 1
    for name in mesh.axis_names:
        size = mesh.shape[name]
        if size > 1 and rows % (count * size) == 0:
            axes.append(name)
            count *= size
    if count == 1:
        return None
    spec = [None] * ndim
    spec[row_dim] = tuple(axes)
    return NamedSharding(mesh, PartitionSpec(*spec))


@functools.lru_cache(maxsize=64)
def _relayout(view_shape: tuple[int, ...], perm: tuple[int, ...], target: NamedSharding):
    """HF layout -> ours (``TensorMap``'s view and transpose), on the devices, into ``target``."""
    return jax.jit(lambda x: x.reshape(view_shape).transpose(perm), out_shardings=target)


def _load_param(tmaps, parts, spec, sharding, stacked: bool, process_of) -> jax.Array:
    """One parameter (a stacked layer parameter: its L tensors), read into ``sharding``.

    Each device reads its own slice (``TensorMap.read``) unless that makes some process read
    more of the file than a row split would: with the hidden dim sharded, a device's slice of
    q/k/v/gate/up/lm_head is a column block of every row of the HF [out, in] tensor, so each
    host would read the whole file. Then the HF-layout tensor is read as contiguous row blocks
    spread over the devices and laid out as ours on the devices (one all-to-all per tensor).
    """
    dtype = np.dtype(spec.dtype)
    tmap = tmaps[0]
    lead = (len(tmaps),) if stacked else ()

    def per_device(read_one):
        def read(index):
            if not stacked:
                return read_one(0, index).astype(dtype)
            # A stacked layer parameter: this device's layers, each read as its own.
            layers = range(*index[0].indices(len(tmaps)))
            return np.stack([read_one(i, index[1:]).astype(dtype) for i in layers])

        return read

    rows = (
        _row_sharding(sharding.mesh, tmap.hf_shape[0], len(lead) + len(tmap.hf_shape), len(lead))
        if isinstance(sharding, NamedSharding) and len(tmap.hf_shape) > 1
        else None
    )
    if rows is not None:
        hf_shape = (*lead, *tmap.hf_shape)
        direct = _most_read_by_a_process(
            sharding, spec.shape, lambda i: tmap.hf_index(i[len(lead) :]), tmap.hf_shape, process_of
        )
        split = _most_read_by_a_process(
            rows, hf_shape, lambda i: i[len(lead) :], tmap.hf_shape, process_of
        )
        if split < direct:
            hf_rows = per_device(lambda i, index: np.asarray(parts[i][index]))
            loaded = jax.make_array_from_callback(hf_shape, rows, hf_rows)
            view = (*lead, *tmap.view_shape)
            perm = (*range(len(lead)), *(p + len(lead) for p in tmap.perm))
            value = _relayout(view, perm, sharding)(loaded)
            loaded.delete()
            return value
    ours = per_device(lambda i, index: tmaps[i].read(parts[i], index))
    return jax.make_array_from_callback(spec.shape, sharding, ours)


def _load_into(
    model_ctor,
    cfg: ModelConfig,
    ckpt: pathlib.Path,
    mesh: Mesh | None,
    prefix=(),
    process_of: Callable[[Any], int] | None = None,
):
    abstract = nnx.eval_shape(model_ctor)
    graphdef, state = nnx.split(abstract)
    if mesh is not None:
        shardings = nnx.to_flat_state(sharding_lib.state_shardings(state, mesh))
        shardings = dict(zip(shardings.paths, shardings.leaves, strict=True))
    process_of = process_of or (lambda d: d.process_index)
    maps = tensor_maps(cfg, prefix=prefix)
    files = _tensor_files(ckpt)
    used = set()
    with _Reader(files) as reader:
        for path, var in nnx.to_flat_state(state):
            spec = var.get_value()
            sharding = (
                shardings[path] if mesh is not None else SingleDeviceSharding(jax.devices()[0])
            )
            tmaps = _layer_maps(maps, path, cfg.num_layers)
            if tmaps is None:
                # Not in a causal-LM checkpoint (the value head): starts at zero.
                value = jax.device_put(np.zeros(spec.shape, spec.dtype), sharding)
            else:
                stacked = stacked_layer_index(path) is not None
                shape = spec.shape[1:] if stacked else spec.shape
                parts = []
                for tmap in tmaps:
                    assert tmap.our_shape == shape, (path, tmap.our_shape, spec.shape)
                    what = f"param {_describe(path)}"
                    parts.append(reader.slice(tmap.hf_name, tmap.hf_shape, what))
                    used.add(tmap.hf_name)
                value = _load_param(tmaps, parts, spec, sharding, stacked, process_of)
            var.set_value(value)
    unused = sorted(set(files) - used - {"lm_head.weight"})
    if unused:
        _log.warning("%s: %d tensors not used by the model, e.g. %s", ckpt, len(unused), unused[:5])
    return nnx.merge(graphdef, state)


def load_hf_model(
    path: str | pathlib.Path,
    *,
    mesh: Mesh | None = None,
    process_of: Callable[[Any], int] | None = None,
    **overrides,
) -> CausalLM:
    """A CausalLM with the weights of a local Hugging Face checkpoint directory.

    Args:
      path: directory with config.json and model.safetensors (or model.safetensors.index.json
        plus its shards).
      mesh: place each parameter as ``agentrl_jax.sharding`` says. Each host reads about its
        share of each sharded tensor, as contiguous rows of the file: a device reads its own
        slice where that is a row block, else (the hidden dim sharded across hosts: q/k/v/
        gate/up/lm_head's slices are column blocks of the HF [out, in] tensor) the devices read
        row blocks and the tensor is laid out on the devices. Without a mesh, everything goes
        to the first device.
      process_of: the process of a device, which decides what a host reads (default: its
        ``process_index``; a test can map the fake devices of one process to pretended hosts).
      **overrides: ModelConfig fields, e.g. ``dtype=jnp.bfloat16, param_dtype=jnp.bfloat16``
        (weights are cast on the host), ``remat="full"`` or ``scan_layers=True`` (the per-layer
        tensors are stacked on a leading layer axis), ``lora=LoraConfig(...)`` (fresh adapters
        on the loaded base: ``lora.apply_lora``; ``peft.load_peft_adapter`` reads trained ones).

    Raises:
      FileNotFoundError: the directory, config.json or the safetensors files are missing.
      CheckpointError: config.json is invalid or unsupported, a file is corrupt, a tensor is
        missing or has the wrong shape (the message names file, tensor and shapes).
    """
    path = _check_dir(path)
    lora = overrides.pop("lora", None)
    cfg = load_config(path, **overrides)
    model = _load_into(
        lambda: CausalLM(cfg, rngs=nnx.Rngs(0)), cfg, path, mesh, process_of=process_of
    )
    return lora_lib.apply_lora(model, lora)


def load_hf_value_model(
    path: str | pathlib.Path,
    *,
    mesh: Mesh | None = None,
    process_of: Callable[[Any], int] | None = None,
    **overrides,
) -> ValueModel:
    """A ValueModel whose trunk comes from a causal-LM checkpoint, with a zero value head
    (arguments as ``load_hf_model``'s)."""
    path = _check_dir(path)
    lora = overrides.pop("lora", None)
    cfg = load_config(path, **overrides)
    model = _load_into(
        lambda: ValueModel(cfg, rngs=nnx.Rngs(0)), cfg, path, mesh, process_of=process_of
    )
    return lora_lib.apply_lora(model, lora)


# ---------------------------------------------------------------------------------------------
# Saving


def _to_host(x: jax.Array) -> np.ndarray:
    if x.is_fully_addressable:
        return np.asarray(jax.device_get(x))
    from jax.experimental import multihost_utils  # noqa: PLC0415 (multi-host only)

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def _dtype_name(dtype) -> str:
    return {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}[
        np.dtype(dtype).name
    ]


def _value_at(flat: dict[tuple, Any], path: tuple) -> jax.Array:
    """The array at a ``tensor_maps`` path: the parameter itself, or layer i of a scanned model's
    stacked parameter (sliced on the device, so one layer at a time comes to the host)."""
    if path in flat:
        return flat[path].get_value()
    k = path.index("layers")
    return flat[(*path[: k + 1], *path[k + 2 :])].get_value()[path[k + 1]]


def save_hf_checkpoint(
    model: CausalLM,
    out_dir: str | pathlib.Path,
    *,
    dtype=None,
    max_shard_bytes: int = 4 * 2**30,
    tokenizer: Any = None,
    eos_token_id: int | None = None,
) -> pathlib.Path:
    """Writes ``model`` as a Hugging Face checkpoint of its family.

    Tensors are gathered to the host one at a time (all processes take part; process 0 writes),
    so host memory holds at most one output file's worth.

    Args:
      model: the policy (sharded or not). A LoRA policy is merged first (``lora.merge``: each
        adapted weight W + A B alpha / rank, summed in f32; one more copy of the base on the
        devices while it is written), so the files are a plain Qwen2 checkpoint.
      out_dir: created if needed; existing files of the same names are overwritten.
      dtype: storage dtype (default: the model's param_dtype), e.g. ``jnp.bfloat16``.
      max_shard_bytes: above this, tensors are split into ``model-0000i-of-0000n.safetensors``
        with a ``model.safetensors.index.json``.
      tokenizer: optional; its ``save_pretrained(out_dir)`` is called, for serving.
      eos_token_id: the token that ends a generation (a run's chat template's stop token, where
        its rollouts stop), written as ``eos_token_id`` in config.json and in
        ``generation_config.json``, which transformers' ``generate`` and vLLM read as their
        default stop. None writes neither (and removes a stale generation_config.json).

    Returns:
      The output directory.
    """
    dtype = np.dtype(model.cfg.param_dtype if dtype is None else dtype)
    if model.cfg.lora is not None:
        model = lora_lib.merge(model, jnp.float32)  # cast to ``dtype`` once, when written
    cfg = model.cfg
    out_dir = pathlib.Path(out_dir)
    writer = jax.process_index() == 0
    flat = dict(nnx.to_flat_state(nnx.state(model)))
    maps = list(tensor_maps(cfg).items())

    # Plan the files from shapes alone, then gather and write one file at a time.
    plan: list[list[tuple[tuple, TensorMap]]] = [[]]
    size = 0
    for path, tmap in maps:
        nbytes = math.prod(tmap.hf_shape) * dtype.itemsize
        if plan[-1] and size + nbytes > max_shard_bytes:
            plan.append([])
            size = 0
        plan[-1].append((path, tmap))
        size += nbytes
    names = (
        [SINGLE_FILE]
        if len(plan) == 1
        else [f"model-{i + 1:05d}-of-{len(plan):05d}.safetensors" for i in range(len(plan))]
    )
    if writer:
        out_dir.mkdir(parents=True, exist_ok=True)
        hf_config = config_to_hf(cfg, torch_dtype=_dtype_name(dtype), eos_token_id=eos_token_id)
        (out_dir / CONFIG_FILE).write_text(json.dumps(hf_config, indent=2) + "\n")
        generation = out_dir / GENERATION_CONFIG_FILE
        if eos_token_id is None:
            generation.unlink(missing_ok=True)
        else:
            generation.write_text(json.dumps({"eos_token_id": int(eos_token_id)}, indent=2) + "\n")
    weight_map, total = {}, 0
    for name, entries in zip(names, plan, strict=True):
        tensors = {}
        for path, tmap in entries:
            tensors[tmap.hf_name] = tmap.to_hf(_to_host(_value_at(flat, path))).astype(dtype)
        weight_map.update(dict.fromkeys(tensors, name))
        total += sum(t.nbytes for t in tensors.values())
        if writer:
            # transformers refuses safetensors files without the "format" metadata.
            save_file(tensors, str(out_dir / name), metadata={"format": "pt"})
    if not writer:
        return out_dir
    if len(plan) == 1:
        (out_dir / INDEX_FILE).unlink(missing_ok=True)
    else:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out_dir / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
        (out_dir / SINGLE_FILE).unlink(missing_ok=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(out_dir))
    return out_dir


__all__ = [
    "CheckpointError",
    "TensorMap",
    "config_from_hf",
    "config_to_hf",
    "load_config",
    "load_hf_model",
    "load_hf_value_model",
    "save_hf_checkpoint",
    "tensor_maps",
]
