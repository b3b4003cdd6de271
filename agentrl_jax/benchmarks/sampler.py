"""Sampler throughput against transformers' PyTorch ``generate``, same weights, same run.

    python -m launch.bench sampler --out bench_sampler.json

Workloads (tiny preset, f32, batch 32, sampling at temperature 1 with no EOS on either side so
both generate exactly the requested number of tokens):

- ``prefill_tokens_per_s``: one forward pass over 32 x 128 prompt tokens into a fresh cache
  (ours: ``step_turn`` with max_new_tokens=0; reference: the model call ``generate`` makes
  first, ``model(ids, use_cache=True, logits_to_keep=1)``), and ``prefill_fraction_of_peak``:
  prefill model FLOPs per second over ``matmul_peak_gflops`` (a jitted 2048^3 f32 matmul, this
  machine's practical peak). Each side counts the FLOPs it runs: ours runs the last layer's
  queries, attention output and MLP only at the position whose logits the turn needs.
- ``decode_tokens_per_s_cache_N`` (N = 64, 256, 1024, 2048): 32 rows x 32 new tokens after a
  prompt of N - 33 tokens, so the turn fills exactly N cache slots; decode time is
  t(33 tokens) - t(1 token) on each side, so prefill is not counted. ``decode_2048_over_64`` is
  each side's tokens/s at 2048 slots over its tokens/s at 64: how much a long context slows a
  decode step (1.0: not at all). ``decode_2048_over_64_read_bound`` is the most that ratio can be
  here: our step at 64 slots plus the time a jitted sum takes to read the extra slots' keys and
  values (4 layers, 32 rows: 268 MB in f32 at 2048 slots).
- ``multi_turn_episodes_per_s``: 32 episodes of 8 turns, each 64 observation tokens then 16
  action tokens; ``long_episode_episodes_per_s``: shaped like ALFWorld, 32 episodes of 30
  turns of 48 + 12 tokens (1,800 tokens of context by the end). Ours keeps the cache and
  prefills only the new observation; the reference passes the whole conversation to
  ``generate`` every turn, as a user of ``generate`` would.
- ``group_first_turn_rows_per_s``: the first turn (a 512-token prompt, then 16 action tokens)
  of 32 rows that are 4 tasks x 8 rollouts; ours prefills each task's prompt once (group prefix
  sharing), the reference is our own sampler with ``share_prefixes=False``.

Timing: each workload warms both sides up (compilation, allocation), then runs ours and the
reference alternately, ``repeats`` times each, so a change in the machine's load hits both
alike; rows report medians, with every run's seconds and the spread ((max - min) / median) in
the JSON. The machine's load average at the start and the end is recorded: read the figures
from a run on an idle machine.

The reference model is transformers' causal LM of the policy's family, loaded from a checkpoint
of our weights written by ``save_hf_checkpoint``; the run fails if its logits differ from ours by
over 1e-4.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import statistics
import tempfile
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from agentrl_jax.benchmarks.report import Report, Row, peak_rss_mb, timed
from agentrl_jax.models.config import ModelConfig, preset
from agentrl_jax.sampling import Sampler, SamplingParams
from agentrl_jax.sampling.testing import random_policy


@dataclasses.dataclass(frozen=True)
class Sizes:
    num_layers: int = 4  # the tiny preset's
    batch: int = 32
    prefill_len: int = 128
    decode_caches: tuple[int, ...] = (64, 256, 1024, 2048)
    decode_new: int = 33  # t(33) - t(1): 32 decode steps
    turns: int = 8
    obs_len: int = 64
    action_len: int = 16
    long_turns: int = 30
    long_obs: int = 48
    long_action: int = 12
    group: int = 8
    group_prompt: int = 512
    group_action: int = 16
    matmul_n: int = 2048
    repeats: int = 3  # timed runs of each side, alternating, after a warm-up


# Prompt tokens per untimed prefill turn when filling a long cache (bounds the prefill's memory).
_PREFILL_CHUNK = 512

QUICK = Sizes(
    num_layers=1,
    batch=4,
    prefill_len=16,
    decode_caches=(64, 128),
    decode_new=5,
    turns=2,
    obs_len=8,
    action_len=4,
    long_turns=3,
    long_obs=8,
    long_action=4,
    group=2,
    group_prompt=16,
    group_action=4,
    matmul_n=256,
    repeats=1,
)


@dataclasses.dataclass
class Runs:
    """Seconds of each timed run of one side of a workload."""

    seconds: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def spread(self) -> float:
        return (max(self.seconds) - min(self.seconds)) / self.median if self.median else 0.0


def interleaved(
    ours: Callable[[], object],
    reference: Callable[[], object],
    repeats: int,
    *,
    warmup: tuple[Callable[[], object], Callable[[], object]] | None = None,
) -> tuple[Runs, Runs]:
    """Warms both sides up, then times ours and the reference alternately ``repeats`` times.

    ``warmup`` replaces the full calls for the warm-up (e.g. a one-turn episode: it compiles and
    allocates the same, in a fraction of the time). A call that returns a float reports its own
    seconds (its untimed setup excluded); otherwise the whole call is timed.
    """
    for fn in warmup or (ours, reference):
        fn()
    ours_s, ref_s = [], []
    for _ in range(repeats):
        for fn, out in ((ours, ours_s), (reference, ref_s)):
            t0 = time.perf_counter()
            seconds = fn()
            out.append(seconds if isinstance(seconds, float) else time.perf_counter() - t0)
    return Runs(ours_s), Runs(ref_s)


def _row(name, amount, ours: Runs, ref: Runs, unit, **extra) -> Row:
    """A throughput row, ``amount`` units per run, with every run's seconds in the JSON."""
    return Row(
        name,
        amount / ours.median,
        amount / ref.median,
        unit,
        extra={
            "ours_s": [round(x, 5) for x in ours.seconds],
            "reference_s": [round(x, 5) for x in ref.seconds],
            "ours_spread": round(ours.spread, 3),
            "reference_spread": round(ref.spread, 3),
            **extra,
        },
    )


def run(quick: bool) -> Report:
    sizes = QUICK if quick else Sizes()
    load_start = os.getloadavg()
    cfg = preset("tiny", num_layers=sizes.num_layers)
    policy = random_policy(cfg, std=0.02)
    reference = _reference_model(policy)
    sampler = Sampler(policy, sampling=SamplingParams(temperature=1.0))
    rng = np.random.default_rng(0)
    report = Report("sampler")
    report.facts["weights_max_abs_logit_diff"] = _check_same_weights(policy, reference, cfg, rng)

    peak = _matmul_peak_gflops(sizes.matmul_n)
    report.add(Row("matmul_peak_gflops", peak, None, "GFLOP/s", extra={"n": sizes.matmul_n}))

    ours, ref = _prefill(sampler, reference, cfg, sizes, rng)
    tokens = sizes.batch * sizes.prefill_len
    shape = {"batch": sizes.batch, "prompt_len": sizes.prefill_len}
    report.add(_row("prefill_tokens_per_s", tokens, ours, ref, "tokens/s", **shape))
    # Each side's arithmetic: ours runs the last layer's queries, attention output and MLP at
    # the one position whose logits the turn needs; the reference runs them everywhere.
    ours_flops = _prefill_flops(cfg, sizes.batch, sizes.prefill_len, last_only=True)
    ref_flops = _prefill_flops(cfg, sizes.batch, sizes.prefill_len, last_only=False)
    report.add(
        Row(
            "prefill_fraction_of_peak",
            ours_flops / (peak * 1e9 * ours.median),
            ref_flops / (peak * 1e9 * ref.median),
            "fraction",
            extra={
                "target": 0.5,
                "ours_gflop": ours_flops / 1e9,
                "reference_gflop": ref_flops / 1e9,
            },
        )
    )

    decode = {}
    for slots in sizes.decode_caches:
        ours_s, ref_s = _decode(sampler, reference, cfg, sizes, slots, rng)
        tokens = sizes.batch * (sizes.decode_new - 1)
        row = _row(
            f"decode_tokens_per_s_cache_{slots}",
            tokens,
            ours_s,
            ref_s,
            "tokens/s",
            batch=sizes.batch,
            prompt_len=slots - sizes.decode_new,
            new_tokens=sizes.decode_new - 1,
        )
        decode[slots] = report.add(row)
    short, long = decode[min(decode)], decode[max(decode)]
    report.add(
        Row(
            f"decode_{max(decode)}_over_{min(decode)}",
            long.ours / short.ours,
            long.reference / short.reference,
            "fraction",
            extra={"target": 0.4},
        )
    )
    report.add(_decode_ratio_bound(cfg, sizes.batch, min(decode), max(decode), short.ours))

    for name, turns, obs_len, action_len, target in (
        ("multi_turn_episodes_per_s", sizes.turns, sizes.obs_len, sizes.action_len, 3.0),
        ("long_episode_episodes_per_s", sizes.long_turns, sizes.long_obs, sizes.long_action, 5.0),
    ):
        ours, ref = _multi_turn(
            sampler, reference, cfg, sizes, rng, turns=turns, obs_len=obs_len, action=action_len
        )
        shape = {"turns": turns, "obs_len": obs_len, "action_len": action_len}
        report.add(_row(name, sizes.batch, ours, ref, "episodes/s", target_ratio=target, **shape))

    ours, ref = _group_first_turn(policy, cfg, sizes, rng)
    report.add(
        _row(
            "group_first_turn_rows_per_s",
            sizes.batch,
            ours,
            ref,
            "rows/s",
            group=sizes.group,
            prompt_len=sizes.group_prompt,
            action_len=sizes.group_action,
            reference_is="our sampler with share_prefixes=False",
            target_ratio=3.0,
        )
    )
    ours, ref = _lora_multi_turn(policy, cfg, sizes, rng)
    report.add(
        _row(
            "lora_merged_multi_turn_episodes_per_s",
            sizes.batch,
            ours,
            ref,
            "episodes/s",
            turns=sizes.turns,
            obs_len=sizes.obs_len,
            action_len=sizes.action_len,
            lora_rank=_LORA_RANK,
            reference_is="our sampler on the LoRA model unmerged (adapters in every step)",
        )
    )
    import torch  # noqa: PLC0415 - torch is the test extra's; imported where it is needed

    report.facts.update(
        {
            "preset": "tiny" if not quick else "tiny (1 layer, quick)",
            "model_params": cfg.num_params,
            "jax_backend": jax.default_backend(),
            "torch_threads": torch.get_num_threads(),
            "repeats": sizes.repeats,
            "compilations": sampler.num_traces,
            "peak_rss_mb": round(peak_rss_mb(), 1),
            "load_average_start": [round(x, 2) for x in load_start],
            "load_average_end": [round(x, 2) for x in os.getloadavg()],
        }
    )
    return report


def _reference_model(policy, *, dtype=None, device: str = "cpu"):
    """transformers' causal LM of the policy's family from a checkpoint of the same weights, on
    torch ``device`` in torch ``dtype`` (default: the checkpoint's)."""
    import transformers  # noqa: PLC0415

    from agentrl_jax.models.hf_checkpoint import save_hf_checkpoint  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as tmp:
        save_hf_checkpoint(policy, tmp)
        kwargs = {} if dtype is None else {"dtype": dtype}
        model = transformers.AutoModelForCausalLM.from_pretrained(
            tmp, local_files_only=True, **kwargs
        )
    return model.to(device).eval()


def _check_same_weights(policy, reference, cfg: ModelConfig, rng) -> float:
    import torch  # noqa: PLC0415

    tokens = rng.integers(0, cfg.vocab_size, (2, 24))
    ours = np.asarray(policy(jnp.asarray(tokens, jnp.int32))[0])
    with torch.inference_mode():
        ref = reference(torch.from_numpy(tokens)).logits.float().numpy()
    diff = float(np.abs(ours - ref).max())
    if diff > 1e-4:
        raise RuntimeError(
            f"reference logits differ from ours by {diff} > 1e-4: not the same model"
        )
    return diff


def _matmul_peak_gflops(n: int) -> float:
    a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n), np.float32))
    matmul = jax.jit(lambda x, y: x @ y)
    seconds = timed(lambda: matmul(a, a).block_until_ready(), repeats=5, warmup=2)
    return 2 * n**3 / seconds / 1e9


def _cache_read_seconds(cfg: ModelConfig, batch: int, slots: int) -> tuple[float, int]:
    """Seconds a jitted sum takes to read the keys and values of every layer of a ``batch``-row
    cache of ``slots`` slots, and their bytes: what a decode step at that length must read."""
    shape = (batch, cfg.num_kv_heads, slots, cfg.head_dim)
    arrays = [jnp.full(shape, i, cfg.dtype) for i in range(2 * cfg.num_layers)]
    read = jax.jit(lambda xs: sum(x.sum() for x in xs))
    seconds = timed(lambda: read(arrays).block_until_ready(), repeats=5, warmup=2)
    return seconds, sum(x.nbytes for x in arrays)


def _decode_ratio_bound(cfg: ModelConfig, batch: int, short: int, long: int, short_tps: float):
    """The most ``decode_<long>_over_<short>`` can be on this machine: a step at ``long`` slots
    costs at least the step at ``short`` slots plus reading the extra slots' keys and values at
    the speed a plain sum reads memory here. (A step whose attention read the cache at that speed
    and did nothing else extra would reach it.)"""
    read_long, nbytes = _cache_read_seconds(cfg, batch, long)
    read_short, _ = _cache_read_seconds(cfg, batch, short)
    step_short = batch / short_tps  # one decode step: a token for every row
    extra_read = max(read_long - read_short, 0.0)
    return Row(
        f"decode_{long}_over_{short}_read_bound",
        step_short / (step_short + extra_read),
        None,
        "fraction",
        extra={
            "cache_mb": round(nbytes / 1e6, 1),
            "read_ms": round(read_long * 1e3, 4),
            "read_gb_per_s": round(nbytes / read_long / 1e9, 1),
            "extra_read_ms": round(extra_read * 1e3, 4),
            "step_ms_short": round(step_short * 1e3, 4),
        },
    )


def _prefill_flops(cfg: ModelConfig, batch: int, prompt_len: int, *, last_only: bool) -> float:
    """Model FLOPs of a prefill of ``batch`` x ``prompt_len`` tokens: projections and MLP, plus
    causal attention (the average token attends to (P + 1) / 2 keys). The LM head is not
    counted: a prefill needs it at one position. With ``last_only`` the last layer computes keys
    and values everywhere but everything else at each row's last position only."""
    if cfg.num_experts:
        raise ValueError(
            f"FLOPs are counted for dense MLPs; a model with routed experts (num_experts="
            f"{cfg.num_experts}) is not counted here"
        )
    d, f, n, k, h = (
        cfg.hidden_size,
        cfg.intermediate_size,
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.head_dim,
    )
    kv_params = 2 * d * k * h
    query_params = 2 * d * n * h + 3 * d * f  # q and o projections, MLP
    tokens = batch * prompt_len
    per_layer = (
        2 * tokens * (kv_params + query_params) + 2 * 2 * n * h * tokens * (prompt_len + 1) / 2
    )
    if not last_only:
        return cfg.num_layers * per_layer
    last = 2 * tokens * kv_params + batch * (2 * query_params + 2 * 2 * n * h * prompt_len)
    return (cfg.num_layers - 1) * per_layer + last


def _random_rows(rng, cfg: ModelConfig, batch: int, length: int) -> np.ndarray:
    return rng.integers(0, cfg.vocab_size, (batch, length)).astype(np.int32)


def _generate_ref(reference, ids_np, new_tokens: int, cache=None):
    """transformers' ``generate``; with ``cache`` (holding all but the last ids) only the last
    id is prefilled."""
    import torch  # noqa: PLC0415

    ids = torch.from_numpy(ids_np.astype(np.int64)).to(reference.device)
    kwargs = {} if cache is None else {"cache": cache}
    with torch.inference_mode():
        return reference.generate(
            input_ids=ids,
            **kwargs,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            pad_token_id=0,
            eos_token_id=None,
        )


def _prefill(sampler: Sampler, reference, cfg, sizes: Sizes, rng) -> tuple[Runs, Runs]:
    import torch  # noqa: PLC0415

    prompts = _random_rows(rng, cfg, sizes.batch, sizes.prefill_len)
    key = jax.random.key(0)

    def ours():
        cache = sampler.start(sizes.batch, sizes.prefill_len)
        jax.block_until_ready(sampler.step_turn(cache, prompts, 0, key).cache)

    ids = torch.from_numpy(prompts.astype(np.int64))

    def ref():
        with torch.inference_mode():
            reference(ids, attention_mask=torch.ones_like(ids), use_cache=True, logits_to_keep=1)

    return interleaved(ours, ref, sizes.repeats)


def _decode(sampler: Sampler, reference, cfg, sizes: Sizes, slots: int, rng):
    """Decode seconds at ``slots`` cache slots: per repeat, t(decode_new) - t(1) on each side.

    Each timed call starts from a cache that already holds all but the last prompt token
    (filled untimed, ``_PREFILL_CHUNK`` tokens a turn on our side), feeds that token and
    generates: the difference of the two is ``decode_new - 1`` decode steps at ``slots``
    slots, with no prefill in either term.
    """
    import torch  # noqa: PLC0415

    prompts = _random_rows(rng, cfg, sizes.batch, slots - sizes.decode_new)
    held, last = prompts[:, :-1], prompts[:, -1:]

    def ours(new):
        cache = sampler.start(sizes.batch, slots)
        for start in range(0, held.shape[1], _PREFILL_CHUNK):
            chunk = held[:, start : start + _PREFILL_CHUNK]
            cache = sampler.step_turn(cache, chunk, 0, jax.random.key(0)).cache
        jax.block_until_ready(cache)
        t0 = time.perf_counter()
        sampler.step_turn(cache, last, new, jax.random.key(new)).tokens.block_until_ready()
        return time.perf_counter() - t0

    ids = torch.from_numpy(prompts.astype(np.int64))

    def ref(new):
        with torch.inference_mode():
            cache = reference(ids[:, :-1], use_cache=True)["cache"]
        t0 = time.perf_counter()
        _generate_ref(reference, prompts, new, cache=cache)
        return time.perf_counter() - t0

    runs = [
        interleaved(lambda n=n: ours(n), lambda n=n: ref(n), sizes.repeats)
        for n in (sizes.decode_new, 1)
    ]
    (ours_n, ref_n), (ours_1, ref_1) = runs
    return (
        Runs([a - b for a, b in zip(ours_n.seconds, ours_1.seconds)]),
        Runs([a - b for a, b in zip(ref_n.seconds, ref_1.seconds)]),
    )


def _multi_turn(
    sampler: Sampler, reference, cfg, sizes: Sizes, rng, *, turns: int, obs_len: int, action: int
) -> tuple[Runs, Runs | None]:
    """``sizes.batch`` episodes of ``turns`` turns, ours against ``generate`` on the whole
    conversation each turn (``reference=None``: ours alone, the second result None)."""
    obs = [_random_rows(rng, cfg, sizes.batch, obs_len) for _ in range(turns)]
    size = turns * (obs_len + action)

    def ours(num_turns=turns):
        _play(sampler, obs[:num_turns], action, size)

    def ref(num_turns=turns):
        conversation = np.zeros((sizes.batch, 0), np.int32)
        for turn in range(num_turns):
            conversation = np.concatenate([conversation, obs[turn]], axis=1)
            conversation = _generate_ref(reference, conversation, action).cpu().numpy()

    if reference is None:  # ours alone (no reference on this device)
        ours_only, _ = interleaved(ours, lambda: 0.0, sizes.repeats, warmup=(ours,))
        return ours_only, None
    # Warm-up: our episode compiles every cache bucket it reaches; the reference allocates.
    return interleaved(ours, ref, sizes.repeats, warmup=(ours, lambda: ref(1)))


# LoRA rank of the merged-against-unmerged sampler workload (every projection adapted).
_LORA_RANK = 16


def _lora_multi_turn(policy, cfg, sizes: Sizes, rng) -> tuple[Runs, Runs]:
    """The multi-turn episodes of a LoRA policy (rank ``_LORA_RANK`` on every projection, B
    nonzero): ours samples from its merged copy (``lora.merge``, what a run's sampler gets), the
    reference from the LoRA model itself (each projection adds its adapters' product)."""
    from agentrl_jax.models import lora  # noqa: PLC0415

    adapted = lora.apply_lora(policy, lora.LoraConfig(rank=_LORA_RANK, alpha=32.0), seed=1)
    values = nnx.state(adapted, nnx.LoRAParam)
    nnx.update(adapted, jax.tree.map(lambda x: x + 0.01, values))  # B off zero: a trained adapter
    merged = lora.merge(adapted, cfg.dtype)
    samplers = [Sampler(m, sampling=SamplingParams(temperature=1.0)) for m in (merged, adapted)]
    obs = [_random_rows(rng, cfg, sizes.batch, sizes.obs_len) for _ in range(sizes.turns)]
    size = sizes.turns * (sizes.obs_len + sizes.action_len)

    merged, unmerged = (functools.partial(_play, s, obs, sizes.action_len, size) for s in samplers)
    return interleaved(merged, unmerged, sizes.repeats)


def _play(sampler: Sampler, obs: list[np.ndarray], action: int, size: int) -> None:
    """One batch of episodes, a turn per ``obs`` entry: each turn prefills its [B, T] new ids
    and samples ``action`` tokens, in a cache of ``size`` slots kept across the turns."""
    cache = sampler.start(obs[0].shape[0], size)
    for turn, new_ids in enumerate(obs):
        out = sampler.step_turn(cache, new_ids, action, jax.random.key(turn))
        np.asarray(out.tokens)  # the actions go to the environments on the host
        cache = out.cache


def _group_first_turn(policy, cfg, sizes: Sizes, rng) -> tuple[Runs, Runs]:
    """The first turn of ``batch`` rows, ``group`` rollouts per task, with and without sharing."""
    tasks = _random_rows(rng, cfg, sizes.batch // sizes.group, sizes.group_prompt)
    prompts = np.repeat(tasks, sizes.group, axis=0)
    size = sizes.group_prompt + sizes.group_action
    samplers = [
        Sampler(policy, sampling=SamplingParams(temperature=1.0), share_prefixes=share)
        for share in (True, False)
    ]

    def first_turn(sampler):
        out = sampler.step_turn(
            sampler.start(sizes.batch, size), prompts, sizes.group_action, jax.random.key(0)
        )
        np.asarray(out.tokens)

    shared, plain = samplers
    return interleaved(lambda: first_turn(shared), lambda: first_turn(plain), sizes.repeats)
