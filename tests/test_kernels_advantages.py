"""Advantage estimators against plain-Python references written here, per trajectory.

The references read the trajectories as Python lists (never the padded arrays or any kernel
helper) and compute in float64; the kernels run in float32 on the padded batch. Tolerance:
max abs diff <= 1e-6, fixed.
"""

import dataclasses
import math
import statistics

import chex
import numpy as np
import pytest

from agentrl_jax import kernels as K
from agentrl_jax.kernels import advantages as advantages_module

ATOL = 1e-6
EPS = 1e-6
BUCKET = (40, 64, 12)  # (B, T, S) of the random batches: one compilation per estimator/config.


# ------------------------------------------------------------------------------ random data


def random_trajectories(
    seed, *, n_groups=5, max_steps=7, n_states=3, rewards="mixed", truncation=False
):
    """Rollout groups of ragged trajectories, as plain Python dicts.

    Each trajectory: raw int64 group id and state keys (beyond int32, to exercise the remap),
    per-step float32-exact rewards, per-step action / observation token counts, per-agent-token
    values and KL estimates. All steps of a group start from the same state. With
    ``truncation``, about half are cut by a limit (``truncated``) and carry ``next_value``, the
    critic's value of the state after their last action.
    """
    rng = np.random.default_rng(seed)
    trajs = []
    for g in range(n_groups):
        group = 10**12 + 7919 * g
        for _ in range(int(rng.integers(1, 5))):
            n = int(rng.integers(1, max_steps + 1))
            keys = [group + 1] + [int(k) * 2**40 + 3 for k in rng.integers(0, n_states, n - 1)]
            if rewards == "binary" or (rewards == "mixed" and rng.random() < 0.5):
                r = [0.0] * (n - 1) + [float(rng.integers(0, 2))]
            else:
                r = [float(np.float32(x)) for x in rng.uniform(-1, 1, n)]
            action_lens = [int(x) for x in rng.integers(1, 4, n)]
            n_agent = sum(action_lens)
            trajs.append(
                dict(
                    group=group,
                    keys=keys,
                    rewards=r,
                    prompt_len=int(rng.integers(1, 4)),
                    action_lens=action_lens,
                    obs_lens=[int(x) for x in rng.integers(0, 3, n)],
                    values=[float(np.float32(x)) for x in rng.uniform(-1, 1, n_agent)],
                    kl=[float(np.float32(x)) for x in rng.uniform(0, 0.5, n_agent)],
                )
            )
            if truncation:
                trajs[-1]["truncated"] = bool(rng.random() < 0.5)
                trajs[-1]["next_value"] = float(np.float32(rng.uniform(-1, 1)))
    order = rng.permutation(len(trajs))
    return [trajs[i] for i in order]


def pack(trajs, *, extra_rows=2, extra_tokens=3, extra_steps=2, seed=0, shape=None):
    """Pads trajectories into the batch layout; returns (batch, values, kl, agent positions).

    The padded shape is the data's extent plus the extras, or exactly ``shape`` = (B, T, S).
    Trajectories with a ``truncated`` flag give the batch bootstrap values: ``next_value`` where
    truncated, 0 where terminal, garbage on padding rows (which have no agent token to read it).
    """
    rng = np.random.default_rng(seed + 1)
    lengths = [t["prompt_len"] + sum(t["action_lens"]) + sum(t["obs_lens"]) for t in trajs]
    b = len(trajs) + extra_rows
    t_len = max(lengths) + extra_tokens
    s = max(len(t["rewards"]) for t in trajs) + extra_steps
    if shape is not None:
        b, t_len, s = shape
    loss_mask = np.zeros((b, t_len), np.int32)
    step_ids = np.full((b, t_len), -1, np.int32)
    rewards = np.zeros((b, s), np.float32)
    step_mask = np.zeros((b, s), np.int32)
    string_keys = any(isinstance(k, str) for t in trajs for k in t["keys"])
    keys = np.zeros((b, s), object if string_keys else np.int64)
    groups = np.arange(b, dtype=np.int64) + 5  # padding rows: groups of their own
    # Off agent tokens values and KL are garbage: the kernels must never read them.
    values = rng.uniform(-50, 50, (b, t_len)).astype(np.float32)
    kl = rng.uniform(-50, 50, (b, t_len)).astype(np.float32)
    positions = []
    bootstrap = None
    if any("truncated" in t for t in trajs):
        bootstrap = rng.uniform(-50, 50, b).astype(np.float32)
    for row, tr in enumerate(trajs):
        if bootstrap is not None:
            bootstrap[row] = tr["next_value"] if tr["truncated"] else 0.0
        pos, cursor, agent = tr["prompt_len"], 0, []
        for k, (a, o) in enumerate(zip(tr["action_lens"], tr["obs_lens"])):
            for _ in range(a):
                loss_mask[row, pos], step_ids[row, pos] = 1, k
                values[row, pos], kl[row, pos] = tr["values"][cursor], tr["kl"][cursor]
                agent.append(pos)
                pos, cursor = pos + 1, cursor + 1
            pos += o
        n = len(tr["rewards"])
        rewards[row, :n], step_mask[row, :n], keys[row, :n] = tr["rewards"], 1, tr["keys"]
        groups[row] = tr["group"]
        positions.append(agent)
    batch = K.make_batch(
        loss_mask=loss_mask,
        step_ids=step_ids,
        rewards=rewards,
        step_mask=step_mask,
        group_ids=groups,
        state_keys=keys,
        bootstrap_values=bootstrap,
    )
    return batch, values, kl, positions


# ------------------------------------------------------------------- plain-Python references


def ref_normalize(xs, norm_by_std=True):
    if len(xs) == 1:
        return [0.0]
    mean = sum(xs) / len(xs)
    if not norm_by_std:
        return [x - mean for x in xs]
    std = statistics.stdev(xs)
    return [(x - mean) / (std + EPS) for x in xs]


def ref_by_group(trajs, per_traj, norm_by_std=True):
    """Normalises one number per trajectory within its group; returns a list per trajectory."""
    out = [None] * len(trajs)
    for g in {t["group"] for t in trajs}:
        idx = [i for i, t in enumerate(trajs) if t["group"] == g]
        for i, a in zip(idx, ref_normalize([per_traj[i] for i in idx], norm_by_std)):
            out[i] = a
    return out


def ref_discounted(rewards, gamma):
    out, g = [0.0] * len(rewards), 0.0
    for t in reversed(range(len(rewards))):
        g = rewards[t] + gamma * g
        out[t] = g
    return out


def ref_token_rewards(tr, kl_coef=0.0):
    r = []
    for k, a in enumerate(tr["action_lens"]):
        r += [0.0] * (a - 1) + [tr["rewards"][k]]
    return [x - kl_coef * kl for x, kl in zip(r, tr["kl"])]


def ref_gae(tr, gamma, lam, kl_coef=0.0):
    """The practitioner's-guide loop over the agent tokens of one trajectory.

    After the last action: 0 (terminal), or the value of the next state where truncated.
    """
    r, v = ref_token_rewards(tr, kl_coef), tr["values"]
    after_last = tr["next_value"] if tr.get("truncated") else 0.0
    adv, last = [0.0] * len(r), 0.0
    for t in reversed(range(len(r))):
        next_v = v[t + 1] if t + 1 < len(r) else after_last
        delta = r[t] + gamma * next_v - v[t]
        last = delta + gamma * lam * last
        adv[t] = last
    return adv, [a + x for a, x in zip(adv, v)]


def ref_steps_to_tokens(tr, per_step):
    return [per_step[k] for k, a in enumerate(tr["action_lens"]) for _ in range(a)]


def ref_grpo(trajs, norm_by_std=True):
    adv = ref_by_group(trajs, [sum(t["rewards"]) for t in trajs], norm_by_std)
    return [[a] * len(t["rewards"]) for a, t in zip(adv, trajs)]


def ref_rloo(trajs):
    out = []
    for t in trajs:
        others = [sum(o["rewards"]) for o in trajs if o["group"] == t["group"] and o is not t]
        a = sum(t["rewards"]) - sum(others) / len(others) if others else 0.0
        out.append([a] * len(t["rewards"]))
    return out


def ref_reinforce_pp(trajs, gamma, kl_coef, norm_by_std=True):
    returns = [ref_discounted(ref_token_rewards(t, kl_coef), gamma) for t in trajs]
    flat = [x for r in returns for x in r]
    mean, std = sum(flat) / len(flat), statistics.stdev(flat)
    if not norm_by_std:
        return [[x - mean for x in r] for r in returns]
    return [[(x - mean) / (std + EPS) for x in r] for r in returns]


def ref_gigpo(trajs, gamma, omega, norm_by_std=True):
    episode = ref_by_group(trajs, [sum(t["rewards"]) for t in trajs], norm_by_std)
    returns = [ref_discounted(t["rewards"], gamma) for t in trajs]
    anchors = {}
    for i, t in enumerate(trajs):
        for k, key in enumerate(t["keys"]):
            anchors.setdefault((t["group"], key), []).append((i, k))
    step = [[None] * len(t["rewards"]) for t in trajs]
    for members in anchors.values():
        for (i, k), a in zip(
            members, ref_normalize([returns[i][k] for i, k in members], norm_by_std)
        ):
            step[i][k] = a
    return [[episode[i] + omega * a for a in step[i]] for i in range(len(trajs))]


def ref_gagpo(trajs, gamma, lam, normalize=True, norm_by_std=True):
    """GAGPO as written in the issue: V(s) from grouped discounted returns, GAE over steps."""
    returns = [ref_discounted(t["rewards"], gamma) for t in trajs]
    pools = {}
    for i, t in enumerate(trajs):
        for k, key in enumerate(t["keys"]):
            pools.setdefault((t["group"], key), []).append(returns[i][k])
    value = {s: sum(v) / len(v) for s, v in pools.items()}
    raw = []
    for t in trajs:
        g, n = t["group"], len(t["rewards"])
        adv, last = [0.0] * n, 0.0
        for k in reversed(range(n)):
            v_next = value[(g, t["keys"][k + 1])] if k + 1 < n else 0.0
            delta = t["rewards"][k] + gamma * v_next - value[(g, t["keys"][k])]
            last = delta + gamma * lam * last
            adv[k] = last
        raw.append(adv)
    if not normalize:
        return raw
    out = [list(a) for a in raw]
    for g in {t["group"] for t in trajs}:
        idx = [(i, k) for i, t in enumerate(trajs) if t["group"] == g for k in range(len(raw[i]))]
        for (i, k), a in zip(idx, ref_normalize([raw[i][k] for i, k in idx], norm_by_std)):
            out[i][k] = a
    return out


# ---------------------------------------------------------------------------- comparisons


def assert_matches(diffs, name=""):
    """``diffs`` = (max |ours - ref| where defined, max |ours| elsewhere): the first within ATOL,
    the second exactly 0 (two asserts: a tuple comparison would stop at the first element)."""
    diff, outside = diffs
    assert diff <= ATOL, (name, diff)
    assert outside == 0.0, (name, outside)


def max_token_diff(tokens_bt, positions, per_token_refs):
    """Max |ours - ref| on agent tokens, and max |ours| elsewhere (must be 0)."""
    got = np.asarray(tokens_bt, np.float64)
    diff, outside = 0.0, got.copy()
    for row, (pos, ref) in enumerate(zip(positions, per_token_refs)):
        assert len(pos) == len(ref)
        diff = max(diff, float(np.max(np.abs(got[row, pos] - np.asarray(ref)))))
        outside[row, pos] = 0.0
    return diff, float(np.max(np.abs(outside)))


def max_step_diff(steps_bs, per_step_refs):
    got = np.asarray(steps_bs, np.float64)
    diff, outside = 0.0, got.copy()
    for row, ref in enumerate(per_step_refs):
        diff = max(diff, float(np.max(np.abs(got[row, : len(ref)] - np.asarray(ref)))))
        outside[row, : len(ref)] = 0.0
    return diff, float(np.max(np.abs(outside)))


SEEDS = [0, 1, 2, 3]
CONFIGS = [  # Each config compiles each estimator once: keep the list short.
    K.AdvantageConfig(gamma=1.0, lam=0.95),
    K.AdvantageConfig(gamma=0.9, lam=0.8, step_weight=0.5, kl_coef=0.1, norm_by_std=False),
]
CONFIG_IDS = ["default", "discounted_kl_no_std"]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("cfg", CONFIGS, ids=CONFIG_IDS)
def test_token_level_estimators_match_reference(seed, cfg):
    trajs = random_trajectories(seed)
    batch, values, kl, positions = pack(trajs, seed=seed, shape=BUCKET)

    out = K.gae(batch, cfg, values=values, kl=kl if cfg.kl_coef else None)
    refs = [ref_gae(t, cfg.gamma, cfg.lam, cfg.kl_coef) for t in trajs]
    assert_matches(max_token_diff(out.tokens, positions, [r[0] for r in refs]))
    assert_matches(max_token_diff(out.returns, positions, [r[1] for r in refs]))

    out = K.reinforce_pp(batch, cfg, kl=kl if cfg.kl_coef else None)
    ref = ref_reinforce_pp(trajs, cfg.gamma, cfg.kl_coef, cfg.norm_by_std)
    assert_matches(max_token_diff(out.tokens, positions, ref))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("cfg", CONFIGS, ids=CONFIG_IDS)
def test_gae_bootstraps_truncated_episodes_and_not_terminal_ones(seed, cfg):
    trajs = random_trajectories(seed, truncation=True)
    assert {t["truncated"] for t in trajs} == {True, False}  # both kinds in every batch
    batch, values, kl, positions = pack(trajs, seed=seed, shape=BUCKET)
    kl = kl if cfg.kl_coef else None

    out = K.gae(batch, cfg, values=values, kl=kl)
    refs = [ref_gae(t, cfg.gamma, cfg.lam, cfg.kl_coef) for t in trajs]
    assert_matches(max_token_diff(out.tokens, positions, [r[0] for r in refs]))
    assert_matches(max_token_diff(out.returns, positions, [r[1] for r in refs]))

    # Without bootstrap values every episode is terminal, the truncated ones included.
    terminal = [{**t, "truncated": False} for t in trajs]
    out = K.gae(dataclasses.replace(batch, bootstrap_values=None), cfg, values=values, kl=kl)
    refs = [ref_gae(t, cfg.gamma, cfg.lam, cfg.kl_coef) for t in terminal]
    assert_matches(max_token_diff(out.tokens, positions, [r[0] for r in refs]))
    assert_matches(max_token_diff(out.returns, positions, [r[1] for r in refs]))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("cfg", CONFIGS, ids=CONFIG_IDS)
def test_step_level_estimators_match_reference(seed, cfg):
    trajs = random_trajectories(seed, rewards="binary" if seed % 2 else "mixed")
    batch, _, _, positions = pack(trajs, seed=seed, shape=BUCKET)
    cfg = K.AdvantageConfig(**{**cfg.__dict__, "kl_coef": 0.0})
    cases = {
        "grpo": ref_grpo(trajs, cfg.norm_by_std),
        "rloo": ref_rloo(trajs),
        "gigpo": ref_gigpo(trajs, cfg.gamma, cfg.step_weight, cfg.norm_by_std),
        "gagpo": ref_gagpo(trajs, cfg.gamma, cfg.lam, norm_by_std=cfg.norm_by_std),
    }
    for name, ref_steps in cases.items():
        out = K.get_advantage_estimator(name)(batch, cfg)
        assert_matches(max_step_diff(out.steps, ref_steps), name)
        ref_tokens = [ref_steps_to_tokens(t, r) for t, r in zip(trajs, ref_steps)]
        assert_matches(max_token_diff(out.tokens, positions, ref_tokens), name)


@pytest.mark.parametrize("seed", SEEDS)
def test_gagpo_unnormalised_matches_reference(seed):
    trajs = random_trajectories(seed, n_states=2)
    batch, _, _, _ = pack(trajs, seed=seed, shape=BUCKET)
    got = K.gagpo_step_advantages(
        batch.rewards,
        batch.step_mask,
        batch.group_ids,
        batch.state_ids,
        gamma=0.9,
        lam=0.7,
        normalize=False,
    )
    assert_matches(max_step_diff(got, ref_gagpo(trajs, 0.9, 0.7, normalize=False)))


# ------------------------------------------------------------------ hand-computed examples


def tiny_batch(rewards, keys, groups, action_lens=None):
    """One env token, then each action (1 token by default) followed by one env token."""
    rows = []
    for r, k, g in zip(rewards, keys, groups):
        lens = action_lens or [1] * len(r)
        rows.append(
            dict(
                group=g,
                keys=k,
                rewards=r,
                prompt_len=1,
                action_lens=lens[: len(r)],
                obs_lens=[1] * len(r),
                values=[0.0] * sum(lens[: len(r)]),
                kl=[0.0] * sum(lens[: len(r)]),
            )
        )
    return pack(rows, extra_rows=0, extra_tokens=0, extra_steps=0)[0]


def test_gagpo_worked_example_from_docs():
    """docs/algorithms.md, "A worked GAGPO example": the same numbers, written out."""
    batch = tiny_batch(
        rewards=[[0.0, 1.0], [0.0, 0.0, 1.0], [0.0, 0.0]],
        keys=[["s0", "s1"], ["s0", "s1", "s2"], ["s0", "s3"]],
        groups=[0, 0, 0],
    )
    raw = K.gagpo_step_advantages(
        batch.rewards, batch.step_mask, batch.group_ids, batch.state_ids,
        gamma=0.9, lam=1.0, normalize=False,
    )  # fmt: skip
    # G = [0.9, 1] / [0.81, 0.9, 1] / [0, 0];  V(s0) = 1.71/3 = 0.57, V(s1) = 1.9/2 = 0.95,
    # V(s2) = 1, V(s3) = 0.  delta_0 = 0 + 0.9 V(s1) - V(s0) = 0.285 (rows 0, 1),
    # delta_0 = 0 + 0.9 V(s3) - V(s0) = -0.57 (row 2); delta_1 = 1 - 0.95 = 0.05 (row 0),
    # 0 + 0.9 * 1 - 0.95 = -0.05 (row 1), 0 - 0 = 0 (row 2); delta_2 = 1 - 1 = 0 (row 1).
    # A_t = delta_t + 0.9 * A_{t+1}: row 0: [0.285 + 0.045, 0.05] = [0.33, 0.05];
    # row 1: [0.285 - 0.045, -0.05, 0] = [0.24, -0.05, 0]; row 2: [-0.57, 0].
    expected = np.array([[0.33, 0.05, 0.0], [0.24, -0.05, 0.0], [-0.57, 0.0, 0.0]])
    np.testing.assert_allclose(np.asarray(raw), expected, rtol=0, atol=ATOL)
    # Normalised over the group's 7 real steps: mean 0, unbiased std sqrt(0.4964 / 6).
    out = K.gagpo(batch, K.AdvantageConfig(gamma=0.9, lam=1.0))
    real = expected[np.asarray(batch.step_mask) > 0]
    std = math.sqrt(sum((x - real.mean()) ** 2 for x in real) / 6)
    assert std == pytest.approx(math.sqrt(0.4964 / 6), abs=1e-12)
    want = np.where(np.asarray(batch.step_mask) > 0, (expected - real.mean()) / (std + EPS), 0)
    np.testing.assert_allclose(np.asarray(out.steps), want, rtol=0, atol=ATOL)


@pytest.mark.parametrize(
    "cut, want_adv, want_ret",
    [
        # token rewards [0, 0.5, 0, 1]; deltas: t3 = 1 - 4 = -3, t2 = 0 + 0.5*4 - 3 = -1,
        # t1 = 0.5 + 0.5*3 - 2 = 0, t0 = 0 + 0.5*2 - 1 = 0.  A = delta + 0.25 A_next:
        # A3 = -3, A2 = -1.75, A1 = -0.4375, A0 = -0.109375.
        (None, [-0.109375, -0.4375, -1.75, -3.0], [0.890625, 1.5625, 1.25, 1.0]),
        # Cut by a limit with V(next state) = 2: t3 = 1 + 0.5*2 - 4 = -2, the rest as before:
        # A2 = -1 + 0.25*(-2) = -1.5, A1 = 0.25*(-1.5) = -0.375, A0 = 0.25*(-0.375) = -0.09375.
        (2.0, [-0.09375, -0.375, -1.5, -2.0], [0.90625, 1.625, 1.5, 2.0]),
    ],
    ids=["terminal", "truncated"],
)
def test_gae_hand_computed(cut, want_adv, want_ret):
    """Two actions of two tokens; env tokens between them are skipped, not steps."""
    rows = [
        dict(
            group=0, keys=[0, 1], rewards=[0.5, 1.0], prompt_len=2, action_lens=[2, 2],
            obs_lens=[3, 0], values=[1.0, 2.0, 3.0, 4.0], kl=[0.0] * 4,
            truncated=cut is not None, next_value=cut,
        )
    ]  # fmt: skip
    batch, values, _, positions = pack(rows, extra_rows=0, extra_tokens=2, extra_steps=0)
    out = K.gae(batch, K.AdvantageConfig(gamma=0.5, lam=0.5), values=values)
    np.testing.assert_allclose(np.asarray(out.tokens)[0, positions[0]], want_adv, atol=ATOL)
    np.testing.assert_allclose(np.asarray(out.returns)[0, positions[0]], want_ret, atol=ATOL)


def test_grpo_rloo_hand_computed():
    batch = tiny_batch(rewards=[[1.0], [0.0], [0.0], [2.0]], keys=[[0]] * 4, groups=[0, 0, 0, 1])
    grpo = np.asarray(K.grpo(batch, K.AdvantageConfig()).steps)[:, 0]
    # group 0 returns [1, 0, 0]: mean 1/3, unbiased std sqrt(1/3); singleton group -> 0.
    std = math.sqrt(1 / 3)
    np.testing.assert_allclose(
        grpo, [(2 / 3) / (std + EPS), (-1 / 3) / (std + EPS), (-1 / 3) / (std + EPS), 0.0],
        atol=ATOL,
    )  # fmt: skip
    rloo = np.asarray(K.rloo(batch, K.AdvantageConfig()).steps)[:, 0]
    np.testing.assert_allclose(rloo, [1.0, -0.5, -0.5, 0.0], atol=ATOL)


# ------------------------------------------------------------------------------ invariants


@pytest.mark.parametrize("seed", SEEDS)
def test_gae_with_unit_gamma_lambda_is_returns_minus_values(seed):
    trajs = random_trajectories(seed)
    batch, values, _, positions = pack(trajs, seed=seed, shape=BUCKET)
    out = K.gae(batch, K.AdvantageConfig(gamma=1.0, lam=1.0), values=values)
    # With gamma = lambda = 1, A_t = sum of future token rewards - V_t (reward-to-go minus V).
    for row, (tr, pos) in enumerate(zip(trajs, positions)):
        to_go = ref_discounted(ref_token_rewards(tr), 1.0)
        want = np.asarray(to_go) - np.asarray(tr["values"])
        np.testing.assert_allclose(np.asarray(out.tokens)[row, pos], want, rtol=0, atol=ATOL)


@pytest.mark.parametrize("seed", SEEDS)
def test_grpo_sums_to_zero_within_each_group(seed):
    trajs = random_trajectories(seed, n_groups=8)
    batch, _, _, _ = pack(trajs, seed=seed, shape=BUCKET)
    adv = np.asarray(K.grpo(batch, K.AdvantageConfig()).steps)[:, 0].astype(np.float64)
    groups = np.asarray(batch.group_ids)
    for g in np.unique(groups[: len(trajs)]):
        assert abs(adv[: len(trajs)][groups[: len(trajs)] == g].sum()) <= ATOL


@pytest.mark.parametrize("seed", SEEDS)
def test_gagpo_unique_states_give_centred_first_step_and_zero_after(seed):
    trajs = random_trajectories(seed, max_steps=6)
    for i, t in enumerate(trajs):  # Unique keys after the shared start state.
        t["keys"] = [t["keys"][0]] + [10**15 + 1000 * i + k for k in range(1, len(t["keys"]))]
    batch, _, _, _ = pack(trajs, seed=seed, shape=BUCKET)
    gamma = 0.9
    raw = np.asarray(
        K.gagpo_step_advantages(
            batch.rewards, batch.step_mask, batch.group_ids, batch.state_ids,
            gamma=gamma, lam=0.95, normalize=False,
        )
    )  # fmt: skip
    r0 = [ref_discounted(t["rewards"], gamma)[0] for t in trajs]
    for i, t in enumerate(trajs):
        mean = np.mean([r0[j] for j, o in enumerate(trajs) if o["group"] == t["group"]])
        assert abs(raw[i, 0] - (r0[i] - mean)) <= ATOL
        assert np.all(raw[i, 1:] == 0.0)  # exactly 0, not just close


@pytest.mark.parametrize("name", ["gae", "grpo", "rloo", "reinforce_pp", "gigpo", "gagpo"])
def test_padding_never_changes_results(name):
    trajs = random_trajectories(11)
    cfg = CONFIGS[0]  # The big shape is BUCKET: compiled already by the parity tests.
    small, v_small, _, pos_small = pack(trajs, extra_rows=0, extra_tokens=0, extra_steps=0)
    big, v_big, _, pos_big = pack(trajs, seed=3, shape=BUCKET)
    fn = K.get_advantage_estimator(name)
    a = fn(small, cfg, values=v_small if name == "gae" else None)
    b = fn(big, cfg, values=v_big if name == "gae" else None)
    for row in range(len(trajs)):  # Equal up to float32 reduction order.
        np.testing.assert_allclose(
            np.asarray(a.tokens)[row, pos_small[row]],
            np.asarray(b.tokens)[row, pos_big[row]],
            rtol=0,
            atol=ATOL,
        )
    assert np.all(np.asarray(b.tokens)[len(trajs) :] == 0)


@pytest.mark.parametrize("name", ["gae", "grpo", "rloo", "reinforce_pp", "gigpo", "gagpo"])
def test_each_estimator_compiles_once_per_shape_bucket(name):
    batches = []
    for seed in range(3):  # Same bucket (B, T, S), different contents.
        trajs = random_trajectories(100 + seed, n_groups=6, max_steps=4)
        batch, values, _, _ = pack(trajs, seed=seed, shape=BUCKET)
        batches.append((batch, values))
    trajs = random_trajectories(200, n_groups=6, max_steps=4)[:6]
    bigger, bigger_values, _, _ = pack(trajs, shape=(8, 48, 10))
    spec = K.get_advantage_spec(name)
    # The registered estimator's own wrapping (jit_estimator) around its impl, which chex counts.
    chex.clear_trace_counter()
    fn = advantages_module.jit_estimator(
        name,
        chex.assert_max_traces(spec.fn.impl, n=1),
        needs_values=spec.needs_values,
        kl_reward=spec.kl_reward,
    )
    use = spec.needs_values
    for batch, v in batches:
        for cfg in (K.AdvantageConfig(), K.AdvantageConfig()):  # equal, distinct objects
            fn(batch, cfg, values=v if use else None)  # one trace for the bucket, then cached
    with pytest.raises(AssertionError, match="traced > 1 times"):  # a new bucket is traced again
        fn(bigger, K.AdvantageConfig(), values=bigger_values if use else None)
    # The registered estimator itself: the bucket adds at most one entry to its compilation cache
    # (none when an earlier test compiled it already).
    before = spec.fn.jitted._cache_size()
    for batch, v in batches:
        spec.fn(batch, K.AdvantageConfig(), values=v if use else None)
    assert spec.fn.jitted._cache_size() - before <= 1


@pytest.mark.parametrize("discount", [1.0, 0.95, 0.5, 0.01, 0.0])
def test_masked_suffix_sums_match_loop(discount):
    """The chunked-matmul scan (and its sequential fallback for tiny discounts) vs a loop."""
    from agentrl_jax.kernels.segments import masked_suffix_sums

    rng = np.random.default_rng(int(discount * 100))
    x = rng.uniform(-1, 1, (5, 100)).astype(np.float32)
    mask = rng.random((5, 100)) < 0.6
    mask[1] = False  # a row with nothing to sum
    incl = np.asarray(masked_suffix_sums(x, mask, discount))
    strict = np.asarray(masked_suffix_sums(x, mask, discount, strict=True))
    for b in range(5):
        nxt = 0.0
        for t in reversed(range(100)):
            if not mask[b, t]:
                assert incl[b, t] == 0.0 and strict[b, t] == 0.0
                continue
            assert abs(strict[b, t] - nxt) <= ATOL
            nxt = float(x[b, t]) + discount * nxt
            assert abs(incl[b, t] - nxt) <= ATOL


def test_gae_with_lambda_zero_is_one_step_td():
    trajs = random_trajectories(5)
    batch, values, _, positions = pack(trajs, shape=BUCKET)
    out = K.gae(batch, K.AdvantageConfig(gamma=0.9, lam=0.0), values=values)
    refs = [ref_gae(t, 0.9, 0.0)[0] for t in trajs]
    assert_matches(max_token_diff(out.tokens, positions, refs))


def test_batch_whitening_stays_exact_over_a_million_tokens():
    """REINFORCE++'s whole-batch statistics in float32 over 1M tokens vs float64 numpy.

    Guards the summation order: a sequential float32 accumulation over this many positive
    returns drifts by ~1e-2 (it did once, in a variadic reduce); blocked sums stay ~1e-7
    relative. Values up to 20 (one float32 ulp is 1.9e-6 there), hence the fixed 1e-5.
    """
    from agentrl_jax.kernels.segments import group_normalize

    rng = np.random.default_rng(7)
    x = rng.uniform(0, 20, (256, 4096)).astype(np.float32)
    mask = rng.random((256, 4096)) < 0.4
    got = np.asarray(
        group_normalize(x, np.zeros(x.shape, np.int32), mask, 1, norm_by_std=True, eps=EPS)
    )
    sel = x[mask].astype(np.float64)
    want = np.where(mask, (x - sel.mean()) / (sel.std(ddof=1) + EPS), 0.0)
    assert np.max(np.abs(got - want)) <= 1e-5
