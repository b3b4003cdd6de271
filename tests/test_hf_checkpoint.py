"""Hugging Face checkpoints: parity with transformers both ways, sharded loading, bad input."""

import json
import math
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

pytest.importorskip("torch")

from agentrl_jax import sharding  # noqa: E402
from agentrl_jax.models import hf_checkpoint as hc  # noqa: E402
from agentrl_jax.models.testing import TEST_CONFIG, hf_logits, random_hf_checkpoint  # noqa: E402

TOL = 1e-4  # fixed by the issue: f32 max abs diff against transformers


_CKPTS: dict[bool, pathlib.Path] = {}


def _checkpoint(tmp_path_factory, tie: bool) -> pathlib.Path:
    if tie not in _CKPTS:
        cfg = TEST_CONFIG.replace(tie_word_embeddings=tie)
        _CKPTS[tie] = random_hf_checkpoint(tmp_path_factory.mktemp("hf"), cfg, seed=int(tie))
    return _CKPTS[tie]


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def hf_ckpt(request, tmp_path_factory) -> pathlib.Path:
    """A random transformers-made checkpoint, tied and untied variants."""
    return _checkpoint(tmp_path_factory, request.param)


@pytest.fixture(scope="module")
def batch():
    """A padded batch: a full row, a left-padded row and a right-padded row."""
    rng = np.random.RandomState(0)
    tokens = rng.randint(0, TEST_CONFIG.vocab_size, (3, 9))
    mask = np.ones((3, 9), np.int64)
    mask[1, :4] = 0
    mask[2, 6:] = 0
    return tokens, mask


@jax.jit
def _forward(model, tokens, mask):
    return model(tokens, mask_bt=mask)[0]


def _max_diff(ours, ref, mask) -> float:
    return float(np.abs(np.asarray(ours) - ref)[mask.astype(bool)].max())


def test_loaded_checkpoint_matches_transformers(hf_ckpt, batch):
    tokens, mask = batch
    model = hc.load_hf_model(hf_ckpt)
    assert (
        model.cfg.tie_word_embeddings
        == json.loads((hf_ckpt / "config.json").read_text())["tie_word_embeddings"]
    )
    ref = hf_logits(hf_ckpt, tokens, mask)
    assert np.abs(ref).max() > 1.0  # random weights large enough to make the check meaningful
    assert _max_diff(_forward(model, tokens, mask), ref, mask) <= TOL


def test_saved_checkpoint_loads_in_transformers(hf_ckpt, batch, tmp_path):
    tokens, mask = batch
    model = hc.load_hf_model(hf_ckpt)
    # Move the weights so the check cannot pass by copying the input files.
    state = nnx.state(model, nnx.Param)
    nnx.update(model, jax.tree.map(lambda x: x * 1.5, state))
    out = hc.save_hf_checkpoint(model, tmp_path / "saved")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    ours = _forward(model, tokens, mask)
    assert _max_diff(ours, hf_logits(out, tokens, mask), mask) <= TOL
    # And our loader reads it back exactly.
    again = hc.load_hf_model(out)
    for a, b in zip(
        jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(again)), strict=True
    ):
        np.testing.assert_array_equal(a, b)


def test_saved_eos_is_where_generate_stops(hf_ckpt, tmp_path):
    """``eos_token_id``: written to config.json and generation_config.json, so transformers'
    ``generate`` stops there with no argument; without it neither file names one (a stale
    generation_config.json is removed)."""
    import torch
    import transformers

    model = hc.load_hf_model(hf_ckpt)
    prompt = torch.tensor([[5, 9, 11]])
    out = hc.save_hf_checkpoint(model, tmp_path / "saved")
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    free = hf_model.generate(prompt, max_new_tokens=8, do_sample=False)[0, 3:].tolist()
    assert len(free) == 8 and hf_model.generation_config.eos_token_id is None
    stop = free[2]  # greedy text's third token: generate must stop on its first occurrence
    hc.save_hf_checkpoint(model, out, eos_token_id=stop)
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == stop
    assert transformers.GenerationConfig.from_pretrained(out).eos_token_id == stop
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    got = hf_model.generate(prompt, max_new_tokens=8, do_sample=False)[0, 3:].tolist()
    assert got == free[: free.index(stop) + 1]
    hc.save_hf_checkpoint(model, out)
    assert "eos_token_id" not in json.loads((out / "config.json").read_text())
    assert not (out / hc.GENERATION_CONFIG_FILE).exists()


def test_sharded_index_round_trip(hf_ckpt, batch, tmp_path):
    tokens, mask = batch
    model = hc.load_hf_model(hf_ckpt)
    out = hc.save_hf_checkpoint(model, tmp_path / "sharded", max_shard_bytes=40_000)
    index = json.loads((out / hc.INDEX_FILE).read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and not (out / hc.SINGLE_FILE).exists()
    assert all((out / f).is_file() for f in files)
    ref = hf_logits(out, tokens, mask)  # transformers reads the index too
    again = hc.load_hf_model(out)
    assert _max_diff(_forward(again, tokens, mask), ref, mask) <= TOL


@pytest.mark.parametrize("mesh_shape", [(2, 2, 2), (1, 4, 2)])
def test_load_onto_mesh_places_shards(hf_ckpt, batch, mesh_shape, monkeypatch, tmp_path):
    tokens, mask = batch
    mesh = sharding.make_mesh(mesh_shape)
    reads = []
    original_read = hc.TensorMap.read

    def recording_read(self, hf_slice, index):
        out = original_read(self, hf_slice, index)
        reads.append((self.hf_name, out.shape))
        return out

    monkeypatch.setattr(hc.TensorMap, "read", recording_read)
    model = hc.load_hf_model(hf_ckpt, mesh=mesh)
    monkeypatch.undo()
    # The host only ever reads one device's slice of a sharded tensor, never the full tensor.
    full = {tm.hf_name: tm.our_shape for tm in hc.tensor_maps(model.cfg).values()}
    q_name = "model.layers.0.self_attn.q_proj.weight"
    assert {shape for name, shape in reads if name == q_name} == {
        (full[q_name][0] // mesh.shape["fsdp"], full[q_name][1] // mesh.shape["tp"], 16)
    }
    assert all(shape == full[name] for name, shape in reads if "norm" in name)
    plain = hc.load_hf_model(hf_ckpt)
    fsdp, tp = mesh.shape["fsdp"], mesh.shape["tp"]
    d, n, h = TEST_CONFIG.hidden_size, TEST_CONFIG.num_heads, TEST_CONFIG.head_dim
    q = model.trunk.layers[1].attn.q_weight_dnh[...]
    assert q.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tp", None)
    assert {s.data.shape for s in q.addressable_shards} == {(d // fsdp, n // tp, h)}
    emb = model.trunk.embed_vd[...]
    assert emb.sharding.spec == jax.sharding.PartitionSpec("tp", "fsdp")
    assert {s.data.shape for s in emb.addressable_shards} == {
        (TEST_CONFIG.vocab_size // tp, d // fsdp)
    }
    down = model.trunk.layers[0].mlp.down_weight_fd[...]
    assert {s.data.shape for s in down.addressable_shards} == {
        (TEST_CONFIG.intermediate_size // tp, d // fsdp)
    }
    # Every shard holds exactly the matching slice of the full tensor.
    flat_sharded = nnx.to_flat_state(nnx.state(model))
    flat_plain = dict(nnx.to_flat_state(nnx.state(plain)))
    for path, var in flat_sharded:
        full = np.asarray(flat_plain[path].get_value())
        for shard in var.get_value().addressable_shards:
            np.testing.assert_array_equal(shard.data, full[shard.index], err_msg=str(path))
    ref = hf_logits(hf_ckpt, tokens, mask)
    assert _max_diff(_forward(model, tokens, mask), ref, mask) <= TOL
    # Saving a sharded model gathers each tensor: the files equal the original checkpoint's.
    from safetensors.numpy import load_file

    out = hc.save_hf_checkpoint(model, tmp_path / "from_mesh")
    saved, original = load_file(out / hc.SINGLE_FILE), load_file(hf_ckpt / hc.SINGLE_FILE)
    if model.cfg.tie_word_embeddings:
        original.pop("lm_head.weight", None)  # tied: the head is the embedding
    assert saved.keys() == original.keys()
    for name, tensor in original.items():
        np.testing.assert_array_equal(saved[name], tensor, err_msg=name)


def test_load_casts_to_bf16(hf_ckpt):
    model = hc.load_hf_model(hf_ckpt, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
    plain = hc.load_hf_model(hf_ckpt)
    a, b = model.trunk.layers[0].mlp.up_weight_df[...], plain.trunk.layers[0].mlp.up_weight_df[...]
    assert a.dtype == jnp.bfloat16
    np.testing.assert_array_equal(a, b.astype(jnp.bfloat16))


def test_value_model_from_checkpoint(hf_ckpt, batch):
    tokens, mask = batch
    value = hc.load_hf_value_model(hf_ckpt, mesh=sharding.make_mesh((2, 2, 2)))
    policy = hc.load_hf_model(hf_ckpt)
    for a, b in zip(
        jax.tree.leaves(nnx.state(policy.trunk)),
        jax.tree.leaves(nnx.state(value.trunk)),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)
    values = jax.jit(lambda m, t, k: m(t, mask_bt=k))(value, tokens, mask)
    np.testing.assert_array_equal(values, 0.0)


def test_config_round_trip_and_legacy_fields():
    cfg = TEST_CONFIG.replace(rope_theta=1e6, tie_word_embeddings=False)
    assert hc.config_from_hf(hc.config_to_hf(cfg)) == cfg
    legacy = hc.config_to_hf(cfg)
    del legacy["rope_parameters"], legacy["head_dim"], legacy["num_key_value_heads"]
    legacy["rope_scaling"] = None  # as in Qwen2.5 checkpoints' config.json
    got = hc.config_from_hf(legacy)
    assert got.rope_theta == 1e6 and got.head_dim == 16 and got.num_kv_heads == cfg.num_heads


# --- Bad input -------------------------------------------------------------------------------


@pytest.fixture
def ckpt_copy(tmp_path, tmp_path_factory) -> pathlib.Path:
    """A scratch copy of the tied checkpoint to damage."""
    return pathlib.Path(shutil.copytree(_checkpoint(tmp_path_factory, True), tmp_path / "ckpt"))


def _edit_config(ckpt: pathlib.Path, **changes):
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg.update(changes)
    (ckpt / "config.json").write_text(json.dumps(cfg))


def test_missing_directory_and_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="checkpoint directory .*nowhere does not exist"):
        hc.load_hf_model(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=r"config\.json not found"):
        hc.load_hf_model(tmp_path)


def test_corrupt_config(ckpt_copy):
    (ckpt_copy / "config.json").write_text("{not json")
    with pytest.raises(hc.CheckpointError, match=r"config\.json is not valid JSON"):
        hc.load_hf_model(ckpt_copy)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"model_type": "mistral"}, r"model_type='mistral' is not supported"),
        ({"architectures": ["LlamaForCausalLM"]}, r"architectures=\['LlamaForCausalLM'\]"),
        ({"hidden_size": "64"}, r"field 'hidden_size' must be a positive integer, got '64'"),
        ({"num_key_value_heads": 3}, r"num_attention_heads=4 is not a multiple of .*=3"),
        ({"use_sliding_window": True}, r"use_sliding_window=true is not supported"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, r"rope_type='yarn'"),
        ({"hidden_act": "gelu"}, r"hidden_act='gelu' is not supported"),
    ],
)
def test_unsupported_config(ckpt_copy, changes, message):
    _edit_config(ckpt_copy, **changes)
    with pytest.raises(hc.CheckpointError, match=message) as info:
        hc.load_hf_model(ckpt_copy)
    assert "config.json" in str(info.value)


def test_no_safetensors(ckpt_copy):
    (ckpt_copy / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no model.safetensors or model.safetensors.index"):
        hc.load_hf_model(ckpt_copy)


def test_corrupt_safetensors(ckpt_copy):
    (ckpt_copy / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(
        hc.CheckpointError, match=r"model\.safetensors is not a readable safetensors"
    ):
        hc.load_hf_model(ckpt_copy)


def test_wrong_tensor_shape(ckpt_copy):
    _edit_config(ckpt_copy, intermediate_size=192)  # the file's MLP tensors have 96
    pattern = (
        r"model\.safetensors: tensor 'model\.layers\.0\.mlp\.(down|gate|up)_proj\.weight' "
        r"has shape \((96, 64|64, 96)\), but config\.json implies \((192, 64|64, 192)\)"
    )
    with pytest.raises(hc.CheckpointError, match=pattern):
        hc.load_hf_model(ckpt_copy)


def test_missing_tensor(ckpt_copy):
    from safetensors.numpy import load_file, save_file

    tensors = load_file(ckpt_copy / "model.safetensors")
    del tensors["model.layers.1.self_attn.k_proj.bias"]
    save_file(tensors, ckpt_copy / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(hc.CheckpointError, match=r"'model\.layers\.1\.self_attn\.k_proj\.bias'"):
        hc.load_hf_model(ckpt_copy)


def test_index_names_missing_shard(ckpt_copy, tmp_path):
    model = hc.load_hf_model(ckpt_copy)
    out = hc.save_hf_checkpoint(model, tmp_path / "sharded", max_shard_bytes=40_000)
    index = json.loads((out / hc.INDEX_FILE).read_text())
    victim = sorted(set(index["weight_map"].values()))[-1]
    (out / victim).unlink()
    with pytest.raises(hc.CheckpointError, match=f"names '{victim}', which is not in"):
        hc.load_hf_model(out)


# --- What each host reads --------------------------------------------------------------------


def _pretend_two_processes(device):
    """The 8 fake devices as 2 hosts of 4: devices 0-3 on process 0, 4-7 on process 1."""
    return jax.devices().index(device) // 4


class _CountingSlice:
    """A safetensors slice handle that records the file span of every read, by process."""

    def __init__(self, part, name, spans, current):
        self.part, self.name, self.spans, self.current = part, name, spans, current
        self.shape = tuple(part.get_shape())

    def get_shape(self):
        return self.part.get_shape()

    def __getitem__(self, index):
        # The read's span in the file, first to last element it touches (row-major offsets).
        offsets = np.arange(np.prod(self.shape)).reshape(self.shape)[index]
        for process in self.current["processes"]:
            self.spans.setdefault((process, self.name), []).append(
                (int(offsets.min()), int(offsets.max()) + 1)
            )
        return self.part[index]


@pytest.mark.parametrize(("mesh_shape", "scan"), [((1, 4, 2), False), ((2, 4, 1), True)])
def test_each_host_reads_its_share_of_the_sharded_tensors(
    tmp_path_factory, mesh_shape, scan, monkeypatch
):
    # Untied: the LM head is a tensor of its own. (1, 4, 2): fsdp and tp within each host;
    # (2, 4, 1): the parameters replicated across the hosts, which still read half each, here
    # into a scanned model's stacked layer parameters.
    hf_ckpt = _checkpoint(tmp_path_factory, False)
    mesh = sharding.make_mesh(mesh_shape)
    spans: dict[tuple[int, str], list[tuple[int, int]]] = {}
    current = {"processes": ()}
    original_slice, original_make = hc._Reader.slice, jax.make_array_from_callback

    def counting_slice(self, name, expected_shape, what):
        return _CountingSlice(
            original_slice(self, name, expected_shape, what), name, spans, current
        )

    def attributed_make(shape, placement, callback):
        # Which pretended hosts a read is for: those of the devices given that index.
        hosts: dict[str, set[int]] = {}
        for device, index in placement.devices_indices_map(tuple(shape)).items():
            hosts.setdefault(repr(index), set()).add(_pretend_two_processes(device))

        def attributed(index):
            current["processes"] = hosts[repr(index)]
            return callback(index)

        return original_make(shape, placement, attributed)

    monkeypatch.setattr(hc._Reader, "slice", counting_slice)
    monkeypatch.setattr(jax, "make_array_from_callback", attributed_make)
    model = hc.load_hf_model(
        hf_ckpt, mesh=mesh, process_of=_pretend_two_processes, scan_layers=scan
    )
    monkeypatch.undo()

    sizes = {tm.hf_name: math.prod(tm.hf_shape) for tm in hc.tensor_maps(model.cfg).values()}
    projections = [
        n for n in sizes if n.endswith("proj.weight") or n.endswith("embed_tokens.weight")
    ]
    projections += ["lm_head.weight"] if not model.cfg.tie_word_embeddings else []
    assert len(projections) == 7 * model.cfg.num_layers + 2 - model.cfg.tie_word_embeddings
    for name in projections:
        for process in (0, 1):
            read = np.zeros(sizes[name], bool)
            for a, b in spans[(process, name)]:
                read[a:b] = True
            # Each host reads its half of the file's rows, not (as a column block would) all.
            assert read.sum() == sizes[name] // 2, (name, process, mesh_shape)
    # The values are the checkpoint's, wherever they were read, in the rules' shardings.
    plain = dict(nnx.to_flat_state(nnx.state(hc.load_hf_model(hf_ckpt, scan_layers=scan))))
    targets = dict(nnx.to_flat_state(sharding.state_shardings(nnx.state(model), mesh)))
    for path, var in nnx.to_flat_state(nnx.state(model)):
        value = var.get_value()
        assert value.sharding.is_equivalent_to(targets[path], value.ndim), path
        np.testing.assert_array_equal(value, plain[path].get_value(), err_msg=str(path))


# --- bfloat16 checkpoints, as Qwen2.5 ships -------------------------------------------------

BF16_U = 2.0**-8  # bfloat16's unit roundoff (8 significand bits)


def test_bf16_checkpoint_written_by_transformers(tmp_path, batch):
    import ml_dtypes
    import torch
    import transformers
    from safetensors.numpy import load_file

    from agentrl_jax.models.testing import positions_from_mask

    tokens, mask = batch
    cfg = TEST_CONFIG.replace(tie_word_embeddings=False)
    ckpt = random_hf_checkpoint(tmp_path / "bf16", cfg, seed=2, dtype="bfloat16")
    stored = load_file(ckpt / hc.SINGLE_FILE)
    assert {t.dtype for t in stored.values()} == {np.dtype(ml_dtypes.bfloat16)}

    # Loaded as bf16, every parameter is bf16 and holds exactly the file's bits.
    model = hc.load_hf_model(ckpt, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
    flat = dict(nnx.to_flat_state(nnx.state(model)))
    for path, tmap in hc.tensor_maps(model.cfg).items():
        value = flat[path].get_value()
        assert value.dtype == jnp.bfloat16, path
        np.testing.assert_array_equal(
            tmap.to_hf(np.asarray(value)).view(np.uint16),
            stored[tmap.hf_name].view(np.uint16),
            err_msg=tmap.hf_name,
        )

    # f32 of the same bf16 weights: the same parity as a float32 checkpoint's.
    ref = hf_logits(ckpt, tokens, mask)
    assert np.abs(ref).max() > 0.5
    assert _max_diff(_forward(hc.load_hf_model(ckpt), tokens, mask), ref, mask) <= TOL

    # bf16 compute rounds every activation and matmul output (relative error up to BF16_U each),
    # so the logits drift from f32 by a few BF16_U of their scale: transformers' own bf16 forward
    # is measured at 0.0054 here, ours at 0.0082, on logits up to 0.88; both must stay within
    # 4 BF16_U of the largest logit (0.0137).
    bound = 4 * BF16_U * float(np.abs(ref[mask.astype(bool)]).max())
    torch_bf16 = transformers.Qwen2ForCausalLM.from_pretrained(
        str(ckpt), attn_implementation="eager", dtype=torch.bfloat16
    ).eval()
    with torch.no_grad():
        theirs = torch_bf16(
            input_ids=torch.as_tensor(tokens),
            attention_mask=torch.as_tensor(mask),
            position_ids=torch.as_tensor(positions_from_mask(mask)),
        ).logits.float()
    assert _max_diff(theirs.numpy(), ref, mask) <= bound
    ours = np.asarray(_forward(model, tokens, mask)).astype(np.float32)
    assert _max_diff(ours, ref, mask) <= bound
