"""Confidence intervals against published figures and scipy's independent implementation."""

import math

import pytest
from scipy.stats import binomtest

from agentrl_jax import stats

# Newcombe (1998), Statistics in Medicine 17:857, Table II, method 3 (Wilson score, no
# continuity correction), to the 4 decimals printed there.
PUBLISHED_WILSON = [
    (81, 263, 0.2553, 0.3662),
    (15, 148, 0.0624, 0.1605),
    (0, 20, 0.0000, 0.1611),
    (1, 29, 0.0061, 0.1718),
]


@pytest.mark.parametrize("wins, n, low, high", PUBLISHED_WILSON)
def test_wilson_matches_newcombes_table(wins, n, low, high):
    got = stats.wilson_interval(wins, n)
    assert got == pytest.approx((low, high), abs=5e-5)


@pytest.mark.parametrize("wins, n", [(0, 10), (5, 10), (77, 100), (200, 200), (1, 1)])
def test_wilson_matches_scipy(wins, n):
    ci = binomtest(wins, n).proportion_ci(confidence_level=0.95, method="wilson")
    assert stats.wilson_interval(wins, n) == pytest.approx((ci.low, ci.high), abs=1e-12)
    ci90 = binomtest(wins, n).proportion_ci(confidence_level=0.9, method="wilson")
    assert stats.wilson_interval(wins, n, 0.9) == pytest.approx((ci90.low, ci90.high), abs=1e-12)


def test_wilson_hand_computed_and_edges():
    # 5/10: center 0.5, half-width z/(1+z^2/10) * sqrt(0.025 + z^2/400) with z = 1.959964.
    z = 1.959963984540054
    half = z / (1 + z * z / 10) * math.sqrt(0.025 + z * z / 400)
    assert stats.wilson_interval(5, 10) == pytest.approx((0.5 - half, 0.5 + half), abs=1e-12)
    assert stats.wilson_interval(0, 10)[0] == 0.0 and stats.wilson_interval(10, 10)[1] == 1.0
    assert all(math.isnan(x) for x in stats.wilson_interval(0, 0))
    with pytest.raises(ValueError, match="0 <= wins <= n"):
        stats.wilson_interval(11, 10)
    with pytest.raises(ValueError, match="confidence"):
        stats.wilson_interval(1, 10, confidence=95)


def _pairs(both, only_after, only_before, neither):
    before = [1] * both + [0] * only_after + [1] * only_before + [0] * neither
    after = [1] * both + [1] * only_after + [0] * only_before + [0] * neither
    return before, after


def test_paired_difference_matches_the_published_example():
    # Fagerland, Lydersen & Laake (2017), ch. 8: complete response before and after
    # consolidation therapy (Cavo et al. 2012), table [[59, 6], [16, 80]]: the Newcombe
    # square-and-add interval of p1+ - p+1 is -0.0621 (-0.1186 to -0.0046).
    before, after = _pairs(both=59, only_after=6, only_before=16, neither=80)
    d = stats.paired_difference(before, after)
    assert (d.n, d.both, d.only_after, d.only_before, d.neither) == (161, 59, 6, 16, 80)
    assert (d.diff, d.low, d.high) == pytest.approx((-0.0621, -0.1186, -0.0046), abs=5e-5)
    # Swapping the runs mirrors the interval.
    r = stats.paired_difference(after, before)
    assert (r.diff, r.low, r.high) == pytest.approx((-d.diff, -d.high, -d.low), abs=1e-12)


def test_paired_difference_is_narrower_than_independent_when_outcomes_agree():
    # 200 games, the policies agree on 180: pairing removes most of the noise.
    before, after = _pairs(both=120, only_after=15, only_before=5, neither=60)
    d = stats.paired_difference(before, after)
    assert d.diff == pytest.approx(0.05)
    l1, u1 = stats.wilson_interval(135, 200)
    l2, u2 = stats.wilson_interval(125, 200)
    unpaired = math.hypot(0.675 - l1, u2 - 0.625)  # Newcombe's unpaired lower half-width
    assert d.diff - d.low < unpaired
    assert d.low > 0.0  # 15 vs 5 discordant games: a real gain


def test_paired_difference_edges():
    assert stats.paired_difference([1, 1], [1, 1]).diff == 0.0  # no margin: phi 0, no crash
    d = stats.paired_difference([0] * 10, [1] * 10)
    assert d.diff == 1.0 and d.high == 1.0 and 0.5 < d.low < 1.0
    assert math.isnan(stats.paired_difference([], []).low)
    with pytest.raises(ValueError, match="2 outcomes before but 1 after"):
        stats.paired_difference([1, 0], [1])


def test_t_interval_hand_computed():
    mean, low, high = stats.t_interval([0.55, 0.62, 0.48])
    sd = math.sqrt(((0.0) ** 2 + 0.07**2 + 0.07**2) / 2)
    half = 4.302652729749464 * sd / math.sqrt(3)  # t(0.975, 2 df)
    assert (mean, low, high) == pytest.approx((0.55, 0.55 - half, 0.55 + half), abs=1e-12)
    one = stats.t_interval([0.4])
    assert one[0] == 0.4 and math.isnan(one[1]) and math.isnan(one[2])
    assert all(math.isnan(x) for x in stats.t_interval([]))


def test_rate_json_and_format():
    assert stats.rate_json(0, 0) == {"wins": 0, "n": 0, "rate": None, "low": None, "high": None}
    r = stats.rate_json(77, 100)
    assert r["rate"] == 0.77 and r["low"] == pytest.approx(0.678456, abs=1e-6)
    assert stats.fmt_interval(r["low"], r["high"]) == "[67.8, 84.2]"
    assert stats.fmt_interval(float("nan"), 1.0) == "n/a"


def _reference_design_effect(wins, episodes):
    """Kish's design effect by the textbook formulas, written out here: the ratio estimator's
    variance over games (clusters) against the binomial variance of independent episodes."""
    n = sum(episodes)
    p = sum(wins) / n
    var_games = sum((w - p * m) ** 2 for w, m in zip(wins, episodes)) / n**2
    var_independent = p * (1 - p) / n
    return var_games / var_independent


def test_one_episode_per_game_is_exactly_the_wilson_interval():
    """Greedy evaluation plays each game once: the clustered interval is today's Wilson, bit for
    bit."""
    for wins, n in [(31, 50), (0, 7), (7, 7), (3, 5)]:
        outcomes = [1] * wins + [0] * (n - wins)
        assert stats.design_effect(outcomes, [1] * n) == 1.0
        assert stats.clustered_wilson_interval(outcomes, [1] * n) == stats.wilson_interval(wins, n)


def test_games_whose_episodes_agree_count_as_one_observation_each():
    # 6 games x 5 sampled episodes, a game won in all or none of them: 6 games' worth of
    # evidence, not 30 episodes' (scipy's Wilson of 4 / 6, against 20 / 30 independent ones).
    wins, episodes = [5, 5, 5, 5, 0, 0], [5] * 6
    assert stats.design_effect(wins, episodes) == pytest.approx(5.0, abs=1e-12)
    ci = binomtest(4, 6).proportion_ci(confidence_level=0.95, method="wilson")
    got = stats.clustered_wilson_interval(wins, episodes)
    assert got == pytest.approx((ci.low, ci.high), abs=1e-12)
    naive = stats.wilson_interval(20, 30)
    assert got[0] < naive[0] and got[1] > naive[1]
    # Every episode won (or lost): nothing shows how alike a game's episodes are; the games are
    # the units (the interval of 6 / 6, not of 30 / 30).
    assert stats.clustered_wilson_interval([5] * 6, [5] * 6) == pytest.approx(
        stats.wilson_interval(6, 6), abs=1e-12
    )
    assert stats.clustered_wilson_interval([0, 0], [3, 3]) == pytest.approx(
        stats.wilson_interval(0, 2), abs=1e-12
    )


def test_clustered_interval_is_wilson_at_the_effective_sample_size():
    # 4 games x 4 episodes, wins 4, 2, 2, 0: p = 1/2, variance over games 1/32 against 1/64
    # for 16 independent episodes: design effect 2, the Wilson interval of 4 / 8 (scipy's).
    wins, episodes = [4, 2, 2, 0], [4, 4, 4, 4]
    assert stats.design_effect(wins, episodes) == pytest.approx(2.0, abs=1e-12)
    ci = binomtest(4, 8).proportion_ci(confidence_level=0.95, method="wilson")
    got = stats.clustered_wilson_interval(wins, episodes)
    assert got == pytest.approx((ci.low, ci.high), abs=1e-12)
    # Unequal games (an infrastructure failure cost some episodes): the textbook formula.
    wins, episodes = [3, 1, 0, 2, 4], [4, 2, 3, 4, 4]
    deff = _reference_design_effect(wins, episodes)
    assert deff > 1 and stats.design_effect(wins, episodes) == pytest.approx(deff, rel=1e-12)
    n_eff, p = 17 / deff, 10 / 17
    z = 1.959963984540054
    center = (p + z * z / (2 * n_eff)) / (1 + z * z / n_eff)
    half = z / (1 + z * z / n_eff) * math.sqrt(p * (1 - p) / n_eff + z * z / (4 * n_eff**2))
    assert stats.clustered_wilson_interval(wins, episodes) == pytest.approx(
        (center - half, center + half), abs=1e-12
    )
    # Episodes less alike within a game than across games never narrow the interval below the
    # independent one (design effect at least 1).
    assert stats.design_effect([1, 1, 1, 1], [2, 2, 2, 2]) == 1.0
    with pytest.raises(ValueError, match=r"design_effect: 2 wins counts but 3 episode counts"):
        stats.design_effect([1, 1], [2, 2, 2])
    with pytest.raises(ValueError, match=r"wins=3, n=2"):
        stats.design_effect([3], [2])
    with pytest.raises(ValueError, match=r"design_effect=0.5; expected a number >= 1"):
        stats.wilson_interval(1, 2, design_effect=0.5)
