"""One routed-experts layer (``moe.MoE``) computed densely and grouped (``ModelConfig.moe_impl``):
compiled FLOPs, temporaries and forward time on the current backend, same weights and tokens.

    PYTHONPATH=. python scripts/moe_impl_cost.py [--experts 64] [--top-k 8] [--width 512]
        [--expert-width 256] [--tokens 2048]

FLOPs and temporaries are XLA's own (``compile().cost_analysis()`` / ``memory_analysis()``) for
the forward pass and for a forward and backward pass (the gradient of a sum of squares with
respect to the weights and the input); "routed" is 2 x tokens x k x 3 x D x F, the three
expert matmuls on each token's k experts only. The forward is then timed, the two ways
alternating ``--repeats`` times, in wall-clock and process CPU seconds (all threads: on a
shared machine the steadier measure). Not a test: a measurement.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.moe import MoE
from agentrl_jax.models.testing import random_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--width", type=int, default=512, help="D, the model width")
    parser.add_argument("--expert-width", type=int, default=256, help="F, each expert's")
    parser.add_argument("--tokens", type=int, default=2048, help="B x T (B = 4 rows)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-backward", action="store_true", help="skip the backward's cost")
    args = parser.parse_args()

    e, k, d, f, n = args.experts, args.top_k, args.width, args.expert_width, args.tokens
    base = ModelConfig(
        vocab_size=8, hidden_size=d, intermediate_size=8, num_layers=1, num_heads=1,
        num_kv_heads=1, head_dim=8, family="qwen3_moe", num_experts=e, num_experts_per_tok=k,
        moe_intermediate_size=f, norm_topk_prob=True,
    )  # fmt: skip
    x = jnp.asarray(np.random.default_rng(0).normal(size=(4, n // 4, d)).astype(np.float32))
    routed = 2 * n * k * 3 * d * f
    print(f"backend {jax.default_backend()}; E={e}, k={k}, D={d}, F={f}, {n} tokens")
    print(f"routed FLOPs (the k experts' matmuls only): {routed / 1e9:.1f} G")
    forwards = {}
    for impl in ("dense", "grouped"):
        layer = random_model(MoE, base.replace(moe_impl=impl), seed=0, std=0.05)
        forward = jax.jit(lambda m, x: m(x))
        compiled = forward.lower(layer, x).compile()
        flops = compiled.cost_analysis()["flops"]
        temp = compiled.memory_analysis().temp_size_in_bytes
        line = (
            f"{impl:8s} forward: {flops / 1e9:7.1f} GFLOP ({flops / routed:5.1f}x routed), "
            f"temporaries {temp / 2**30:5.2f} GiB"
        )
        if not args.no_backward:
            grad = jax.jit(jax.grad(lambda m, x: jnp.sum(m(x) ** 2), argnums=(0, 1)))
            bwd = grad.lower(layer, x).compile()
            bflops = bwd.cost_analysis()["flops"]
            btemp = bwd.memory_analysis().temp_size_in_bytes
            line += (
                f"; forward+backward: {bflops / 1e9:7.1f} GFLOP ({bflops / routed:5.1f}x "
                f"routed), temporaries {btemp / 2**30:5.2f} GiB"
            )
        print(line, flush=True)
        forwards[impl] = (compiled, layer)
    outs = {impl: np.asarray(c(m, x)) for impl, (c, m) in forwards.items()}  # also warms up
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


if __name__ == "__main__":
    main()
