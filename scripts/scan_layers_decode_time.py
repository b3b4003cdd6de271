"""Decode step time of the sampler with unrolled vs scanned decoder layers (same weights).

    PYTHONPATH=. python scripts/scan_layers_decode_time.py [--preset tiny] [--batch 32]

A decode step's time is (t(1 + N new tokens) - t(1 new token)) / N for one turn into a fresh
cache of ``--cache`` slots after a ``--prompt``-token prompt, so prefill is not counted; the two
models alternate ``--repeats`` times. Both wall-clock and process CPU seconds (all threads) are
reported: on a shared machine CPU seconds are the steadier measure of the work done. Not a
test: a measurement.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import numpy as np

from agentrl_jax.models.config import preset
from agentrl_jax.models.decoder import CausalLM, unroll_layers
from agentrl_jax.models.testing import random_model
from agentrl_jax.sampling import Sampler, SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--layers", type=int, default=0, help="override num_layers (0: preset's)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--cache", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    overrides = {"num_layers": args.layers} if args.layers else {}
    cfg = preset(args.preset, scan_layers=True, **overrides)
    scanned = random_model(CausalLM, cfg, std=0.08)
    unrolled = unroll_layers(scanned)  # the same weights
    rng = np.random.RandomState(0)
    prompts = rng.randint(3, cfg.vocab_size, (args.batch, args.prompt)).tolist()
    key = jax.random.key(0)
    greedy = SamplingParams(temperature=0.0)

    def turn(sampler: Sampler, new: int):
        cache = sampler.start(args.batch, args.cache)
        jax.block_until_ready(cache)
        t0, c0 = time.perf_counter(), time.process_time()
        out = sampler.step_turn(cache, prompts, new, key, sampling=greedy)
        jax.block_until_ready(out.tokens)
        return (time.perf_counter() - t0, time.process_time() - c0), out

    samplers = {"unrolled": Sampler(unrolled), "scanned": Sampler(scanned)}
    outs = {}
    for name, sampler in samplers.items():  # warm-up: compile both turn lengths
        turn(sampler, 1)
        outs[name] = turn(sampler, 1 + args.new)[1]
    same = np.array_equal(np.asarray(outs["unrolled"].tokens), np.asarray(outs["scanned"].tokens))
    steps = {(name, clock): [] for name in samplers for clock in ("wall", "cpu")}
    for _ in range(args.repeats):
        for name, sampler in samplers.items():
            short, _ = turn(sampler, 1)
            long, _ = turn(sampler, 1 + args.new)
            for i, clock in enumerate(("wall", "cpu")):
                steps[name, clock].append((long[i] - short[i]) / args.new)
    print(
        f"{args.preset} ({cfg.num_layers} layers), batch {args.batch}, prompt {args.prompt}, "
        f"{args.new} decode steps, cache {args.cache}; same greedy tokens: {same}"
    )
    for (name, clock), values in steps.items():
        ms = [1e3 * v for v in values]
        print(
            f"  {name:9s} decode step, {clock:4s}: median {statistics.median(ms):.3f} ms, "
            f"min {min(ms):.3f} ms (runs: {', '.join(f'{m:.2f}' for m in ms)})"
        )
    for clock in ("wall", "cpu"):
        for stat in (statistics.median, min):
            ratio = stat(steps["scanned", clock]) / stat(steps["unrolled", clock])
            print(f"  scanned / unrolled, {clock} {stat.__name__}: {ratio:.3f}")


if __name__ == "__main__":
    main()
