"""Load and save Hugging Face checkpoints of every registered family (config.json + safetensors).

The checkpoint's ``model_type`` picks its family (``models/registry.py``), which maps its
config.json and tensor names onto the decoder.

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

import functools
import itertools
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
from agentrl_jax.models import registry
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.decoder import CausalLM, ValueModel
from agentrl_jax.models.family import CheckpointError, TensorMap
from agentrl_jax.models.params import stacked_layer_index

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# transformers' ``generate`` defaults (here: where it stops), read beside config.json.
GENERATION_CONFIG_FILE = "generation_config.json"

_log = logging.getLogger(__name__)


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


def config_from_hf(
    hf: dict[str, Any], *, source: pathlib.Path | str = CONFIG_FILE, **overrides
) -> ModelConfig:
    """A ModelConfig from a Hugging Face ``config.json`` dict, by its family's mapping
    (``registry.for_hf``: the ``model_type``).

    Args:
      hf: the parsed config.json.
      source: where it came from, for error messages.
      **overrides: ModelConfig fields to set (e.g. ``dtype``, ``param_dtype``, ``remat``,
        ``scan_layers``).

    Raises:
      CheckpointError: for an unsupported model_type / architecture / attention variant, or a
        missing or invalid field, naming the file, field and value.
    """
    family = registry.for_hf(hf, source)
    fields = {**family.config_from_hf(hf, source), "family": family.model_type}
    fields.update(overrides)
    return ModelConfig(**fields)


def config_to_hf(
    cfg: ModelConfig, *, torch_dtype: str = "float32", eos_token_id: int | None = None
) -> dict[str, Any]:
    """The config.json dict transformers (and vLLM) need to rebuild ``cfg`` as its family's
    causal LM; with ``eos_token_id``, the token that ends a generation."""
    family = registry.family(cfg)
    eos = {} if eos_token_id is None else {"eos_token_id": int(eos_token_id)}
    return {
        "architectures": [family.architectures[0]],
        "model_type": family.model_type,
        **family.config_to_hf(cfg),
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


def tensor_maps(cfg: ModelConfig, *, prefix: tuple = ()) -> dict[tuple, TensorMap]:
    """Our parameter paths (as in ``nnx.to_flat_state``) -> their HF tensors, by ``cfg``'s
    family (``Family.tensor_maps``).

    Layer parameters are keyed as an unrolled model's, ``(..., "layers", i, ...)``; a scanned
    model's stacked parameter ``(..., "layers", ...)`` is their L tensors stacked (see
    ``_layer_maps``).

    Args:
      cfg: the model config.
      prefix: the trunk's path prefix is ``prefix + ("trunk",)``; the LM head is at ``prefix``.
    """
    return registry.family(cfg).tensor_maps(cfg, prefix=prefix)


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
) -> tuple[list[TensorMap] | None, tuple[int, ...]]:
    """The TensorMaps of a parameter, row-major over the leading dims they are stacked on, and
    those dims: one map and (); a stacked layer parameter's L and (L,); a parameter stored one
    tensor per expert (its maps keyed ``(*path, j)``) E and (E,), or L * E and (L, E) when
    scanned. (None, ()) when it is not in the checkpoint (the value head)."""
    k = stacked_layer_index(path)
    paths = (
        [path] if k is None else [(*path[: k + 1], i, *path[k + 1 :]) for i in range(num_layers)]
    )
    lead = () if k is None else (num_layers,)
    if paths[0] in maps:
        return [maps[p] for p in paths], lead
    if (*paths[0], 0) not in maps:
        return None, ()
    experts = 0
    while (*paths[0], experts) in maps:
        experts += 1
    return [maps[(*p, j)] for p in paths for j in range(experts)], (*lead, experts)


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


def _load_param(tmaps, parts, spec, sharding, lead: tuple[int, ...], process_of) -> jax.Array:
    """One parameter (stacked on ``lead``: its layers' and / or experts' tensors, row-major in
    ``tmaps`` and ``parts``), read into ``sharding``.

    Each device reads its own slice (``TensorMap.read``) unless that makes some process read
    more of the file than a row split would: with the hidden dim sharded, a device's slice of
    q/k/v/gate/up/lm_head is a column block of every row of the HF [out, in] tensor, so each
    host would read the whole file. Then the HF-layout tensor is read as contiguous row blocks
    spread over the devices and laid out as ours on the devices (one all-to-all per tensor).
    """
    dtype = np.dtype(spec.dtype)
    tmap = tmaps[0]

    def per_device(read_one):
        def read(index):
            if not lead:
                return read_one(0, index).astype(dtype)
            # A stacked parameter: this device's layers (and experts), each read as its own.
            ranges = [range(*index[d].indices(n)) for d, n in enumerate(lead)]
            rest = index[len(lead) :]
            tiles = [
                read_one(int(np.ravel_multi_index(ix, lead)), rest).astype(dtype)
                for ix in itertools.product(*ranges)
            ]
            return np.stack(tiles).reshape(*(len(r) for r in ranges), *tiles[0].shape)

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
            tmaps, lead = _layer_maps(maps, path, cfg.num_layers)
            if tmaps is None:
                # Not in a causal-LM checkpoint (the value head): starts at zero.
                value = jax.device_put(np.zeros(spec.shape, spec.dtype), sharding)
            else:
                shape = spec.shape[len(lead) :]
                parts = []
                for tmap in tmaps:
                    assert tmap.our_shape == shape, (path, tmap.our_shape, spec.shape)
                    what = f"param {_describe(path)}"
                    parts.append(reader.slice(tmap.hf_name, tmap.hf_shape, what))
                    used.add(tmap.hf_name)
                value = _load_param(tmaps, parts, spec, sharding, lead, process_of)
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
    """The policy (its family's, a ``CausalLM``) with the weights of a local Hugging Face
    checkpoint directory.

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
    policy = registry.family(cfg).policy
    model = _load_into(
        lambda: policy(cfg, rngs=nnx.Rngs(0)), cfg, path, mesh, process_of=process_of
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
    critic = registry.family(cfg).critic
    model = _load_into(
        lambda: critic(cfg, rngs=nnx.Rngs(0)), cfg, path, mesh, process_of=process_of
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
    """The array at a ``tensor_maps`` path: the parameter itself, layer i of a scanned model's
    stacked parameter, or expert j of an experts' parameter (``(*path, j)``); sliced on the
    device, so one tensor at a time comes to the host."""
    if path in flat:
        return flat[path].get_value()
    if isinstance(path[-1], int):
        return _value_at(flat, path[:-1])[path[-1]]
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
    """Writes ``model`` as a Hugging Face checkpoint of its family (``cfg.family``).

    Tensors are gathered to the host one at a time (all processes take part; process 0 writes),
    so host memory holds at most one output file's worth.

    Args:
      model: the policy (sharded or not). A LoRA policy is merged first (``lora.merge``: each
        adapted weight W + A B alpha / rank, summed in f32; one more copy of the base on the
        devices while it is written), so the files are a plain checkpoint of its family.
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
