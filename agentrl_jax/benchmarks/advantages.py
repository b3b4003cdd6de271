"""Advantage estimators vs the straightforward Python loops papers print, in the same run.

    python -m launch.bench advantages --out bench_advantages.json

Workloads: step-level estimators (grpo, rloo, gigpo, gagpo) on 4096 trajectories x 64 steps in
rollout groups of 8; token-level estimators (gae, reinforce_pp) on 512 rows x 4096 tokens. Ours
is the registered estimator called as the trainer calls it (host checks + jitted kernel, after
one warm-up compile, inputs already on the device, ``block_until_ready``; median of 21 calls).
The reference is the straightforward Python loop as papers print it: per trajectory, over the
batch's float32 numpy arrays, one element indexed at a time (``rewards[i, k]``), median of 3
runs. Where the full-size loop would take long, it runs on the first rows (1024 trajectories,
whole groups; 64 token rows for gae) and its time is scaled linearly to the full batch; the
row's extra fields say so (``reference_rows``, ``reference_scale``) and name the loop's form
(``reference_form``). REINFORCE++ whitens over the whole batch, so its loop runs on every row.
Each row also reports the largest |ours - reference| on the rows the reference ran, and bytes
moved per second (array bytes read + written) against the measured memory bandwidth.
"""

from __future__ import annotations

import time

import jax
import numpy as np

from agentrl_jax import kernels
from agentrl_jax.benchmarks.report import Report, Row, peak_rss_mb, timed

GROUP = 8


def memory_bandwidth(n_bytes: int) -> float:
    """Bytes per second of a large numpy copy (read + write counted)."""
    src = np.ones(n_bytes // 8, np.float64)
    dst = np.empty_like(src)
    seconds = timed(lambda: np.copyto(dst, src), repeats=5)
    return 2 * src.nbytes / seconds


# ------------------------------------------------------------------------------- workloads


def step_workload(rng: np.random.Generator, b: int, s: int):
    """Ragged trajectories of one token per step; repeated states inside groups."""
    n = rng.integers(s // 2, s + 1, b)
    step_mask = (np.arange(s)[None, :] < n[:, None]).astype(np.int32)
    rewards = np.where(rng.random((b, s)) < 0.1, 0.1, 0.0).astype(np.float32)
    rewards[np.arange(b), n - 1] += rng.integers(0, 2, b).astype(np.float32)
    rewards *= step_mask
    group = np.arange(b) // GROUP
    # State at step t: one of 3 per (group, t), so states repeat across a group's rollouts.
    keys = group[:, None] * 1_000_000 + np.arange(s)[None, :] * 10 + rng.integers(0, 3, (b, s))
    keys[:, 0] = group * 1_000_000  # shared start state
    step_ids = np.where(step_mask > 0, np.arange(s)[None, :], -1).astype(np.int32)
    t0 = time.perf_counter()
    batch = kernels.make_batch(
        loss_mask=step_mask,
        step_ids=step_ids,
        rewards=rewards,
        step_mask=step_mask,
        group_ids=group,
        state_keys=keys,
    )
    make_s = time.perf_counter() - t0
    return batch, (rewards, step_mask, group, keys), make_s


def token_workload(rng: np.random.Generator, b: int, t: int):
    """Rows of alternating environment text and actions; one reward per action."""
    loss_mask = np.zeros((b, t), np.int32)
    step_ids = np.full((b, t), -1, np.int32)
    max_steps = t // 32 + 1
    rewards = np.zeros((b, max_steps), np.float32)
    step_mask = np.zeros((b, max_steps), np.int32)
    for row in range(b):
        pos, k = int(rng.integers(16, 64)), 0
        while pos < t and k < max_steps:
            end = min(pos + int(rng.integers(8, 40)), t)
            loss_mask[row, pos:end], step_ids[row, pos:end] = 1, k
            step_mask[row, k] = 1
            rewards[row, k] = 0.1 if rng.random() < 0.2 else 0.0
            pos, k = end + int(rng.integers(16, 64)), k + 1
        rewards[row, k - 1] += float(rng.integers(0, 2))
    values = rng.uniform(-1, 1, (b, t)).astype(np.float32)
    batch = kernels.make_batch(
        loss_mask=loss_mask,
        step_ids=step_ids,
        rewards=rewards,
        step_mask=step_mask,
        group_ids=np.arange(b) // GROUP,
    )
    return batch, (loss_mask, step_ids, rewards, values)


#
# ------------------------------------------------------------------------ Python references
#
# Written as papers print them: loops over the padded numpy arrays of the batch (float32, as
# the trainer holds them), indexing one element at a time (``rewards[i, k]``), one trajectory
# after another. Nothing is pre-converted to Python lists and nothing is vectorised.


def _length(step_mask, i):
    """Real steps of trajectory i (its step mask is a prefix of ones)."""
    return int(step_mask[i].sum())


def _normalize(xs, eps):
    """(x - mean) / (std + eps) with the unbiased std; 0 for a group of one.

    The statistics run in Python floats (float64), so the reference is the more exact side.
    """
    if len(xs) < 2:
        return [0.0] * len(xs)
    xs = [float(x) for x in xs]
    mean = sum(xs) / len(xs)
    std = (sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5
    return [(x - mean) / (std + eps) for x in xs]


def _groups(group):
    members = {}
    for i in range(len(group)):
        members.setdefault(group[i], []).append(i)
    return members


def _episode_return(rewards, step_mask, i):
    ret = 0.0
    for k in range(_length(step_mask, i)):
        ret += rewards[i, k]
    return ret


def _discounted(rewards, step_mask, i, gamma):
    n = _length(step_mask, i)
    out, g = [0.0] * n, 0.0
    for k in reversed(range(n)):
        g = rewards[i, k] + gamma * g
        out[k] = g
    return out


def ref_grpo(rewards, step_mask, group, keys, cfg):
    adv = np.zeros(rewards.shape, np.float32)
    for idx in _groups(group).values():
        returns = [_episode_return(rewards, step_mask, i) for i in idx]
        for i, a in zip(idx, _normalize(returns, cfg.eps)):
            for k in range(_length(step_mask, i)):
                adv[i, k] = a
    return adv


def ref_rloo(rewards, step_mask, group, keys, cfg):
    adv = np.zeros(rewards.shape, np.float32)
    for idx in _groups(group).values():
        returns = [_episode_return(rewards, step_mask, i) for i in idx]
        total = sum(returns)
        for i, r in zip(idx, returns):
            a = r - (total - r) / (len(idx) - 1) if len(idx) > 1 else 0.0
            for k in range(_length(step_mask, i)):
                adv[i, k] = a
    return adv


def ref_gigpo(rewards, step_mask, group, keys, cfg):
    adv = ref_grpo(rewards, step_mask, group, keys, cfg)
    returns = [_discounted(rewards, step_mask, i, cfg.gamma) for i in range(len(group))]
    anchors = {}
    for i in range(len(group)):
        for k in range(len(returns[i])):
            anchors.setdefault((group[i], keys[i, k]), []).append((i, k))
    for members in anchors.values():
        step = _normalize([returns[i][k] for i, k in members], cfg.eps)
        for (i, k), a in zip(members, step):
            adv[i, k] += cfg.step_weight * a
    return adv


def ref_gagpo(rewards, step_mask, group, keys, cfg):
    returns = [_discounted(rewards, step_mask, i, cfg.gamma) for i in range(len(group))]
    pools = {}
    for i in range(len(group)):
        for k in range(len(returns[i])):
            pools.setdefault((group[i], keys[i, k]), []).append(returns[i][k])
    value = {state: sum(g) / len(g) for state, g in pools.items()}
    adv = np.zeros(rewards.shape, np.float32)
    for idx in _groups(group).values():
        raw = []
        for i in idx:
            n, last = len(returns[i]), 0.0
            a = [0.0] * n
            for k in reversed(range(n)):
                v_next = value[(group[i], keys[i, k + 1])] if k + 1 < n else 0.0
                delta = rewards[i, k] + cfg.gamma * v_next - value[(group[i], keys[i, k])]
                last = delta + cfg.gamma * cfg.lam * last
                a[k] = last
            raw.append(a)
        flat = _normalize([x for a in raw for x in a], cfg.eps)
        for i, a in zip(idx, raw):
            for k in range(len(a)):
                adv[i, k] = flat[k]
            flat = flat[len(a) :]
    return adv


def ref_gae(loss_mask, step_ids, rewards, values, cfg):
    """The practitioner's-guide loop: reverse over tokens, skipping environment tokens."""
    b, t = loss_mask.shape
    adv = np.zeros((b, t), np.float32)
    for row in range(b):
        last_adv, next_value = 0.0, 0.0
        for k in reversed(range(t)):
            if loss_mask[row, k] == 0:
                continue
            last_token = k + 1 == t or step_ids[row, k + 1] != step_ids[row, k]
            r = rewards[row, step_ids[row, k]] if last_token else 0.0
            delta = r + cfg.gamma * next_value - values[row, k]
            last_adv = delta + cfg.gamma * cfg.lam * last_adv
            adv[row, k] = last_adv
            next_value = values[row, k]
    return adv


def ref_reinforce_pp(loss_mask, step_ids, rewards, values, cfg):
    """Token returns over agent tokens (environment tokens skipped), whitened over the batch."""
    b, t = loss_mask.shape
    ret = np.zeros((b, t), np.float32)
    flat = []
    for row in range(b):
        g = 0.0
        for k in reversed(range(t)):
            if loss_mask[row, k] == 0:
                continue
            last_token = k + 1 == t or step_ids[row, k + 1] != step_ids[row, k]
            g = (rewards[row, step_ids[row, k]] if last_token else 0.0) + cfg.gamma * g
            ret[row, k] = g
            flat.append(float(g))  # Batch statistics in float64: the exact side.
    mean = sum(flat) / len(flat)
    std = (sum((x - mean) ** 2 for x in flat) / (len(flat) - 1)) ** 0.5
    adv = np.zeros((b, t), np.float32)
    for row in range(b):
        for k in range(t):
            if loss_mask[row, k] != 0:
                adv[row, k] = (float(ret[row, k]) - mean) / (std + cfg.eps)
    return adv


# -------------------------------------------------------------------------------- the bench


def _timed_output(fn, repeats: int):
    """(median seconds, output of the last call) of ``fn()`` over ``repeats`` runs."""
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2], out


def _bytes(*arrays) -> int:
    return int(sum(np.asarray(a).nbytes for a in arrays if a is not None))


def _row(name, size, ours_s, ref_s, ref_rows, rows, moved, bandwidth, diff, extra=None):
    scale = rows / ref_rows
    return Row(
        workload=f"{name} ({size})",
        ours=ours_s * 1e3,
        reference=ref_s * scale * 1e3,
        unit="ms per batch",
        higher_is_better=False,
        extra={
            "reference_form": REFERENCE_FORM,
            "reference_rows": ref_rows,
            "reference_scale": scale,
            "reference_measured_ms": ref_s * 1e3,
            "bytes_moved": moved,
            "bytes_per_s": moved / ours_s,
            "fraction_of_memory_bandwidth": moved / ours_s / bandwidth,
            "max_abs_diff_vs_reference": diff,
            **(extra or {}),
        },
    )


REFERENCE_FORM = (
    "per-trajectory Python loop over the batch's float32 numpy arrays, one element indexed at a "
    "time (rewards[i, k]), as papers print it; group statistics in Python floats"
)


def run(quick: bool) -> Report:
    """Times every registered built-in estimator against its Python loop (medians of repeats)."""
    rng = np.random.default_rng(0)
    b_steps, s = (256, 16) if quick else (4096, 64)
    b_tok, t = (16, 512) if quick else (512, 4096)
    ref_step_rows, ref_tok_rows = (b_steps, b_tok) if quick else (1024, 64)
    ours_repeats, ref_repeats = (3, 1) if quick else (21, 3)
    report = Report("advantages")
    bandwidth = memory_bandwidth(16 << 20 if quick else 512 << 20)
    report.facts["memory_bandwidth_GBps"] = round(bandwidth / 1e9, 2)
    report.facts["devices"] = str(jax.devices())
    report.facts["reference_form"] = REFERENCE_FORM
    cfg = kernels.AdvantageConfig(gamma=0.95, lam=0.95)

    batch, host, make_s = step_workload(rng, b_steps, s)
    sub = tuple(a[:ref_step_rows] for a in host)  # Views: whole groups, no copy.
    for name, ref in (
        ("grpo", ref_grpo),
        ("rloo", ref_rloo),
        ("gigpo", ref_gigpo),
        ("gagpo", ref_gagpo),
    ):
        fn = kernels.get_advantage_estimator(name)
        out = jax.block_until_ready(fn(batch, cfg))  # Compiles; the timed calls below do not.
        ours_s = timed(lambda fn=fn: jax.block_until_ready(fn(batch, cfg)), repeats=ours_repeats)
        ref_s, ref_out = _timed_output(lambda ref=ref: ref(*sub, cfg), ref_repeats)
        diff = float(np.max(np.abs(np.asarray(out.steps)[: len(ref_out)] - ref_out)))
        moved = _bytes(batch.rewards, batch.step_mask, batch.group_ids, batch.state_ids)
        moved += _bytes(batch.loss_mask, batch.step_ids, out.tokens, out.steps)
        report.add(
            _row(
                name, f"{b_steps}x{s} steps", ours_s, ref_s, ref_step_rows, b_steps, moved,
                bandwidth, diff, {"make_batch_ms": make_s * 1e3},
            )
        )  # fmt: skip

    batch, host = token_workload(rng, b_tok, t)
    values = jax.device_put(host[3])  # The critic's output already lives on the device.
    for name, ref in (("gae", ref_gae), ("reinforce_pp", ref_reinforce_pp)):
        # REINFORCE++ whitens over the whole batch: its reference must see every row.
        rows = b_tok if name == "reinforce_pp" else ref_tok_rows
        sub = tuple(a[:rows] for a in host)
        fn = kernels.get_advantage_estimator(name)
        kw = {"values": values} if name == "gae" else {}
        out = jax.block_until_ready(fn(batch, cfg, **kw))
        ours_s = timed(
            lambda fn=fn, kw=kw: jax.block_until_ready(fn(batch, cfg, **kw)), repeats=ours_repeats
        )
        ref_s, ref_out = _timed_output(lambda ref=ref, sub=sub: ref(*sub, cfg), ref_repeats)
        diff = float(np.max(np.abs(np.asarray(out.tokens)[:rows] - ref_out)))
        moved = _bytes(batch.loss_mask, batch.step_ids, batch.rewards, out.tokens, out.returns)
        moved += _bytes(values) if name == "gae" else 0
        report.add(
            _row(name, f"{b_tok}x{t} tokens", ours_s, ref_s, rows, b_tok, moved, bandwidth, diff)
        )
    report.facts["peak_rss_mb"] = round(peak_rss_mb(), 1)
    return report
