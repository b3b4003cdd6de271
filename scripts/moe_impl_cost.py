"""One routed-experts layer (``moe.MoE``) computed densely and grouped (``ModelConfig.moe_impl``):
compiled FLOPs, temporaries and forward time on the current backend, same weights and tokens;
or, with ``--topology``, FLOPs and temporaries compiled ahead of time for a TPU slice.

    PYTHONPATH=. python scripts/moe_impl_cost.py [--experts 64] [--top-k 8] [--width 512]
        [--expert-width 256] [--tokens 2048] [--dtype float32]
    PYTHONPATH=. python scripts/moe_impl_cost.py --topology v5e:2x2 --dtype bfloat16 \\
        [--expert-chips 4]

FLOPs and temporaries are XLA's own (``compile().cost_analysis()`` / ``memory_analysis()``) for
the forward pass and for a forward and backward pass (the gradient of a sum of squares with
respect to the weights and the input); "routed" is 2 x tokens x k x 3 x D x F, the three
expert matmuls on each token's k experts only. On the current backend the forward is then
timed, the two ways alternating ``--repeats`` times, in wall-clock and process CPU seconds (all
threads: on a shared machine the steadier measure).

``--topology`` (e.g. ``v5e:2x2``; libtpu from ``.venv/tpu_plan``, as
``experiments.plan.tpu_devices`` finds it) compiles with the TPU compiler on a machine without
a TPU, nothing run: the layer on one chip of the slice, and with ``--expert-chips n`` also with
the experts split over n chips (mesh (1, 1, 1, n): the dense way under GSPMD, the grouped one
as its ``shard_map``; FLOPs and temporaries are then one chip's). It also counts the compiled
program's grouped-matmul kernels (``ragged-dot`` custom calls) and its dots over every expert
(an output with an E-sized and an F-sized axis): a grouped matmul kept as one kernel, or
computed densely; and, for comparison, the three expert matmuls alone (no routing) as
``jax.lax.ragged_dot`` and as megablox's ``gmm`` (whose weight gradient is grouped too). Not a
test: a measurement.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from agentrl_jax import sharding
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.moe import MoE
from agentrl_jax.models.testing import random_model

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--width", type=int, default=512, help="D, the model width")
    parser.add_argument("--expert-width", type=int, default=256, help="F, each expert's")
    parser.add_argument("--tokens", type=int, default=2048, help="B x T (B = 4 rows)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32",
                        help="the weights' and the computation's")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-backward", action="store_true", help="skip the backward's cost")
    parser.add_argument("--topology", default="", help="compile for this TPU slice instead")
    parser.add_argument(
        "--expert-chips",
        type=int,
        default=0,
        help="with --topology: also split the experts over this many chips",
    )
    args = parser.parse_args()

    e, k, d, f, n = args.experts, args.top_k, args.width, args.expert_width, args.tokens
    dtype = DTYPES[args.dtype]
    base = ModelConfig(
        vocab_size=8, hidden_size=d, intermediate_size=8, num_layers=1, num_heads=1,
        num_kv_heads=1, head_dim=8, family="qwen3_moe", num_experts=e, num_experts_per_tok=k,
        moe_intermediate_size=f, norm_topk_prob=True, dtype=dtype, param_dtype=dtype,
    )  # fmt: skip
    routed = 2 * n * k * 3 * d * f
    backend = f"TPU {args.topology} (compiled ahead of time)" if args.topology else None
    print(f"backend {backend or jax.default_backend()}; E={e}, k={k}, D={d}, F={f}, {n} tokens, "
          f"{args.dtype}")  # fmt: skip
    print(f"routed FLOPs (the k experts' matmuls only): {routed / 1e9:.1f} G")
    if args.topology:
        tpu_costs(base, args, routed)
        return
    x = jnp.asarray(np.random.default_rng(0).normal(size=(4, n // 4, d)), dtype)
    forwards = {}
    for impl in ("dense", "grouped"):
        layer = random_model(MoE, base.replace(moe_impl=impl), seed=0, std=0.05)
        compiled = jax.jit(lambda m, x: m(x)).lower(layer, x).compile()
        line = f"{impl:8s} forward: {_costs(compiled, routed)}"
        if not args.no_backward:
            grad = jax.jit(jax.grad(_loss, argnums=(0, 1)))
            line += f"; forward+backward: {_costs(grad.lower(layer, x).compile(), routed)}"
        print(line, flush=True)
        forwards[impl] = (compiled, layer)
    outs = {impl: np.asarray(c(m, x), np.float32) for impl, (c, m) in forwards.items()}  # warm up
    diff = float(np.abs(outs["dense"] - outs["grouped"]).max())
    print(f"max |dense - grouped| {diff:.1e} (max |out| {np.abs(outs['dense']).max():.2f})")
    times: dict[str, list[tuple[float, float]]] = {impl: [] for impl in forwards}
    for _ in range(args.repeats):
        for impl, (compiled, layer) in forwards.items():
            wall, cpu = time.perf_counter(), time.process_time()
            compiled(layer, x).block_until_ready()
            times[impl].append((time.perf_counter() - wall, time.process_time() - cpu))
    for impl, runs in times.items():
        wall = statistics.median(r[0] for r in runs)
        cpu = statistics.median(r[1] for r in runs)
        print(f"{impl:8s} forward: {wall:6.2f} s wall, {cpu:6.2f} s CPU (median of {len(runs)})")


def tpu_costs(base: ModelConfig, args, routed: int) -> None:
    """Compiles the layer for ``args.topology``'s chips (one chip; and the experts split over
    ``args.expert_chips``) without running it, and prints each program's costs."""
    from agentrl_jax.experiments.plan import tpu_devices  # noqa: PLC0415

    devices = tpu_devices(args.topology)
    f = base.moe_intermediate_size
    shapes = [(1, 1, 1)] + ([(1, 1, 1, args.expert_chips)] if args.expert_chips > 1 else [])
    for shape in shapes:
        mesh = sharding.make_mesh(shape, devices[: math.prod(shape)])
        where = "one chip" if mesh.size == 1 else f"experts over {mesh.size} chips, one chip's"
        for impl in ("dense", "grouped"):
            cfg = base.replace(moe_impl=impl)
            graphdef, state = nnx.split(nnx.eval_shape(lambda cfg=cfg: MoE(cfg, rngs=nnx.Rngs(0))))
            state = jax.tree.map(
                lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                state,
                sharding.leaf_shardings(state, mesh),
            )
            x_shape = (4, args.tokens // 4, base.hidden_size)
            x = jax.ShapeDtypeStruct(
                x_shape,
                base.dtype,
                sharding=sharding.named_sharding(mesh, ("batch", "seq", None), x_shape),
            )
            forward = lambda s, x, g=graphdef: nnx.merge(g, s)(x)  # noqa: E731
            programs = {"forward": jax.jit(forward)}
            if not args.no_backward:
                loss = lambda s, x, g=graphdef: _loss(nnx.merge(g, s), x)  # noqa: E731
                programs["forward+backward"] = jax.jit(jax.grad(loss, argnums=(0, 1)))
            for name, fn in programs.items():
                start = time.perf_counter()
                with jax.set_mesh(mesh):
                    compiled = fn.lower(state, x).compile()
                seconds = time.perf_counter() - start
                print(f"{impl:8s} {name:16s} ({where}): {_costs(compiled, routed)}; "
                      f"{_hlo_ops(compiled.as_text(), base.num_experts // mesh.size, f)}; "
                      f"compiled in {seconds:.0f} s", flush=True)  # fmt: skip
    if not args.no_backward:
        grouped_matmuls(base, args, routed, devices[0])


def grouped_matmuls(base: ModelConfig, args, routed: int, device) -> None:
    """The three expert matmuls alone on the N x k sorted rows (gate, up, down: no routing),
    compiled for one chip as ``jax.lax.ragged_dot`` and as megablox's ``gmm`` (a Pallas TPU
    kernel whose VJP computes the weight gradient as a grouped matmul too, ``tgmm``)."""
    from jax.experimental.pallas.ops.tpu.megablox import ops as megablox  # noqa: PLC0415

    e, d, f = base.num_experts, base.hidden_size, base.moe_intermediate_size
    m = args.tokens * base.num_experts_per_tok
    one = jax.sharding.SingleDeviceSharding(device)
    arrays = [((m, d), base.dtype), ((e, d, f), base.dtype), ((e, d, f), base.dtype)]
    arrays += [((e, f, d), base.dtype), ((e,), jnp.int32)]
    inputs = [jax.ShapeDtypeStruct(shape, dt, sharding=one) for shape, dt in arrays]
    ways = {
        "ragged_dot": jax.lax.ragged_dot,
        "megablox": lambda x, w, sizes: megablox.gmm(x, w, sizes, base.dtype),
    }
    for name, matmul in ways.items():

        def loss(x, gate, up, down, sizes, matmul=matmul):
            hidden = jax.nn.silu(matmul(x, gate, sizes)) * matmul(x, up, sizes)
            return jnp.sum(matmul(hidden, down, sizes).astype(jnp.float32) ** 2)

        grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))
        with jax.set_mesh(jax.sharding.Mesh([device], ("x",))):
            compiled = grad.lower(*inputs).compile()
        print(f"matmuls alone, {name:10s} forward+backward (one chip): {_costs(compiled, routed)}")


def _loss(layer, x):
    return jnp.sum(layer(x).astype(jnp.float32) ** 2)


def _costs(compiled, routed: int) -> str:
    flops = compiled.cost_analysis()["flops"]
    temp = compiled.memory_analysis().temp_size_in_bytes
    return (
        f"{flops / 1e9:7.1f} GFLOP ({flops / routed:5.1f}x routed), "
        f"temporaries {temp / 2**30:5.3f} GiB"
    )


def _hlo_ops(hlo: str, experts: int, width: int) -> str:
    """How the compiled program computes the experts: its grouped-matmul kernels (TPU's
    ``ragged-dot`` custom calls, one per ``ragged_dot``, its ``ragged-dot-metadata`` call left
    out) and its dots (convolutions, as TPU's compiler writes them) whose output has an
    ``experts``-sized and a ``width``-sized (F) axis: the expert matmuls done over every
    expert (the dense way's gate / up, or a weight gradient computed densely)."""
    kernels = len(re.findall(r"%ragged-dot-(?!metadata)[\w.-]* = .* custom-call\(", hlo))
    dense = 0
    for shape in re.findall(r"= \w+\[([0-9,]+)\]\S* (?:dot|convolution)\(", hlo):
        dims = [int(v) for v in shape.split(",")]
        dense += experts in dims and width in dims
    return f"{kernels} grouped kernels, {dense} dots over all {experts} experts"


if __name__ == "__main__":
    main()
