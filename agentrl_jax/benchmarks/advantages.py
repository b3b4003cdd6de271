"""Advantage estimators vs the straightforward Python loops papers print, in the same run.

    python -m launch.bench advantages --out bench_advantages.json

Workloads: step-level estimators (grpo, rloo, gigpo, gagpo) on 4096 trajectories x 64 steps in
rollout groups of 8; token-level estimators (gae, reinforce_pp) on 512 rows x 4096 tokens. Ours
is the registered estimator called as the trainer calls it (host checks + jitted kernel, after
one warm-up compile); the reference is a per-trajectory Python loop over Python lists (the lists
are built before timing, so the loop pays for arithmetic only). Where the full-size loop would
take long, it runs on the first rows (1024 trajectories, whole groups; 64 token rows for gae) and
its time is scaled linearly to the full batch; the row's extra fields say so (``reference_rows``,
``reference_scale``). REINFORCE++ whitens over the whole batch, so its loop runs on every row.
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
    lists = [
        dict(
            group=int(group[i]), rewards=rewards[i, : n[i]].tolist(), keys=keys[i, : n[i]].tolist()
        )
        for i in range(b)
    ]
    return batch, lists, make_s


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
    lists = [
        dict(
            mask=loss_mask[i].tolist(),
            step=step_ids[i].tolist(),
            rewards=rewards[i].tolist(),
            values=values[i].tolist(),
        )
        for i in range(b)
    ]
    return batch, values, lists


# ------------------------------------------------------------------------ Python references


def _mean_std(xs):
    """Plain float arithmetic (``statistics.stdev`` is exact-rational, hence far slower)."""
    mean = sum(xs) / len(xs)
    return mean, (sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5


def _normalize(xs, eps=1e-6):
    if len(xs) < 2:
        return [0.0] * len(xs)
    mean, std = _mean_std(xs)
    return [(x - mean) / (std + eps) for x in xs]


def _by_group(trajs):
    groups = {}
    for i, t in enumerate(trajs):
        groups.setdefault(t["group"], []).append(i)
    return groups


def _discounted(rewards, gamma):
    out, g = [0.0] * len(rewards), 0.0
    for k in reversed(range(len(rewards))):
        g = rewards[k] + gamma * g
        out[k] = g
    return out


def ref_grpo(trajs, cfg):
    out = [None] * len(trajs)
    for idx in _by_group(trajs).values():
        for i, a in zip(idx, _normalize([sum(trajs[i]["rewards"]) for i in idx], cfg.eps)):
            out[i] = [a] * len(trajs[i]["rewards"])
    return out


def ref_rloo(trajs, cfg):
    out = [None] * len(trajs)
    for idx in _by_group(trajs).values():
        total = sum(sum(trajs[i]["rewards"]) for i in idx)
        for i in idx:
            r = sum(trajs[i]["rewards"])
            a = r - (total - r) / (len(idx) - 1) if len(idx) > 1 else 0.0
            out[i] = [a] * len(trajs[i]["rewards"])
    return out


def ref_gigpo(trajs, cfg):
    episode = ref_grpo(trajs, cfg)
    returns = [_discounted(t["rewards"], cfg.gamma) for t in trajs]
    anchors = {}
    for i, t in enumerate(trajs):
        for k, key in enumerate(t["keys"]):
            anchors.setdefault((t["group"], key), []).append((i, k))
    out = [list(e) for e in episode]
    for members in anchors.values():
        for (i, k), a in zip(members, _normalize([returns[i][k] for i, k in members], cfg.eps)):
            out[i][k] += cfg.step_weight * a
    return out


def ref_gagpo(trajs, cfg):
    returns = [_discounted(t["rewards"], cfg.gamma) for t in trajs]
    pools = {}
    for i, t in enumerate(trajs):
        for k, key in enumerate(t["keys"]):
            pools.setdefault((t["group"], key), []).append(returns[i][k])
    value = {key: sum(v) / len(v) for key, v in pools.items()}
    out = [None] * len(trajs)
    for idx in _by_group(trajs).values():
        raw = []
        for i in idx:
            t, n = trajs[i], len(trajs[i]["rewards"])
            adv, last = [0.0] * n, 0.0
            for k in reversed(range(n)):
                v_next = value[(t["group"], t["keys"][k + 1])] if k + 1 < n else 0.0
                delta = t["rewards"][k] + cfg.gamma * v_next - value[(t["group"], t["keys"][k])]
                last = delta + cfg.gamma * cfg.lam * last
                adv[k] = last
            raw.append(adv)
        flat = _normalize([a for adv in raw for a in adv], cfg.eps)
        for i, adv in zip(idx, raw):
            out[i], flat = flat[: len(adv)], flat[len(adv) :]
    return out


def ref_gae(rows, cfg):
    """The practitioner's-guide loop: reverse over tokens, skipping environment tokens."""
    out = []
    for row in rows:
        mask, step, values, rewards = row["mask"], row["step"], row["values"], row["rewards"]
        n = len(mask)
        adv = [0.0] * n
        last_adv, next_value = 0.0, 0.0
        for t in reversed(range(n)):
            if not mask[t]:
                continue
            last_token = t + 1 == n or step[t + 1] != step[t]
            r = rewards[step[t]] if last_token else 0.0
            delta = r + cfg.gamma * next_value - values[t]
            last_adv = delta + cfg.gamma * cfg.lam * last_adv
            adv[t], next_value = last_adv, values[t]
        out.append(adv)
    return out


def ref_reinforce_pp(rows, cfg):
    returns = []
    for row in rows:
        mask, step, rewards = row["mask"], row["step"], row["rewards"]
        n, g = len(mask), 0.0
        ret = [0.0] * n
        for t in reversed(range(n)):
            if mask[t]:
                last_token = t + 1 == n or step[t + 1] != step[t]
                g = (rewards[step[t]] if last_token else 0.0) + cfg.gamma * g
                ret[t] = g
        returns.append(ret)
    flat = [x for row, ret in zip(rows, returns) for m, x in zip(row["mask"], ret) if m]
    mean, std = _mean_std(flat)
    return [
        [(x - mean) / (std + cfg.eps) if m else 0.0 for m, x in zip(row["mask"], ret)]
        for row, ret in zip(rows, returns)
    ]


# -------------------------------------------------------------------------------- the bench


def _max_diff_steps(ours_steps, ref):
    got = np.asarray(ours_steps)
    return max(float(np.max(np.abs(got[i, : len(r)] - np.asarray(r)))) for i, r in enumerate(ref))


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


def run(quick: bool) -> Report:
    """Times every registered built-in estimator against its Python loop."""
    rng = np.random.default_rng(0)
    b_steps, s = (256, 16) if quick else (4096, 64)
    b_tok, t = (16, 512) if quick else (512, 4096)
    ref_step_rows, ref_tok_rows = (b_steps, b_tok) if quick else (1024, 64)
    report = Report("advantages")
    bandwidth = memory_bandwidth(16 << 20 if quick else 512 << 20)
    report.facts["memory_bandwidth_GBps"] = round(bandwidth / 1e9, 2)
    report.facts["devices"] = str(jax.devices())
    cfg = kernels.AdvantageConfig(gamma=0.95, lam=0.95)

    batch, trajs, make_s = step_workload(rng, b_steps, s)
    sub = trajs[:ref_step_rows]
    for name, ref in (
        ("grpo", ref_grpo),
        ("rloo", ref_rloo),
        ("gigpo", ref_gigpo),
        ("gagpo", ref_gagpo),
    ):
        fn = kernels.get_advantage_estimator(name)
        out = jax.block_until_ready(fn(batch, cfg))  # compile
        ours_s = timed(lambda fn=fn: jax.block_until_ready(fn(batch, cfg)), repeats=5)
        t0 = time.perf_counter()
        ref_out = ref(sub, cfg)
        ref_s = time.perf_counter() - t0
        moved = _bytes(batch.rewards, batch.step_mask, batch.group_ids, batch.state_ids)
        moved += _bytes(batch.loss_mask, batch.step_ids, out.tokens, out.steps)
        report.add(
            _row(
                name, f"{b_steps}x{s} steps", ours_s, ref_s, len(sub), b_steps, moved, bandwidth,
                _max_diff_steps(out.steps, ref_out), {"make_batch_ms": make_s * 1e3},
            )
        )  # fmt: skip

    batch, values, rows = token_workload(rng, b_tok, t)
    for name, ref in (("gae", ref_gae), ("reinforce_pp", ref_reinforce_pp)):
        # REINFORCE++ whitens over the whole batch: its reference must see every row.
        sub = rows if name == "reinforce_pp" else rows[:ref_tok_rows]
        fn = kernels.get_advantage_estimator(name)
        kw = {"values": values} if name == "gae" else {}
        out = jax.block_until_ready(fn(batch, cfg, **kw))
        ours_s = timed(lambda fn=fn, kw=kw: jax.block_until_ready(fn(batch, cfg, **kw)), repeats=5)
        t0 = time.perf_counter()
        ref_out = ref(sub, cfg)
        ref_s = time.perf_counter() - t0
        moved = _bytes(batch.loss_mask, batch.step_ids, batch.rewards, out.tokens, out.returns)
        moved += _bytes(values) if name == "gae" else 0
        diff = float(np.max(np.abs(np.asarray(out.tokens)[: len(sub)] - np.asarray(ref_out))))
        report.add(
            _row(
                name, f"{b_tok}x{t} tokens", ours_s, ref_s, len(sub), b_tok, moved, bandwidth, diff
            )
        )  # fmt: skip
    report.facts["peak_rss_mb"] = round(peak_rss_mb(), 1)
    return report
