"""SFT data: expert demonstrations -> examples -> shuffled, length-bucketed grain batches.

    examples, stats = demonstration_examples(trajs, "episode", pad_id=tok.pad_token_id)
    data = SftDataset(examples, SftDataConfig(batch_size=16, num_epochs=2, seed=0), pad_id)
    it = data.iterator()
    for batch in it:                       # {"tokens", "mask", "loss_mask"}: [B, T] each
        state, metrics = learner.sft_step(state, batch)
    saved = it.get_state()                 # JSON-able; data.iterator(saved) resumes exactly there

Examples. A demonstration is a ``Trajectory`` played by the env's expert through the same context
builder as the policy (``RolloutWorker.run(..., expert=True)``), so the ids are exactly those the
policy will read and write. Its rows are built by ``trajectory.episode_rows`` (whole-episode mode:
one row per episode) or ``trajectory.step_rows`` (step-wise: one row per step, its full context then
its action), the same layout the RL batch uses, and cut to their real length. The loss mask is 1 on
the agent's (expert's) action tokens only, the closing stop token included; the system prompt and
the environment's text are context, never targets.

Batching: bucketing, not packing. Each batch is padded on the right to the smallest length in a
fixed list of buckets that holds its longest row, and to ``batch_size`` rows (filler rows have an
all-zero mask and loss mask, so they add nothing to the token-mean loss). The jitted ``sft_step``
therefore compiles once per bucket, never per batch. Packing several episodes into one row would
waste less padding, but our model has no segment ids: attention would cross from one episode into
the next, so it is not offered.

Order: grain shuffles the examples with the seed, a fresh permutation each epoch (grain derives
epoch e's permutation from ``seed + e``); batches never straddle two epochs, so every epoch sees
every example exactly once. With ``group_by_length=W`` each window of W batches' worth of
shuffled examples is sorted by length before it is cut into batches, and the epoch's batches are
then shuffled (numpy, the seed's SFT-epoch stream, ``rng_streams.SFT_EPOCH``): much less padding,
still a random order.

Resuming: the pipeline is index-based (``grain.MapDataset``; batch i is a pure function of the
seed and i), so an iterator's state is just the next batch index: ``get_state()`` /
``set_state()`` (or ``iterator(state)``) resume mid-epoch with exactly the batches an
uninterrupted run would have seen.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import grain
import numpy as np

from agentrl_jax.rl import rng_streams
from agentrl_jax.rollout.trajectory import Trajectory, episode_rows, step_rows
from agentrl_jax.sampling import buckets as bk

CONTEXT_MODES = ("episode", "step")
# The sampler's rule, powers of two and the halfway points between them (64, 96, 128, ...,
# 2048): a row is padded by less than a third.
DEFAULT_BUCKETS = bk.default_buckets(64, 2048)
BATCH_KEYS = ("tokens", "mask", "loss_mask")


@dataclasses.dataclass(frozen=True)
class SftDataConfig:
    """How demonstrations are batched.

    Attributes:
      batch_size: rows per batch (a short last batch of an epoch is filled with empty rows).
      buckets: the row lengths a batch may be padded to, strictly increasing; the largest bounds
        every example.
      num_epochs: passes over the examples; None repeats forever.
      seed: the shuffle seed (0 <= seed < 2**32).
      shuffle: False keeps the examples' order (tests, evaluation of the SFT loss).
      drop_remainder: drop each epoch's short last batch instead of filling it.
      group_by_length: 0 or 1: batches are drawn from the shuffled order as it is. W > 1: each
        window of W batches' worth of shuffled examples is sorted by length before it is cut
        into batches (then the batches of the epoch are shuffled), so rows of a batch have
        similar lengths and less padding; the order stays random across windows.
      read_threads: threads that build batches ahead of the trainer (0: build on demand).
      prefetch: batches built ahead at most (grain's default of 500 would hold hundreds of
        padded batches in memory and compete with the update for the CPU).
    """

    batch_size: int = 16
    buckets: tuple[int, ...] = DEFAULT_BUCKETS
    num_epochs: int | None = 1
    seed: int = 0
    shuffle: bool = True
    drop_remainder: bool = False
    group_by_length: int = 0
    read_threads: int = 1
    prefetch: int = 4

    def __post_init__(self):
        if self.batch_size < 1:
            raise ValueError(f"SftDataConfig.batch_size is {self.batch_size}; expected >= 1")
        buckets = tuple(self.buckets)
        if not buckets or any(b < 2 for b in buckets):
            raise ValueError(
                f"SftDataConfig.buckets is {buckets}; expected a non-empty list of lengths >= 2"
            )
        if any(a >= b for a, b in zip(buckets, buckets[1:])):
            raise ValueError(f"SftDataConfig.buckets is {buckets}; expected strictly increasing")
        if self.num_epochs is not None and self.num_epochs < 1:
            raise ValueError(
                f"SftDataConfig.num_epochs is {self.num_epochs}; expected >= 1 or None (forever)"
            )
        if self.group_by_length < 0:
            raise ValueError(
                f"SftDataConfig.group_by_length is {self.group_by_length}; expected >= 0 "
                "(0 or 1: off; W: sort windows of W batches by length)"
            )
        if self.read_threads < 0 or self.prefetch < 0:
            raise ValueError(
                f"SftDataConfig.read_threads={self.read_threads} and prefetch={self.prefetch}: "
                "expected >= 0"
            )
        if not 0 <= self.seed < 2**32:
            raise ValueError(f"SftDataConfig.seed is {self.seed}; expected 0 <= seed < 2**32")


@dataclasses.dataclass(frozen=True)
class DemoStats:
    """What ``demonstration_examples`` kept and left out.

    Attributes:
      trajectories: demonstrations given.
      used: demonstrations turned into examples.
      infra_failures: left out, lost to the actor pool.
      not_won: left out, the expert did not win (step limit, context truncation, dead end).
      examples: rows produced (one per episode, or one per step).
      action_tokens: tokens with loss (sum of the loss masks).
      tokens: real tokens in all rows.
      max_len: the longest row.
    """

    trajectories: int
    used: int
    infra_failures: int
    not_won: int
    examples: int
    action_tokens: int
    tokens: int
    max_len: int


def demonstration_examples(
    trajs: Sequence[Trajectory],
    context_mode: str,
    *,
    pad_id: int,
    max_len: int | None = None,
    require_won: bool = True,
) -> tuple[list[dict[str, np.ndarray]], DemoStats]:
    """Turns demonstrations into unpadded examples with the RL batch's row layout.

    Args:
      trajs: expert trajectories (``RolloutWorker.run(..., expert=True)``).
      context_mode: 'episode' (one row per trajectory, ``episode_rows``) or 'step' (one row per
        step, ``step_rows``); use the mode the rollouts of the later RL phase use.
      pad_id: the tokenizer's pad id (only used while the rows are built; examples are unpadded).
      max_len: the longest row allowed (the largest bucket); a longer one is an error.
      require_won: leave out demonstrations the expert did not win (truncated ones included).

    Returns:
      (examples, stats). Each example is a dict: ``tokens`` [n] int32, ``loss_mask`` [n] float32
      (1 on the expert's action tokens).
    """
    if context_mode not in CONTEXT_MODES:
        raise ValueError(f"context_mode is {context_mode!r}; expected one of {CONTEXT_MODES}")
    rows_of = episode_rows if context_mode == "episode" else step_rows
    examples: list[dict[str, np.ndarray]] = []
    infra = not_won = used = 0
    for t, traj in enumerate(trajs):
        if traj.infra_failure:
            infra += 1
            continue
        if require_won and not traj.won:
            not_won += 1
            continue
        if not traj.steps:
            continue
        # Rows as wide as this trajectory needs: episode mode holds all its ids in one row.
        if context_mode == "episode":
            width = traj.num_tokens
        else:
            width = max(len(s.prompt_ids) + len(s.action_ids) for s in traj.steps)
        rows = rows_of([traj], width, pad_id)
        for r in range(rows.tokens.shape[0]):
            n = int(rows.mask[r].sum())
            if max_len is not None and n > max_len:
                raise ValueError(
                    f"demonstration {t} ({traj.task.name}) has a {n}-token row; the largest "
                    f"bucket holds {max_len} (raise SftDataConfig.buckets or lower "
                    "rollout.max_seq_len so demonstrations fit)"
                )
            examples.append(
                {"tokens": rows.tokens[r, :n].copy(), "loss_mask": rows.loss_mask[r, :n].copy()}
            )
        used += 1
    lengths = [len(e["tokens"]) for e in examples]
    stats = DemoStats(
        trajectories=len(trajs),
        used=used,
        infra_failures=infra,
        not_won=not_won,
        examples=len(examples),
        action_tokens=int(sum(e["loss_mask"].sum() for e in examples)),
        tokens=int(sum(lengths)),
        max_len=max(lengths, default=0),
    )
    return examples, stats


def bucket_for(length: int, buckets: Sequence[int]) -> int:
    """The smallest bucket >= ``length``; ValueError when none is."""
    for b in buckets:
        if b >= length:
            return b
    raise ValueError(f"a row of {length} tokens fits no bucket; buckets are {tuple(buckets)}")


def collate(
    examples: Sequence[dict[str, np.ndarray]],
    *,
    batch_size: int,
    buckets: Sequence[int],
    pad_id: int,
) -> dict[str, np.ndarray]:
    """Pads examples into one batch: [batch_size, bucket] arrays, right padding.

    Returns:
      ``tokens`` [B, T] int32 (pad_id on padding), ``mask`` [B, T] float32 (1 on real tokens),
      ``loss_mask`` [B, T] float32 (1 on action tokens); B = batch_size, T = the bucket of the
      longest example. Rows past ``len(examples)`` are empty (all masks 0).
    """
    if not 0 < len(examples) <= batch_size:
        raise ValueError(f"collate got {len(examples)} examples for a batch of {batch_size}")
    width = bucket_for(max(len(e["tokens"]) for e in examples), buckets)
    tokens = np.full((batch_size, width), pad_id, np.int32)
    mask = np.zeros((batch_size, width), np.float32)
    loss_mask = np.zeros((batch_size, width), np.float32)
    for r, e in enumerate(examples):
        n = len(e["tokens"])
        tokens[r, :n] = e["tokens"]
        mask[r, :n] = 1.0
        loss_mask[r, :n] = e["loss_mask"]
    return {"tokens": tokens, "mask": mask, "loss_mask": loss_mask}


class SftDataset:
    """The grain pipeline: source -> shuffle(seed) -> batch(collate to a bucket) -> repeat(epochs).

    Args:
      examples: from ``demonstration_examples``.
      config: SftDataConfig.
      pad_id: the tokenizer's pad id.
    """

    def __init__(
        self, examples: Sequence[dict[str, np.ndarray]], config: SftDataConfig, pad_id: int
    ):
        if not examples:
            raise ValueError(
                "SftDataset got no examples: every demonstration was left out (see DemoStats: "
                "infra failures, or games the expert did not win)"
            )
        longest = max(len(e["tokens"]) for e in examples)
        if longest > config.buckets[-1]:
            raise ValueError(
                f"the longest example has {longest} tokens; SftDataConfig.buckets "
                f"{config.buckets} stop at {config.buckets[-1]}"
            )
        self.examples = list(examples)
        self.config = config
        self.pad_id = pad_id
        self._collate = functools.partial(
            collate, batch_size=config.batch_size, buckets=config.buckets, pad_id=pad_id
        )
        if config.group_by_length > 1:
            self.dataset = self._grouped_dataset()
            return
        ds = grain.MapDataset.source(self.examples)
        if config.shuffle:
            ds = ds.shuffle(seed=config.seed)
        ds = ds.batch(
            config.batch_size, drop_remainder=config.drop_remainder, batch_fn=self._collate
        )
        self._check_batches(len(ds))
        self.batches_per_epoch = len(ds)
        # Batching before repeating keeps every batch inside one epoch; grain's shuffle draws a
        # new permutation for each epoch (its index space continues past the first epoch).
        self.dataset: grain.MapDataset = ds.repeat(config.num_epochs)

    def _check_batches(self, count: int) -> None:
        if count == 0:
            raise ValueError(
                f"{len(self.examples)} examples make no batch of {self.config.batch_size} with "
                "drop_remainder=True; lower SftDataConfig.batch_size"
            )

    def _grouped_dataset(self) -> grain.MapDataset:
        """Length-grouped batches, still index-based: batch i of the run is a pure function of
        (seed, i), so the iterator state stays the next index and resuming stays exact."""
        cfg = self.config
        n, b = len(self.examples), cfg.batch_size
        self.batches_per_epoch = n // b if cfg.drop_remainder else -(-n // b)
        self._check_batches(self.batches_per_epoch)
        self._lengths = np.asarray([len(e["tokens"]) for e in self.examples])
        self._plans: dict[int, list[np.ndarray]] = {}
        ds = grain.MapDataset.range(self.batches_per_epoch).repeat(cfg.num_epochs)
        return ds.map_with_index(lambda i, _: self._grouped_batch(i))

    def _epoch_plan(self, epoch: int) -> list[np.ndarray]:
        """The batches (example indices) of one epoch: shuffle, sort windows, cut, shuffle."""
        plan = self._plans.get(epoch)
        if plan is None:
            cfg = self.config
            rng = rng_streams.numpy_rng(cfg.seed, rng_streams.SFT_EPOCH, epoch)
            n, b = len(self.examples), cfg.batch_size
            order = rng.permutation(n) if cfg.shuffle else np.arange(n)
            window = b * cfg.group_by_length
            batches = []
            for start in range(0, n, window):
                chunk = order[start : start + window]
                chunk = chunk[np.argsort(self._lengths[chunk], kind="stable")]
                batches += [chunk[k : k + b] for k in range(0, len(chunk), b)]
            if cfg.drop_remainder:
                batches = [x for x in batches if len(x) == b]
            if cfg.shuffle:
                batches = [batches[k] for k in rng.permutation(len(batches))]
            plan = batches
            # Reader threads may straddle an epoch boundary: keep this epoch and the one before
            # (a new dict each time, so a concurrent reader never sees a half-updated one).
            self._plans = {e: p for e, p in self._plans.items() if e == epoch - 1} | {epoch: plan}
        return plan

    def _grouped_batch(self, index: int) -> dict[str, np.ndarray]:
        epoch, k = divmod(index, self.batches_per_epoch)
        return self._collate([self.examples[i] for i in self._epoch_plan(epoch)[k]])

    def __len__(self) -> int:
        """Batches in all epochs (sys.maxsize when repeating forever)."""
        return len(self.dataset)

    def iterator(self, state: dict[str, Any] | None = None) -> grain.DatasetIterator:
        """A fresh iterator over the batches, or one resumed from ``get_state()`` of another."""
        options = grain.ReadOptions(
            num_threads=self.config.read_threads, prefetch_buffer_size=self.config.prefetch
        )
        it = self.dataset.to_iter_dataset(options).__iter__()
        if state is not None:
            it.set_state(state)
        return it

    def bucket_counts(self) -> dict[int, int]:
        """How many batches of one epoch fall in each bucket (one compile per bucket used)."""
        counts: dict[int, int] = {}
        for i in range(self.batches_per_epoch):
            width = self.dataset[i]["tokens"].shape[1]
            counts[width] = counts.get(width, 0) + 1
        return dict(sorted(counts.items()))


__all__ = [
    "DEFAULT_BUCKETS",
    "DemoStats",
    "SftDataConfig",
    "SftDataset",
    "bucket_for",
    "collate",
    "demonstration_examples",
]
