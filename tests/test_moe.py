"""Qwen3-MoE beyond the family parity rows of tests/test_families.py: the router's load balance
and auxiliary loss against transformers' own, the ``expert`` mesh axis (8 fake CPU devices),
and the config's refusals. The checkpoints are transformers' own Qwen3MoeForCausalLM, random
and tiny (test_families.py's ``_qwen3_moe`` configs), nothing downloaded.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_families import (  # noqa: E402
    CACHE_TOL,
    _fmt,
    _forward,
    _padded_batch,
    _qwen3_moe,
    _row_diffs,
    cached_decoding_vs_teacher_forcing,
)

from agentrl_jax import sharding  # noqa: E402
from agentrl_jax.models import hf_checkpoint as hc  # noqa: E402
from agentrl_jax.models import moe  # noqa: E402
from agentrl_jax.models.config import LoraConfig, ModelConfig  # noqa: E402
from agentrl_jax.models.testing import (  # noqa: E402
    hf_logits,
    positions_from_mask,
    random_transformers_checkpoint,
)

TOL = 1e-4  # logits and router logits against transformers / one device (as the family rows)
LOSS_TOL = 1e-6  # the load-balancing loss on the same router logits
TOL_MESH = 1e-5  # a sharded run against one device, f32 (tests/test_sharding.py's TOL)
# The grouped experts (``moe_impl="grouped"``) against the dense ones, f32: the same sums, rounded
# in another order (as TOL_MESH).
GROUPED_TOL = 1e-5
from transformers.models.qwen3_moe.modeling_qwen3_moe import (  # noqa: E402
    load_balancing_loss_func,
)


@pytest.fixture(scope="module", params=["sparse", "mixed"])
def ckpt(request, tmp_path_factory):
    return random_transformers_checkpoint(
        tmp_path_factory.mktemp(f"moe-{request.param}"), _qwen3_moe(request.param), seed=7, std=0.3
    )


def _transformers_router(ckpt, tokens, mask):
    """transformers' router logits (a tuple of [B * T, E], one per sparse layer) and its
    aux_loss, with positions that count only real tokens."""
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(ckpt), attn_implementation="eager", dtype=torch.float32
    ).eval()
    with torch.no_grad():
        out = model(
            input_ids=torch.as_tensor(tokens, dtype=torch.long),
            attention_mask=torch.as_tensor(mask, dtype=torch.long),
            position_ids=torch.as_tensor(positions_from_mask(mask)),
            output_router_logits=True,
        )
    return out.router_logits, float(out.aux_loss), model.config


def test_router_load_balance_and_aux_loss_match_transformers(ckpt):
    """Our router logits equal transformers' on every real token; our load-balancing loss on
    them equals transformers' ``load_balancing_loss_func`` (and its ``aux_loss`` output) on a
    padded batch; the load balance is a per-layer fraction of the routing choices."""
    tokens, mask = _padded_batch()
    model = hc.load_hf_model(ckpt)
    cfg = model.cfg
    ours = np.asarray(
        jax.jit(lambda m, t, k: m.trunk.router_logits(t, mask_bt=k))(model, tokens, mask)
    )
    theirs, their_aux, hf_cfg = _transformers_router(ckpt, tokens, mask)
    assert ours.shape == (sum(cfg.sparse_layers), *tokens.shape, cfg.num_experts)
    assert len(theirs) == ours.shape[0]
    real = mask.astype(bool)
    for layer, t in enumerate(theirs):
        t = t.numpy().reshape(ours.shape[1:])
        diff = float(np.abs(ours[layer][real] - t[real]).max())
        print(f"router logits, sparse layer {layer}: max diff {diff:.1e}")
        assert diff <= TOL
    k, e = cfg.num_experts_per_tok, cfg.num_experts
    # The same router logits (transformers'): the two functions agree to f32 rounding.
    stacked = np.stack([t.numpy().reshape(ours.shape[1:]) for t in theirs])
    reference = float(load_balancing_loss_func(theirs, e, k, torch.as_tensor(mask)))
    mine = float(moe.load_balancing_loss(jnp.asarray(stacked), mask, k))
    print(f"load-balancing loss: ours {mine:.6f}, transformers {reference:.6f} ({their_aux:.6f})")
    assert abs(mine - reference) <= LOSS_TOL
    assert abs(reference - their_aux) <= LOSS_TOL
    # And on our own router logits (the model's), as the aux loss the training loss adds.
    assert abs(float(moe.load_balancing_loss(jnp.asarray(ours), mask, k)) - their_aux) <= 1e-5
    # Without a mask: every token counts, as transformers' without attention_mask.
    unmasked = float(load_balancing_loss_func(theirs, e, k, None))
    assert abs(float(moe.load_balancing_loss(jnp.asarray(stacked), None, k)) - unmasked) < 1e-5
    # The load balance: per sparse layer, the share of the real tokens' k choices per expert.
    balance = np.asarray(moe.load_balance(jnp.asarray(ours), mask, k))
    assert balance.shape == (ours.shape[0], e)
    np.testing.assert_allclose(balance.sum(-1), 1.0, atol=1e-6)
    counts = np.zeros((ours.shape[0], e))
    for layer in range(ours.shape[0]):
        top = np.argsort(-ours[layer][real], axis=-1)[:, :k]
        np.add.at(counts[layer], top.ravel(), 1.0)
    np.testing.assert_allclose(balance, counts / counts.sum(-1, keepdims=True), atol=1e-6)
    print("load balance (sparse layer 0):", np.round(balance[0], 3))
    assert not np.allclose(balance, 1.0 / e)  # a random router is not perfectly balanced


MESHES = [(1, 2, 1, 4), (1, 1, 1, 8), (2, 2, 2)]


@pytest.mark.parametrize("impl", ["dense", "grouped"])
@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scanned"])
def test_expert_axis_sharded_logits_equal_one_device(tmp_path, scan, impl):
    """On 8 fake CPU devices, meshes with an ``expert`` axis (and one without): the experts'
    weights are split over it (logical axis ``expert``), each device reading its own experts
    from the checkpoint, and logits equal one device's within 1e-5, with the dense experts and
    with the grouped ones (``shard_map``: each device its own rows and experts)."""
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (tests/conftest.py's XLA_FLAGS)")
    ckpt = random_transformers_checkpoint(tmp_path / "moe", _qwen3_moe("sparse"), seed=3, std=0.3)
    tokens, mask = _padded_batch()
    tokens, mask = np.concatenate([tokens] * 4)[:8], np.concatenate([mask] * 4)[:8]
    single = hc.load_hf_model(ckpt, scan_layers=scan, moe_impl=impl)
    forward = jax.jit(lambda m, t, k: m(t, mask_bt=k)[0])
    expected = np.asarray(forward(single, tokens, mask))
    for shape in MESHES:
        mesh = sharding.make_mesh(shape)
        model = hc.load_hf_model(ckpt, mesh=mesh, scan_layers=scan, moe_impl=impl)
        moe = model.trunk.layers.mlp if scan else model.trunk.layers[0].mlp
        spec = moe.gate_weight_edf[...].sharding.spec
        lead = (None,) if scan else ()
        if len(shape) == 4:
            assert spec == P(*lead, "expert", "fsdp", "tp"), (shape, spec)
            per_device = moe.gate_weight_edf[...].addressable_shards[0].data.shape
            assert per_device[len(lead)] == 8 // shape[3]
        else:
            assert "expert" not in str(spec)
        batch = jax.device_put(
            tokens, sharding.named_sharding(mesh, ("batch", "seq"), tokens.shape)
        )
        with jax.set_mesh(mesh):
            logits = np.asarray(jax.jit(lambda m, t, k: m(t, mask_bt=k)[0])(model, batch, mask))
        diff = float(np.abs(logits - expected).max())
        print(f"{impl} mesh {shape} {'scanned' if scan else 'unrolled'}: max diff {diff:.1e}")
        assert diff <= 1e-5, (shape, diff)
        # Loaded weights are the single-device model's, bit for bit.
        for a, b in zip(jax.tree.leaves(nnx.state(single)), jax.tree.leaves(nnx.state(model))):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scanned"])
def test_grouped_experts_match_transformers_and_the_dense_ones(ckpt, scan):
    """``moe_impl="grouped"`` (a grouped matmul over the tokens sorted by expert): f32 logits
    within 1e-4 of transformers' on the real tokens of rows with no, left and right padding,
    within 1e-5 of the dense experts' (``moe_impl="dense"``, the default), and finite on the
    padding too."""
    cfg = hc.load_config(ckpt)
    if scan and len(set(cfg.sparse_layers)) > 1:
        pytest.skip("sparse and dense layers mixed: scanning needs every layer alike")
    tokens, mask = _padded_batch()
    grouped = hc.load_hf_model(ckpt, scan_layers=scan, moe_impl="grouped")
    dense = hc.load_hf_model(ckpt, scan_layers=scan)
    assert (grouped.cfg.moe_impl, dense.cfg.moe_impl) == ("grouped", "dense")
    ours = np.asarray(_forward(grouped, tokens, mask))
    assert np.isfinite(ours).all()
    reference = hf_logits(ckpt, tokens, mask)
    assert np.abs(reference).max() > 1.0
    label = f"{_variant(cfg)} {'scanned' if scan else 'unrolled'}"
    theirs = _row_diffs(ours, reference, mask)
    print(f"grouped vs transformers, {label}: {_fmt(theirs)}")
    assert max(theirs.values()) <= TOL, theirs
    vs_dense = _row_diffs(ours, _forward(dense, tokens, mask), mask)
    print(f"grouped vs dense, {label}: {_fmt(vs_dense)}")
    assert max(vs_dense.values()) <= GROUPED_TOL, vs_dense


def _variant(cfg) -> str:
    """The ``ckpt`` fixture's variant, from its config."""
    return "mixed" if len(set(cfg.sparse_layers)) > 1 else "sparse"


def test_run_config_moe_impl_builds_the_grouped_experts(tmp_path):
    """``config.model.moe_impl`` reaches the policy a run builds (``build.policy`` from a
    Qwen3-MoE checkpoint, as ``launch.train`` builds it, and ``build.model_config`` from the
    checkpoint or a preset): "grouped" gives a policy whose sparse layers compute grouped, with
    the dense one's f32 logits within 1e-5 on the real tokens."""
    import train_cli

    from agentrl_jax.run import build
    from agentrl_jax.run.config import from_config_dict

    hf_cfg = _qwen3_moe("sparse")
    ckpt = random_transformers_checkpoint(tmp_path / "moe", hf_cfg, seed=5, std=0.3)
    tokens, mask = _padded_batch()
    logits = {}
    for impl in ("dense", "grouped"):
        model = dict(checkpoint=str(ckpt), template="plain", moe_impl=impl)
        config = from_config_dict(train_cli.tiny_config("test", model=model), num_devices=1)
        assert config.model.moe_impl == build.model_config(config).moe_impl == impl
        policy = build.policy(config, hf_cfg.vocab_size)
        assert policy.cfg.moe_impl == impl
        assert all(layer.mlp.cfg.moe_impl == impl for layer in policy.trunk.layers)
        logits[impl] = _forward(policy, tokens, mask)
        preset = dict(preset="qwen3-30b-a3b", moe_impl=impl)
        config = from_config_dict(train_cli.tiny_config("test", model=preset), num_devices=1)
        assert build.model_config(config).moe_impl == impl
    diffs = _row_diffs(logits["grouped"], logits["dense"], mask)
    print(f"run config moe_impl='grouped' vs 'dense': {_fmt(diffs)}")
    assert max(diffs.values()) <= GROUPED_TOL, diffs


def test_run_config_moe_impl_changes_nothing_without_experts():
    """A Qwen2 run (the ``tiny`` preset: no routed experts) with ``config.model.moe_impl``
    "grouped" builds the policy the default run builds: the same weights and logits, bit for
    bit."""
    import train_cli

    from agentrl_jax.run import build
    from agentrl_jax.run.config import from_config_dict

    tokens, mask = _padded_batch()
    results = []
    for impl in ("dense", "grouped"):
        model = dict(overrides=dict(num_layers=2))
        if impl == "grouped":
            model["moe_impl"] = impl
        config = from_config_dict(train_cli.tiny_config("test", model=model), num_devices=1)
        policy = build.policy(config, vocab_size=64)
        assert policy.cfg.family == "qwen2" and policy.cfg.num_experts == 0
        results.append((nnx.state(policy, nnx.Param), np.asarray(_forward(policy, tokens, mask))))
    (dense, dense_logits), (grouped, grouped_logits) = results
    for a, b in zip(jax.tree.leaves(dense), jax.tree.leaves(grouped), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(grouped_logits, dense_logits)


def test_grouped_experts_cached_decoding_equals_teacher_forcing(ckpt):
    """The grouped experts through the sampler's KV cache (two turns; prefill chunks and
    one-token decode steps route a few tokens at a time): every drawn token's log-prob equals
    teacher forcing's within 1e-5 (tests/test_families.py's bar)."""
    model = hc.load_hf_model(ckpt, moe_impl="grouped")
    worst = cached_decoding_vs_teacher_forcing(model)
    print(f"grouped {_variant(model.cfg)}: sampler vs teacher forcing, log-prob diff {worst:.1e}")
    assert worst <= CACHE_TOL


def test_grouped_experts_sft_step_equals_dense():
    """One SFT step (SGD at learning rate 1, so a weight moves by its gradient; the router's
    auxiliary loss on) on a padded batch from the same weights: the grouped experts give the
    dense ones' loss and metrics within 1e-6 and their parameters (every gradient, the
    experts' and router's included) within 1e-6."""
    import optax

    from agentrl_jax.models.decoder import CausalLM
    from agentrl_jax.models.testing import random_model
    from agentrl_jax.rl.learner import Learner

    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 64, (4, 10)).astype(np.int32)
    mask = np.ones((4, 10), np.float32)
    mask[1, -4:] = 0
    mask[2, :3] = 0
    loss_mask = mask * (np.arange(10) >= 3)
    batch = {"tokens": tokens, "mask": mask, "loss_mask": loss_mask}
    batch["step_ids"] = np.where(loss_mask > 0, 0, -1).astype(np.int32)
    results = {}
    for impl in ("dense", "grouped"):
        cfg = _moe_cfg(router_aux_loss=True, router_aux_loss_coef=0.5, moe_impl=impl)
        model = random_model(CausalLM, cfg, seed=1, std=0.3)
        learner = Learner(model, None, optax.sgd(1.0))
        state, metrics = learner.sft_step(learner.init(model), learner.place_batch(batch))
        start = jax.tree.leaves(nnx.state(model, nnx.Param))
        results[impl] = (jax.tree.leaves(state.policy), metrics, start)
    (dense, dense_metrics, start), (grouped, grouped_metrics, _) = results.values()
    assert dense_metrics.keys() == grouped_metrics.keys()
    worst = max(abs(float(dense_metrics[k]) - float(grouped_metrics[k])) for k in dense_metrics)
    params = max(float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in zip(dense, grouped))
    moved = min(float(np.abs(np.asarray(a) - b).max()) for a, b in zip(dense, start))
    print(f"grouped vs dense SFT step: loss {float(dense_metrics['losses/total']):.6f}, "
          f"metrics {worst:.1e}, parameters {params:.1e} (each moved >= {moved:.1e})")  # fmt: skip
    assert moved > 1e-4  # every parameter, each expert's included, had a gradient
    assert worst <= 1e-6
    assert params <= 1e-6


def test_grouped_experts_on_an_expert_mesh_do_expert_local_work():
    """A MoE layer with grouped experts traced under ``jax.set_mesh`` on 8 fake devices: each
    device routes its own rows through its own experts (``shard_map``), so its compiled
    program does about 1 / 8 of one device's FLOPs (at most 1 / 4 here, routing and psum
    included), with outputs equal to one device's within 1e-5 and gradients within 1e-5 of
    their largest entry."""
    from agentrl_jax.models.testing import random_model

    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (tests/conftest.py's XLA_FLAGS)")
    cfg = _moe_cfg(moe_impl="grouped").replace(num_experts=8)
    x = jax.random.normal(jax.random.key(1), (8, 6, cfg.hidden_size))

    def loss(layer, x):
        return jnp.sum(layer(x) ** 2)

    def run(mesh):
        layer = random_model(moe.MoE, cfg, seed=2, std=0.3, mesh=mesh)
        if mesh is None:
            flops = jax.jit(loss).lower(layer, x).compile().cost_analysis()["flops"]
            return layer(x), nnx.grad(loss)(layer, x), flops
        xs = jax.device_put(x, sharding.named_sharding(mesh, ("batch", "seq", None), x.shape))
        with jax.set_mesh(mesh):
            flops = jax.jit(loss).lower(layer, xs).compile().cost_analysis()["flops"]
            return jax.jit(lambda m, x: m(x))(layer, xs), jax.jit(nnx.grad(loss))(layer, xs), flops

    out, grads, flops = run(None)
    assert np.abs(np.asarray(out)).max() > 1.0
    for shape in [(1, 1, 1, 8), (1, 2, 1, 4), (2, 1, 2, 2)]:
        got, got_grads, got_flops = run(sharding.make_mesh(shape))
        diff = float(np.abs(np.asarray(got) - np.asarray(out)).max())
        # Gradients relative to each one's largest entry (sum(out ** 2) puts them at ~1e3).
        gdiff = max(
            float(np.abs(np.asarray(a) - np.asarray(b)).max() / np.abs(np.asarray(a)).max())
            for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(got_grads))
        )
        print(f"mesh {shape}: outputs {diff:.1e}, gradients {gdiff:.1e} (relative), "
              f"FLOPs a device {got_flops / flops:.3f} of one device's")  # fmt: skip
        assert diff <= TOL_MESH and gdiff <= TOL_MESH
        assert got_flops <= flops / 4


def test_config_refusals():
    base = dict(
        vocab_size=32, hidden_size=16, intermediate_size=24, num_layers=3, num_heads=2,
        num_kv_heads=1, head_dim=8, family="qwen3_moe", num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=8, attention_bias=False, qk_norm=True,
    )  # fmt: skip
    cfg = ModelConfig(**base, mlp_only_layers=[1])
    assert cfg.sparse_layers == (True, False, True)
    assert ModelConfig(**base, decoder_sparse_step=2).sparse_layers == (False, True, False)
    with pytest.raises(ValueError, match="scan_layers=True needs every layer alike"):
        ModelConfig(**base, mlp_only_layers=(1,), scan_layers=True)
    with pytest.raises(ValueError, match=r"num_experts_per_tok=5 exceeds num_experts=4"):
        ModelConfig(**{**base, "num_experts_per_tok": 5})
    with pytest.raises(ValueError, match=r"mlp_only_layers: \[3\] are not layer indices"):
        ModelConfig(**base, mlp_only_layers=(3,))
    with pytest.raises(ValueError, match="router_aux_loss=True needs routed experts.*no sparse"):
        ModelConfig(**base, mlp_only_layers=(0, 1, 2), router_aux_loss=True)
    with pytest.raises(ValueError, match="router_aux_loss_coef must be a number >= 0"):
        ModelConfig(**base, router_aux_loss_coef=-1.0)
    with pytest.raises(ValueError, match="moe_intermediate_size must be a positive int"):
        ModelConfig(**{**base, "moe_intermediate_size": 0})
    with pytest.raises(ValueError, match=r"moe_impl='ragged'; expected one of \['dense', 'gr"):
        ModelConfig(**base, moe_impl="ragged")
    with pytest.raises(ValueError, match=r"\['gate', 'up', 'down'\] are not supported"):
        ModelConfig(**base, lora=LoraConfig(rank=2, targets="all"))
    assert ModelConfig(**base, lora=LoraConfig(rank=2, targets="q,v")).lora.targets == ("q", "v")
    # config.json: transformers 5 writes num_local_experts; the shipped checkpoints num_experts.
    hf = hc.config_to_hf(cfg)
    assert hf["num_experts"] == 4 and hc.config_from_hf(hf) == cfg
    legacy = {k: v for k, v in hf.items() if k != "num_experts"} | {"num_local_experts": 4}
    assert hc.config_from_hf(legacy) == cfg
    with pytest.raises(hc.CheckpointError, match="num_experts_per_tok=9 exceeds"):
        hc.config_from_hf({**hf, "num_experts_per_tok": 9})
    with pytest.raises(hc.CheckpointError, match="field 'moe_intermediate_size'"):
        hc.config_from_hf({k: v for k, v in hf.items() if k != "moe_intermediate_size"})


def _moe_cfg(**overrides):
    return ModelConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
        num_kv_heads=2, head_dim=8, family="qwen3_moe", attention_bias=False, qk_norm=True,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, norm_topk_prob=True,
        **overrides,
    )  # fmt: skip


def test_router_aux_loss_is_added_to_the_training_loss():
    """``router_aux_loss=True``: the SFT loss is the NLL plus ``router_aux_loss_coef`` times
    transformers' ``load_balancing_loss_func`` on the model's router logits (per microbatch,
    averaged, with microbatches); off (the default), the loss is the NLL alone."""
    import optax

    from agentrl_jax.models.decoder import CausalLM
    from agentrl_jax.models.testing import random_model
    from agentrl_jax.rl.learner import Learner
    from agentrl_jax.rl.losses import split_rows

    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, 64, (4, 10)).astype(np.int32))
    mask = np.ones((4, 10), np.float32)
    mask[1, -4:] = 0
    loss_mask = np.zeros((4, 10), np.float32)
    loss_mask[:, 3:8] = 1
    batch = {"tokens": tokens, "mask": jnp.asarray(mask), "loss_mask": jnp.asarray(loss_mask)}
    batch["step_ids"] = jnp.asarray(np.where(loss_mask > 0, 0, -1).astype(np.int32))
    off = random_model(CausalLM, _moe_cfg(), seed=1, std=0.3)
    on = random_model(
        CausalLM, _moe_cfg(router_aux_loss=True, router_aux_loss_coef=0.5), seed=1, std=0.3
    )
    nll, off_metrics = Learner(off, None, optax.sgd(0.0)).sft_loss(nnx.state(off), batch)
    assert not any(k.startswith("moe/") for k in off_metrics)

    def reference(rows):
        logits = np.asarray(on.trunk.router_logits(tokens[rows], mask_bt=batch["mask"][rows]))
        layers = tuple(torch.as_tensor(lg.reshape(-1, 4)) for lg in logits)
        return float(load_balancing_loss_func(layers, 4, 2, torch.as_tensor(mask[rows])))

    whole = reference(slice(None))
    total, metrics = Learner(on, None, optax.sgd(0.0)).sft_loss(nnx.state(on), batch)
    print(f"nll {float(nll):.6f}, load-balancing loss {whole:.6f}, total {float(total):.6f}")
    assert abs(float(metrics["moe/router_aux_loss"]) - whole) <= 1e-6
    assert abs(float(total) - (float(nll) + 0.5 * whole)) <= 1e-6
    from agentrl_jax.models import moe

    load_max = (
        np.max(
            np.asarray(
                moe.load_balance(
                    on.trunk.router_logits(tokens, mask_bt=batch["mask"]), batch["mask"], 2
                )
            )
        )
        * 4
    )
    assert abs(float(metrics["moe/expert_load_max"]) - load_max) <= 1e-6
    # Two microbatches (strided rows: 0, 2 and 1, 3): each its own loss, averaged.
    learner = Learner(on, None, optax.sgd(0.0), microbatch_size=2)
    state = learner.init(on)
    _, step_metrics = learner.sft_step(state, batch)
    halves = [reference(np.asarray(split_rows(jnp.arange(4), 2)[i])) for i in range(2)]
    assert abs(float(step_metrics["moe/router_aux_loss"]) - np.mean(halves)) <= 1e-6
    assert abs(float(step_metrics["losses/total"]) - (float(nll) + 0.5 * np.mean(halves))) <= 1e-5
    # A microbatch of padding rows only (rows 1 and 3 empty): it adds nothing, and the step is
    # finite (no 0 / 0) and taken; the aux term is the other microbatch's.
    empty = {**batch, "mask": batch["mask"].at[1::2].set(0.0)}
    empty["loss_mask"] = empty["loss_mask"].at[1::2].set(0.0)
    empty["step_ids"] = jnp.where(empty["loss_mask"] > 0, empty["step_ids"], -1)
    _, step_metrics = learner.sft_step(learner.init(on), empty)
    assert float(step_metrics["train/skipped_nonfinite"]) == 0.0
    assert abs(float(step_metrics["moe/router_aux_loss"]) - halves[0]) <= 1e-6


@pytest.mark.parametrize("step", ["sft", "rl"])
def test_router_aux_loss_with_microbatches_steps_by_the_mean_of_their_gradients(step):
    """With the auxiliary loss on and two microbatches, the loss is the NLL (or RL loss) of the
    whole batch plus the coefficient times the mean of each microbatch's load-balancing loss
    (docs/models.md), so its gradient is the mean of the microbatches' gradients when the
    microbatches hold as many loss tokens and real rows each (here 11 and 2, rows 0 and 1 both
    padded), not the whole batch's: the load-balancing loss is not a sum over rows. One step
    (SGD at learning rate 1, so a weight moves by its gradient) gives the parameters and the
    gradient norm of that reference, each microbatch's gradient taken without microbatches
    (``jax.grad`` of the Learner's ``sft_loss`` / ``rl_loss``), within f32 rounding (1e-6)."""
    import optax

    from agentrl_jax.models.decoder import CausalLM
    from agentrl_jax.models.testing import random_model
    from agentrl_jax.rl.learner import Learner
    from agentrl_jax.rl.losses import split_rows

    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 64, (4, 10)).astype(np.int32)
    mask = np.ones((4, 10), np.float32)
    mask[:2, -3:] = 0  # microbatches (strided) rows 0, 2 and 1, 3: one padded row each
    loss_mask = mask * (np.arange(10) >= 3)
    batch = {"tokens": tokens, "mask": mask, "loss_mask": loss_mask}
    batch["step_ids"] = np.where(loss_mask > 0, 0, -1).astype(np.int32)
    if step == "rl":  # PPO's clipped ratio on token means: old log-probs off the current ones
        batch["old_logprobs"] = (0.3 * rng.normal(size=(4, 10)) * loss_mask).astype(np.float32)
        batch["advantages"] = (rng.normal(size=(4, 10)) * loss_mask).astype(np.float32)
    batch = {k: jnp.asarray(v) for k, v in batch.items()}
    cfg = _moe_cfg(router_aux_loss=True, router_aux_loss_coef=0.5)
    model = random_model(CausalLM, cfg, seed=1, std=0.3)
    whole = Learner(model, None, optax.sgd(1.0))
    micro = Learner(model, None, optax.sgd(1.0), microbatch_size=2)
    start = nnx.state(model, nnx.Param)
    if step == "sft":
        loss_fn = lambda p, b: whole.sft_loss(p, b)[0]  # noqa: E731
    else:
        loss_fn = lambda p, b: whole.rl_loss((p, None), b)[0]  # noqa: E731
    halves = [{k: split_rows(v, 2)[i] for k, v in batch.items()} for i in range(2)]
    assert [float(h["loss_mask"].sum()) for h in halves] == [11.0, 11.0]
    grads = [jax.jit(jax.grad(loss_fn))(start, h) for h in halves]
    reference = jax.tree.map(lambda a, b: (a + b) / 2, *grads)
    expected = jax.tree.map(lambda p, g: p - g, start, reference)
    run = micro.sft_step if step == "sft" else micro.rl_step
    state, metrics = run(micro.init(model), batch)
    params = max(
        float(np.abs(np.asarray(a) - np.asarray(b)).max())
        for a, b in zip(jax.tree.leaves(state.policy), jax.tree.leaves(expected))
    )
    norm = float(optax.global_norm(reference))
    got_norm = float(metrics["train/grad_norm"])
    print(f"{step}, 2 microbatches: parameters {params:.1e} from the mean of the microbatches' "
          f"gradients; grad norm {got_norm:.6f} vs {norm:.6f}")  # fmt: skip
    assert norm > 0.1
    assert params <= 1e-6
    assert abs(got_norm - norm) <= 1e-6 * norm


@pytest.mark.slow  # two SFT steps compiled on one device and on 8 (~1.5 min on 2 cores)
def test_run_config_expert_mesh_steps_as_one_device(tmp_path):
    """A run whose ``config.mesh`` is (data, fsdp, tp, expert) = (1, 2, 1, 4), built as
    ``launch.train`` builds it (``build.device_mesh``, ``build.policy`` from a Qwen3-MoE
    checkpoint, ``build.sft_learner``), on 8 fake CPU devices: the experts' weights and their
    Adam moments are split over ``expert``, and two SFT steps (the first at the warmup's zero
    learning rate, the second moving the weights), with the router's auxiliary loss on, give
    the metrics, parameters and Adam moments of the same run on one device within f32's 1e-5
    (tests/test_sharding.py's bar).

    The learning rate is 1e-3: the second step moves a weight by lr x g / (|g| + 1e-8) (both
    steps see the same batch), so on a gradient entry near Adam's 1e-8 or below (an expert's
    weight a token barely reaches) f32 rounding of g is scaled by lr x 1e-8 / (|g| + 1e-8)^2.
    Measured: g = 2.41e-9 on one device and 2.39e-9 on the mesh moved that weight 1.75e-5
    apart at lr 1e-2 (3.3e-5 at most over all weights), 3.3e-6 at most at lr 1e-3, while the
    first moments (0.1 g after the first step) agree within 4e-9."""
    import math

    import train_cli

    from agentrl_jax.run import build
    from agentrl_jax.run.config import from_config_dict

    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (tests/conftest.py's XLA_FLAGS)")
    hf_cfg = _qwen3_moe("sparse")
    hf_cfg.output_router_logits = True  # our router_aux_loss: the aux term in the SFT loss
    ckpt = random_transformers_checkpoint(tmp_path / "moe", hf_cfg, seed=5, std=0.3)
    rng = np.random.default_rng(0)
    rows, seq = 8, 16
    tokens = rng.integers(0, hf_cfg.vocab_size, (rows, seq)).astype(np.int32)
    lengths = rng.integers(8, seq + 1, rows)
    cols = np.arange(seq)[None, :]
    mask = (cols < lengths[:, None]).astype(np.float32)
    batch = {"tokens": tokens, "mask": mask, "loss_mask": mask * (cols >= 4)}
    lr = 1e-3

    results = {}
    for shape in [(1, 1, 1), (1, 2, 1, 4)]:
        cd = train_cli.tiny_config(
            "test",
            mesh=shape,
            model=dict(checkpoint=str(ckpt), template="plain"),
            sft=dict(learning_rate=lr, warmup_steps=1, microbatch_size=0),
        )
        config = from_config_dict(cd, num_devices=math.prod(shape))
        assert config.mesh == shape
        mesh = build.device_mesh(config)
        policy = build.policy(config, hf_cfg.vocab_size, mesh)
        assert policy.cfg.router_aux_loss and policy.cfg.num_experts == 8
        learner = build.sft_learner(config, policy, total_steps=10, mesh=mesh)
        state = learner.init(policy)
        metrics = []
        for _ in range(2):
            state, step = learner.sft_step(state, learner.place_batch(batch))
            metrics.append({k: float(v) for k, v in step.items()})
        if mesh is not None:
            assert dict(mesh.shape) == dict(data=1, fsdp=2, tp=1, expert=4)
            gate = state.policy["trunk"]["layers"][0]["mlp"]["gate_weight_edf"].value
            assert gate.sharding.spec == P("expert", "fsdp", "tp"), gate.sharding.spec
            assert gate.addressable_shards[0].data.shape[0] == 8 // 4  # 2 experts a device
            moments = [x for x in jax.tree.leaves(state.policy_opt) if x.shape == gate.shape]
            assert len(moments) >= 2 and all(x.sharding == gate.sharding for x in moments)
        results[shape] = (jax.tree.map(np.asarray, (state.policy, state.policy_opt)), metrics)

    (single, single_metrics), (sharded, sharded_metrics) = results.values()
    assert single_metrics[1]["moe/router_aux_loss"] > 0
    for step, (want, got) in enumerate(zip(single_metrics, sharded_metrics)):
        assert set(want) == set(got)
        worst = max(want, key=lambda k: abs(want[k] - got[k]))
        print(f"step {step}: loss {want['losses/total']:.6f}, metrics max |diff| "
              f"{abs(want[worst] - got[worst]):.1e} ({worst})")  # fmt: skip
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=TOL_MESH, atol=TOL_MESH, err_msg=k)
    start = jax.tree.leaves(nnx.state(hc.load_hf_model(ckpt), nnx.Param))
    params, opt = zip(single, sharded)
    moved = max(float(np.abs(a - b).max()) for a, b in zip(start, jax.tree.leaves(params[0])))
    diffs = [
        max(float(np.abs(a - b).max()) for a, b in zip(*map(jax.tree.leaves, pair)))
        for pair in (params, opt)
    ]
    print(f"parameters moved up to {moved:.1e}; mesh vs one device: parameters {diffs[0]:.1e}, "
          f"Adam moments {diffs[1]:.1e}")  # fmt: skip
    assert moved >= lr / 2  # the second step really moved the weights (Adam: about lr each)
    assert max(diffs) <= TOL_MESH


@pytest.mark.slow  # two sampled turns compiled on one device and on 4 (~65 s on 2 shared cores)
def test_rollout_mesh_splits_the_experts_and_samples_as_one_device(tmp_path):
    """A run with ``config.mesh`` = (1, 2, 1, 2) and ``config.rollout_mesh`` = (1, 1, 1, 4) on 8
    fake CPU devices, built as ``launch.train`` builds it (``build.device_mesh``,
    ``build.rollout_device_mesh``, ``build.policy`` from a Qwen3-MoE checkpoint), its sampler's
    copy synced as the trainer syncs it (``build.sync_sampler`` with the rollout's mesh): the
    copy's routed experts are split over the rollout devices' ``expert`` axis (2 of the 8 a
    device, as the learner's are over its own: 4 a device), and two sampled turns give the
    tokens of the same turns on one device, their log-probs within f32's 1e-5 (measured: 9.5e-7
    at most)."""
    import train_cli

    from agentrl_jax.run import build
    from agentrl_jax.run.config import from_config_dict
    from agentrl_jax.sampling import Sampler, SamplingParams, StopConfig

    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (tests/conftest.py's XLA_FLAGS)")
    hf_cfg = _qwen3_moe("sparse")
    ckpt = random_transformers_checkpoint(tmp_path / "moe", hf_cfg, seed=11, std=0.3)
    cd = train_cli.tiny_config(
        "test",
        mesh=(1, 2, 1, 2),
        rollout_mesh=(1, 1, 1, 4),
        model=dict(checkpoint=str(ckpt), template="plain"),
    )
    config = from_config_dict(cd, num_devices=8)
    mesh, rollout = build.device_mesh(config), build.rollout_device_mesh(config)
    assert dict(mesh.shape) == dict(data=1, fsdp=2, tp=1, expert=2)
    assert dict(rollout.shape) == dict(data=1, fsdp=1, tp=1, expert=4)
    assert set(rollout.devices.flat) == set(jax.devices()[4:8])
    policy = build.policy(config, hf_cfg.vocab_size, mesh)
    assert policy.cfg.num_experts == 8
    params = nnx.state(policy, nnx.Param)
    stop = StopConfig(eos_ids=(0,))
    sampling = SamplingParams(temperature=1.0)
    apart = Sampler(policy, sampling=sampling, stop=stop, mesh=rollout)
    build.sync_sampler(apart, params, policy.cfg.dtype, rollout=rollout)
    assert apart._owned  # a copy of its own, moved to the rollout's devices
    assert {d for x in jax.tree.leaves(apart.state) for d in x.devices()} == set(jax.devices()[4:8])
    for name in ("gate_weight_edf", "up_weight_edf", "down_weight_efd"):
        learner = params["trunk"]["layers"][0]["mlp"][name][...]
        copy = apart.state["trunk"]["layers"][0]["mlp"][name][...]
        assert learner.sharding.spec[0] == "expert" and copy.sharding.spec[0] == "expert", name
        assert copy.sharding.mesh == rollout, name
        assert learner.addressable_shards[0].data.shape[0] == 8 // 2
        assert copy.addressable_shards[0].data.shape[0] == 8 // 4, name  # 2 experts a device
        np.testing.assert_array_equal(np.asarray(copy), np.asarray(learner))
    single = Sampler(hc.load_hf_model(ckpt), sampling=sampling, stop=stop)
    _samples_as_one_device(single, apart, rollout, hf_cfg.vocab_size, "rollout mesh")


def _local_copy_of_a_loaded_moe(tmp_path, learner_shape, seed):
    """A tiny Qwen3-MoE (8 experts, 4 query and 2 kv heads) loaded on a learner mesh of the 8
    fake devices, its parameters, and ``multihost.local_mesh`` with the copy on it
    (``multihost.local_copy`` in f32, as the trainer makes it each iteration)."""
    from agentrl_jax.run import multihost

    ckpt = random_transformers_checkpoint(
        tmp_path / "moe", _qwen3_moe("sparse"), seed=seed, std=0.3
    )
    policy = hc.load_hf_model(ckpt, mesh=sharding.make_mesh(learner_shape))
    params = nnx.state(policy, nnx.Param)
    local = multihost.local_mesh(policy.cfg)
    return ckpt, policy, params, local, multihost.local_copy(params, local)


@pytest.mark.parametrize("learner_shape", [(2, 4, 1), (1, 2, 1, 4)])
def test_multihost_local_copy_splits_the_experts_over_the_local_expert_axis(
    tmp_path, learner_shape
):
    """One host's sampler mesh for a tiny Qwen3-MoE on 8 fake devices is (1, 1, 2, 4): tp = 2
    (2 kv heads), the other 4 devices on ``expert``. ``multihost.local_copy`` of the policy,
    from a learner mesh without an expert axis or with another split of the experts, lays the
    routed experts out over the local ``expert`` axis (2 of the 8 a device, each expert once on
    the host) and every device's shard equals the source's block bit for bit."""
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (tests/conftest.py's XLA_FLAGS)")
    _, _, params, local, copy = _local_copy_of_a_loaded_moe(tmp_path, learner_shape, seed=5)
    assert dict(local.shape) == dict(data=1, fsdp=1, tp=2, expert=4)
    for got, want in zip(jax.tree.leaves(copy), jax.tree.leaves(params)):
        assert got.sharding.mesh == local and got.dtype == want.dtype
        whole = np.asarray(want)
        for shard in got.addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data), whole[shard.index])
    mlp = copy["trunk"]["layers"][0]["mlp"]
    for name in ("gate_weight_edf", "up_weight_edf", "down_weight_efd"):
        x = mlp[name][...]
        assert x.sharding.spec[0] == "expert", (name, x.sharding.spec)
        assert x.sharding.shard_shape(x.shape)[0] == 8 // 4, name
        # The 4 expert blocks, each on the 2 devices of its tp group: every expert once.
        blocks = {d: idx[0] for d, idx in x.sharding.devices_indices_map(x.shape).items()}
        starts = sorted(b.start for b in blocks.values())
        assert starts == [0, 0, 2, 2, 4, 4, 6, 6], (name, starts)


def test_multihost_sampler_on_the_expert_split_copy_samples_as_one_device(tmp_path):
    """A sampler on one host's (1, 1, 2, 4) mesh with its copy of a tiny Qwen3-MoE synced as a
    multi-host trainer syncs it (``build.sync_sampler`` with the local mesh: ``local_copy``,
    experts over ``expert``), from a learner on (1, 2, 1, 4): two sampled turns give one
    device's tokens, their log-probs within f32's 1e-5 (measured: 1.4e-6 at most; ~25 s on 2
    shared cores)."""
    from agentrl_jax.run import build
    from agentrl_jax.sampling import Sampler, SamplingParams, StopConfig

    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (tests/conftest.py's XLA_FLAGS)")
    ckpt, policy, params, local, _ = _local_copy_of_a_loaded_moe(tmp_path, (1, 2, 1, 4), seed=11)
    stop = StopConfig(eos_ids=(0,))
    sampling = SamplingParams(temperature=1.0)
    host = Sampler(policy, sampling=sampling, stop=stop, mesh=local)
    build.sync_sampler(host, params, policy.cfg.dtype, local)
    assert host._owned
    gate = host.state["trunk"]["layers"][0]["mlp"]["gate_weight_edf"][...]
    assert gate.sharding.mesh == local and gate.sharding.spec[0] == "expert"
    single = Sampler(hc.load_hf_model(ckpt), sampling=sampling, stop=stop)
    _samples_as_one_device(single, host, local, policy.cfg.vocab_size, "local expert mesh")


def _samples_as_one_device(single, sampler, mesh, vocab, label):
    """Two turns of 4 rows sampled by ``sampler`` (on ``mesh``) give ``single``'s tokens, with
    log-probs within TOL_MESH."""
    rng = np.random.default_rng(0)
    turns = [
        [rng.integers(1, vocab, n).tolist() for n in lengths]
        for lengths in ([9, 4, 12, 6], [3, 5, 1, 7])
    ]
    outs = []
    for each in (single, sampler):
        cache, turn_outs = each.start(4, 64), []
        for t, new in enumerate(turns):
            out = each.step_turn(cache, new, 8, jax.random.split(jax.random.key(t), 4))
            cache = out.cache
            turn_outs.append(out)
        outs.append(turn_outs)
    assert {d for d in outs[1][-1].tokens.devices()} <= set(mesh.devices.flat)
    for t, (want, got) in enumerate(zip(*outs)):
        assert got.token_lists() == want.token_lists(), t
        assert sum(map(len, want.token_lists())) > 4 * 2, t  # not all stopped at once
        for field in ("logprobs", "policy_logprobs"):
            ours, theirs = (np.asarray(getattr(out, field)) for out in (got, want))
            diff = float(np.abs(ours - theirs).max())
            print(f"turn {t} {field}: {label} vs one device, max diff {diff:.1e}")
            assert diff <= TOL_MESH, (t, field, diff)
