"""PPO, value, KL and entropy losses against per-row Python loops written here."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax import kernels as K

ATOL = 1e-6
AGGREGATIONS = ["token_mean", "seq_mean_token_sum", "seq_mean_token_mean", "episode_mean"]


def random_rollout(seed, b=6, t=20):
    """Rows of env tokens and contiguous action runs; returns arrays and the runs per row."""
    rng = np.random.default_rng(seed)
    mask = np.zeros((b, t), np.float32)
    step_ids = np.full((b, t), -1, np.int32)
    runs = []
    for row in range(b - 1):  # the last row stays empty: padding
        pos, k, row_runs = int(rng.integers(0, 3)), 0, []
        while pos < t - 1:
            n = int(rng.integers(1, 4))
            run = list(range(pos, min(pos + n, t)))
            mask[row, run], step_ids[row, run] = 1, k
            row_runs.append(run)
            pos, k = run[-1] + 1 + int(rng.integers(0, 3)), k + 1
        runs.append(row_runs)
    runs.append([])
    f32 = lambda x: x.astype(np.float32)
    old = f32(rng.uniform(-3, -0.1, (b, t)))
    logp = f32(old + rng.normal(0, 0.3, (b, t)))
    adv = f32(rng.normal(0, 1, (b, t)))
    return dict(mask=mask, step_ids=step_ids, old=old, logp=logp, adv=adv, runs=runs)


def ref_aggregate(per_token, runs, mode):
    """per_token[row][t] over the tokens of all runs of each row."""
    rows = [[per_token[r][t] for run in row_runs for t in run] for r, row_runs in enumerate(runs)]
    rows = [x for x in rows if x]
    if mode == "token_mean":
        return sum(sum(x) for x in rows) / sum(len(x) for x in rows)
    if mode == "seq_mean_token_sum":
        return sum(sum(x) for x in rows) / len(rows)
    # seq_mean_token_mean, and episode_mean with a 0/1 mask (every row weighs 1).
    return sum(sum(x) / len(x) for x in rows) / len(rows)


def ref_ppo(d, cfg):
    """The PPO-clip loop, token by token (action ratio: mean log-ratio over the run)."""
    loss = np.zeros_like(d["logp"], dtype=np.float64)
    for r, row_runs in enumerate(d["runs"]):
        for run in row_runs:
            for t in run:
                if cfg.ratio_level == "action":
                    rho = sum(float(d["logp"][r, u]) - float(d["old"][r, u]) for u in run) / len(
                        run
                    )
                else:
                    rho = float(d["logp"][r, t]) - float(d["old"][r, t])
                ratio, a = math.exp(rho), float(d["adv"][r, t])
                clipped = min(max(ratio, 1 - cfg.clip_low), 1 + cfg.clip_high)
                loss_t = max(-a * ratio, -a * clipped)
                if cfg.dual_clip is not None and a < 0:
                    loss_t = min(loss_t, -a * cfg.dual_clip)
                loss[r, t] = loss_t
    return ref_aggregate(loss, d["runs"], cfg.aggregation)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("ratio_level", ["token", "action"])
@pytest.mark.parametrize("dual_clip", [None, 3.0])
def test_ppo_matches_reference(aggregation, ratio_level, dual_clip):
    cfg = K.LossConfig(
        aggregation=aggregation, ratio_level=ratio_level, dual_clip=dual_clip, clip_high=0.28
    )
    for seed in range(3):
        d = random_rollout(seed)
        loss, metrics = K.ppo_loss(
            d["logp"], d["old"], d["adv"], d["mask"], step_ids=d["step_ids"], config=cfg
        )
        assert abs(float(loss.value) - ref_ppo(d, cfg)) <= ATOL
        assert set(metrics) == {"losses/clipfrac", "losses/approx_kl", "losses/dual_clipfrac"}
        assert float(metrics["losses/clipfrac"].denominator) == d["mask"].sum()


def test_ppo_hand_computed():
    logp = jnp.log(jnp.array([[1.5, 0.5, 5.0, 1.1]]))
    old = jnp.zeros((1, 4))
    adv = jnp.array([[1.0, -1.0, -1.0, 2.0]])
    mask = jnp.ones((1, 4))
    cfg = K.LossConfig(dual_clip=3.0)
    loss, metrics = K.ppo_loss(logp, old, adv, mask, config=cfg)
    # ratio 1.5, A 1: max(-1.5, -1.2) = -1.2;  ratio 0.5, A -1: max(0.5, 0.8) = 0.8;
    # ratio 5, A -1: max(5, 1.2) = 5 -> dual clip min(5, 3) = 3;  ratio 1.1, A 2: -2.2.
    assert float(loss.value) == pytest.approx((-1.2 + 0.8 + 3.0 - 2.2) / 4, abs=ATOL)
    assert float(metrics["losses/clipfrac"].value) == pytest.approx(2 / 4)
    assert float(metrics["losses/dual_clipfrac"].value) == pytest.approx(1 / 4)


def test_action_ratio_is_shared_by_the_action_tokens_and_gets_gradient():
    d = random_rollout(7)
    cfg = K.LossConfig(ratio_level="action")
    mean = np.asarray(K.action_mean(jnp.asarray(d["logp"] - d["old"]), d["step_ids"], d["mask"]))
    for r, row_runs in enumerate(d["runs"]):
        for run in row_runs:
            want = np.mean([float(d["logp"][r, t]) - float(d["old"][r, t]) for t in run])
            np.testing.assert_allclose(mean[r, run], want, rtol=0, atol=ATOL)

    def f(logp):
        return K.ppo_loss(logp, d["old"], d["adv"], d["mask"], step_ids=d["step_ids"], config=cfg)[
            0
        ].value

    grad = np.asarray(jax.grad(f)(jnp.asarray(d["logp"])))
    assert np.all(np.isfinite(grad)) and np.all(grad[d["mask"] == 0] == 0)
    assert np.any(grad != 0)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_numerator_denominator_exact_across_microbatches(aggregation):
    d = random_rollout(3, b=8)
    cfg = K.LossConfig(aggregation=aggregation)
    full, _ = K.ppo_loss(d["logp"], d["old"], d["adv"], d["mask"], config=cfg)
    parts = [
        K.ppo_loss(d["logp"][s], d["old"][s], d["adv"][s], d["mask"][s], config=cfg)[0]
        for s in (slice(0, 3), slice(3, 8))
    ]
    total = parts[0] + parts[1]
    assert abs(float(total.value) - float(full.value)) <= ATOL
    # Averaging the microbatch means would not be exact (masks differ):
    assert float(total.denominator) == float(full.denominator)


def test_value_loss_matches_reference():
    rng = np.random.default_rng(0)
    d = random_rollout(1)
    values = rng.normal(0, 1, d["mask"].shape).astype(np.float32)
    old = (values + rng.normal(0, 0.3, values.shape)).astype(np.float32)
    returns = rng.normal(0, 1, values.shape).astype(np.float32)
    for clip in (None, 0.2):
        cfg = K.LossConfig(value_clip=clip, aggregation="seq_mean_token_mean")
        loss, _ = K.value_loss(values, old, returns, d["mask"], config=cfg)
        per = np.zeros(values.shape)
        for r, row_runs in enumerate(d["runs"]):
            for t in (t for run in row_runs for t in run):
                v, o, g = float(values[r, t]), float(old[r, t]), float(returns[r, t])
                sq = (v - g) ** 2
                if clip is not None:
                    vc = o + min(max(v - o, -clip), clip)
                    sq = max(sq, (vc - g) ** 2)
                per[r, t] = 0.5 * sq
        assert abs(float(loss.value) - ref_aggregate(per, d["runs"], cfg.aggregation)) <= ATOL
    ev = K.explained_variance(jnp.asarray(returns), jnp.asarray(returns), d["mask"])
    assert float(ev) == pytest.approx(1.0)


def test_kl_estimators_match_formulas():
    d = random_rollout(2)
    ref = d["old"]
    for kind in ("k1", "k2", "k3"):
        got = np.asarray(K.kl_estimate(d["logp"], ref, kind))
        rho = d["logp"].astype(np.float64) - ref
        want = {"k1": rho, "k2": 0.5 * rho**2, "k3": np.exp(-rho) - 1 + rho}[kind]
        np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)
    assert np.all(np.asarray(K.kl_estimate(d["logp"], ref, "k3")) >= 0)
    clamped = K.kl_estimate(jnp.zeros((1, 1)), jnp.full((1, 1), 30.0), "k3", clamp=10.0)
    assert float(clamped[0, 0]) == 10.0
    cfg = K.LossConfig(kl_estimator="k3", aggregation="token_mean")
    loss = K.kl_loss(d["logp"], ref, d["mask"], config=cfg)
    k3 = np.exp(-(d["logp"].astype(np.float64) - ref)) - 1 + (d["logp"] - ref)
    assert abs(float(loss.value) - ref_aggregate(k3, d["runs"], "token_mean")) <= ATOL
    # As a reward penalty no gradient flows back into the policy.
    grad = jax.grad(lambda lp: jnp.sum(K.kl_penalty(lp, ref, d["mask"])))(jnp.asarray(d["logp"]))
    assert np.all(np.asarray(grad) == 0)


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_kl_gradients_are_finite_where_masked_positions_hold_huge_log_ratios(kind):
    """Off the loss mask (prompts, padding) log pi - log pi_ref may be anything: k3's
    exp(-rho) there overflowed to inf, and its gradient (0 * inf) was NaN for the whole step."""
    d = random_rollout(5)
    mask, ref = d["mask"], d["old"]
    logp = np.where(mask > 0, d["logp"], -500.0).astype(np.float32)  # rho = -500 off the mask
    cfg = K.LossConfig(kl_estimator=kind)

    def loss(lp):
        return K.kl_loss(lp, ref, mask, config=cfg).value

    value, grad = jax.value_and_grad(loss)(jnp.asarray(logp))
    assert np.isfinite(float(value))
    grad = np.asarray(grad)
    assert np.all(np.isfinite(grad)) and np.all(grad[mask == 0] == 0)
    # On the mask the loss and its gradient are those of the clean inputs.
    clean_value, clean_grad = jax.value_and_grad(loss)(jnp.asarray(d["logp"]))
    assert float(value) == pytest.approx(float(clean_value), abs=ATOL)
    np.testing.assert_allclose(grad, np.asarray(clean_grad), rtol=0, atol=ATOL)
    # The estimate itself is 0 off the mask when given one, finite either way for the penalty.
    est = np.asarray(K.kl_estimate(jnp.asarray(logp), ref, kind, mask=mask))
    assert np.all(est[mask == 0] == 0) and np.all(np.isfinite(est))
    pen = np.asarray(K.kl_penalty(jnp.asarray(logp), ref, mask, kind=kind))
    assert np.all(np.isfinite(pen)) and np.all(pen[mask == 0] == 0)


def test_kl_penalty_enters_token_rewards():
    d = random_rollout(4)
    kl = K.kl_penalty(d["logp"], d["old"], d["mask"], kind="k1")
    rewards = jnp.zeros((d["mask"].shape[0], 8))
    r = np.asarray(K.token_rewards(rewards, d["step_ids"], d["mask"], kl, kl_coef=0.5))
    want = -0.5 * (d["logp"].astype(np.float64) - d["old"]) * d["mask"]
    np.testing.assert_allclose(r, want, rtol=0, atol=ATOL)


def test_entropy_matches_reference():
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, (2, 5, 11)).astype(np.float32)
    got = np.asarray(K.entropy_from_logits(jnp.asarray(logits)))
    for b in range(2):
        for t in range(5):
            z = logits[b, t].astype(np.float64)
            p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
            assert abs(got[b, t] - float(-(p * np.log(p)).sum())) <= ATOL
    uniform = K.entropy_from_logits(jnp.zeros((1, 1, 7)))
    assert float(uniform[0, 0]) == pytest.approx(math.log(7), abs=ATOL)
    bonus = K.entropy_bonus(jnp.asarray(got), jnp.ones((2, 5)), "token_mean")
    assert float(bonus.value) == pytest.approx(float(got.mean()), abs=ATOL)


def test_pg_loss_is_minus_advantage_times_logprob():
    d = random_rollout(5)
    loss, _ = K.get_policy_loss("pg")(d["logp"], d["old"], d["adv"], d["mask"])
    per = -(d["adv"].astype(np.float64) * d["logp"])
    assert abs(float(loss.value) - ref_aggregate(per, d["runs"], "token_mean")) <= ATOL


def test_loss_config_rejects_bad_values():
    with pytest.raises(ValueError, match="aggregation is 'mean'"):
        K.LossConfig(aggregation="mean")
    with pytest.raises(ValueError, match="dual_clip is 0.5"):
        K.LossConfig(dual_clip=0.5)
    with pytest.raises(ValueError, match="ratio_level is 'seq'"):
        K.LossConfig(ratio_level="seq")
    with pytest.raises(ValueError, match="step_ids is None"):
        K.ppo_loss(
            jnp.zeros((1, 2)), jnp.zeros((1, 2)), jnp.zeros((1, 2)), jnp.ones((1, 2)),
            config=K.LossConfig(ratio_level="action"),
        )  # fmt: skip
