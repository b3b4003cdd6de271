"""The SFT data pipeline: bucketed grain batches vs the straightforward alternatives, same run.

    python -m launch.bench sft_data --out bench_sft_data.json

Workload: synthetic whole-episode demonstrations shaped like TextWorld games (2-8 steps, each an
observation of 30-150 tokens and a command of 4-10 tokens, the first step with a 60-token system
prompt), built into examples by ``demonstration_examples``.

- ``pipeline batches/s``: one epoch of ``SftDataset`` (grain shuffle, batch, collate to a
  bucket) against a plain Python loop written here (numpy permutation, pad each batch to the
  same bucket). Same batches, so this prices grain's bookkeeping.
- ``padding efficiency``: real tokens / padded tokens of one epoch, bucketed against padding
  every batch to one fixed width (the largest bucket any example needs: the other way to
  compile ``sft_step`` only once); the extra field gives it with ``group_by_length=8`` too.
- ``sft_step real tokens/s``: steady-state SFT updates of the tiny model (a smaller one with
  ``quick``) over one epoch, bucketed against the fixed width; every shape is compiled before
  timing, and the compile count of each side is reported.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np
import optax
from flax import nnx

from agentrl_jax.benchmarks.report import Report, Row, peak_rss_mb
from agentrl_jax.envs.base import Task
from agentrl_jax.rl.sft_data import (
    DEFAULT_BUCKETS,
    SftDataConfig,
    SftDataset,
    bucket_for,
    demonstration_examples,
)
from agentrl_jax.rollout.trajectory import Step, Trajectory

VOCAB = 2048


def synthetic_demos(n: int, seed: int = 0, max_steps: int = 8) -> list[Trajectory]:
    """Won whole-episode demonstrations with TextWorld-like step and token counts."""
    rng = np.random.default_rng(seed)
    demos = []
    for i in range(n):
        steps = []
        for s in range(int(rng.integers(min(2, max_steps), max_steps + 1))):
            prompt = int(rng.integers(30, 151)) + (60 if s == 0 else 0)
            action = int(rng.integers(4, 11))
            steps.append(
                Step(
                    prompt_ids=rng.integers(3, VOCAB, prompt).tolist(),
                    action_ids=rng.integers(3, VOCAB, action).tolist(),
                    action_logprobs=[0.0] * action,
                )
            )
        demos.append(Trajectory(Task("synthetic", "train", str(i)), i, steps=steps, won=True))
    return demos


def reference_epoch(examples, batch_size: int, buckets, pad_id: int, seed: int):
    """The plain loop: permute, then pad each batch of examples to its bucket, row by row."""
    order = np.random.default_rng(seed).permutation(len(examples))
    for start in range(0, len(order), batch_size):
        chunk = [examples[i] for i in order[start : start + batch_size]]
        width = bucket_for(max(len(e["tokens"]) for e in chunk), buckets)
        tokens = np.full((batch_size, width), pad_id, np.int32)
        mask = np.zeros((batch_size, width), np.float32)
        loss = np.zeros((batch_size, width), np.float32)
        for r, e in enumerate(chunk):
            n = len(e["tokens"])
            tokens[r, :n], mask[r, :n], loss[r, :n] = e["tokens"], 1.0, e["loss_mask"]
        yield {"tokens": tokens, "mask": mask, "loss_mask": loss}


def _fixed_width(batch, width: int, pad_id: int):
    out = {}
    for k, v in batch.items():
        padded = np.full((v.shape[0], width), pad_id if k == "tokens" else 0, v.dtype)
        padded[:, : v.shape[1]] = v
        out[k] = padded
    return out


def _time_epoch(fn, batches) -> float:
    t0 = time.perf_counter()
    for b in batches:
        out = fn(b)
    jax.block_until_ready(out)
    return time.perf_counter() - t0


def run(quick: bool) -> Report:
    from agentrl_jax.models import preset, registry  # noqa: PLC0415
    from agentrl_jax.rl.learner import Learner  # noqa: PLC0415

    report = Report("sft_data")
    # Quick: short episodes and two buckets, so few shapes compile (a plumbing check only).
    n_demos, batch_size, max_steps = (24, 4, 2) if quick else (1024, 16, 8)
    buckets = (128, 512) if quick else DEFAULT_BUCKETS
    demos = synthetic_demos(n_demos, max_steps=max_steps)
    t0 = time.perf_counter()
    examples, stats = demonstration_examples(demos, "episode", pad_id=0)
    build_s = time.perf_counter() - t0
    cfg = SftDataConfig(batch_size=batch_size, buckets=buckets, num_epochs=1, seed=0)
    data = SftDataset(examples, cfg, pad_id=0)

    # Pipeline throughput: the median of three epochs each.
    ours = sorted(_epoch_seconds(lambda: list(data.iterator())) for _ in range(3))[1]
    ref = sorted(
        _epoch_seconds(lambda: list(reference_epoch(examples, batch_size, cfg.buckets, 0, 0)))
        for _ in range(3)
    )[1]
    nb = data.batches_per_epoch
    report.add(
        Row(
            "pipeline batches/s",
            nb / ours,
            nb / ref,
            "batches/s",
            extra={"examples": len(examples), "batch_size": batch_size, "build_s": build_s},
        )
    )

    # Padding: real tokens over the padded area, bucketed vs one fixed width.
    batches = list(data.iterator())
    real = sum(float(b["mask"].sum()) for b in batches)
    ours_area = sum(b["tokens"].size for b in batches)
    fixed = bucket_for(stats.max_len, cfg.buckets)
    report.add(
        Row(
            "padding efficiency",
            real / ours_area,
            real / (len(batches) * batch_size * fixed),
            "real/padded tokens",
            extra={
                "buckets_used": data.bucket_counts(),
                "fixed_width": fixed,
                "ours_group_by_length_8": _efficiency(examples, cfg, group_by_length=8),
            },
        )
    )

    # SFT updates: steady state, every shape compiled first.
    # A model a few times smaller than the tiny preset: the fixed-width side at 2048 tokens
    # would take minutes per update on a laptop CPU; the padding waste does not depend on it.
    width, layers = (32, 1) if quick else (128, 2)
    model_cfg = preset(
        "tiny", vocab_size=VOCAB, hidden_size=width, intermediate_size=width * 2,
        num_layers=layers, num_heads=2, num_kv_heads=1, head_dim=width // 2,
    )  # fmt: skip
    policy = registry.family(model_cfg).policy(model_cfg, rngs=nnx.Rngs(0))
    learner = Learner(policy, None, optax.adam(1e-4))
    state = {"s": learner.init(policy)}

    def step(batch):
        state["s"], metrics = learner.sft_step(state["s"], batch)
        return metrics["sft/nll"]

    timed_batches = batches[: 2 if quick else 8]  # the same batches on both sides
    fixed_batches = [_fixed_width(b, fixed, 0) for b in timed_batches]
    seen = {}
    for b in timed_batches + fixed_batches[:1]:  # compile each shape once
        if b["tokens"].shape not in seen:
            seen[b["tokens"].shape] = step(b)
    timed_real = sum(float(b["mask"].sum()) for b in timed_batches)
    ours_s = _time_epoch(step, timed_batches)
    ref_s = _time_epoch(step, fixed_batches)
    report.add(
        Row(
            "sft_step real tokens/s",
            timed_real / ours_s,
            timed_real / ref_s,
            "tokens/s",
            extra={
                "compiles_bucketed": len({b["tokens"].shape for b in batches}),
                "compiles_fixed": 1,
                "model": f"hidden {width}, {layers} layers",
                "batches": len(timed_batches),
            },
        )
    )
    report.facts["peak_rss_mb"] = peak_rss_mb()
    report.facts["demonstrations"] = stats.used
    report.facts["mean_example_tokens"] = stats.tokens / max(stats.examples, 1)
    return report


def _efficiency(examples, cfg: SftDataConfig, **changes) -> float:
    """Real / padded tokens of one epoch with some settings changed."""
    data = SftDataset(examples, dataclasses.replace(cfg, **changes), pad_id=0)
    batches = list(data.iterator())
    return sum(float(b["mask"].sum()) for b in batches) / sum(b["tokens"].size for b in batches)


def _epoch_seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0
