"""Confidence intervals for the numbers the reports and studies print.

    wilson_interval(77, 100)                  # (0.6804, 0.8407): one success rate
    clustered_wilson_interval(wins, episodes) # the same, several episodes per game
    paired_difference(before, after)          # after - before on the same games, Newcombe
    t_interval([0.55, 0.62, 0.48])            # mean across seeds, Student t

- **One success rate** (k wins in n games): the Wilson score interval (Wilson 1927). Unlike the
  normal approximation it stays inside [0, 1] and keeps its coverage near 0% and 100% (0/10 gives
  [0, 27.8%], not [0, 0]).
- **Several episodes per game** (sampled evaluation plays each game G times): a game's
  episodes are alike (an easy game is won in most of them), so they are worth fewer than G
  independent ones. The rate is still wins / episodes, but its Wilson interval is taken at the
  effective sample size n / deff (Kish 1965), with deff the design effect of the games as
  clusters: the ratio estimator's variance over games, sum_i (w_i - p n_i)^2 / n^2, against the
  binomial p (1 - p) / n, never below 1. With one episode per game it is exactly 1 (the plain
  Wilson interval); when every game's episodes agree it is n / k, the Wilson interval of the
  k games.
- **Two rates on the same games** (before/after RL, free/constrained): Newcombe's method 10 for
  paired data (Newcombe 1998, Statistics in Medicine 17:2635, "square and add" of the two Wilson
  intervals with the correlation of the paired outcomes, corrected as in Fagerland, Lydersen and
  Laake, Statistical Analysis of Contingency Tables, 2017, ch. 8). Pairing matters: games the
  two policies both win or both lose say nothing about the difference, so the paired interval
  is narrower than one that treats the two runs as independent samples.
- **Across seeds** (a study's variant over its seeds, or its difference to the baseline paired by
  seed): the Student t interval of the mean, which accounts for having only a few seeds. One seed
  has no spread: its bounds are NaN (``null`` in JSON, ``n/a`` in tables), never a made-up width.

All intervals are two-sided at ``confidence`` (default 0.95).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

CONFIDENCE = 0.95


def _z(confidence: float) -> float:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence {confidence!r}: expected a level in (0, 1), e.g. 0.95")
    from scipy.stats import norm  # noqa: PLC0415 - scipy comes with jax; only loaded when used.

    return float(norm.ppf(0.5 + confidence / 2.0))


def _counts(wins: int, n: int) -> None:
    if isinstance(wins, bool) or isinstance(n, bool) or int(wins) != wins or int(n) != n:
        raise ValueError(f"wins={wins!r}, n={n!r}: expected whole counts")
    if not 0 <= wins <= n:
        raise ValueError(f"wins={wins}, n={n}: expected 0 <= wins <= n")


def wilson_interval(
    wins: int, n: int, confidence: float = CONFIDENCE, *, design_effect: float = 1.0
) -> tuple[float, float]:
    """The Wilson score interval of a success rate.

    Args:
      wins: successes, 0 <= wins <= n.
      n: trials (games); 0 gives (nan, nan).
      confidence: the two-sided level.
      design_effect: >= 1; the interval of ``wins / n`` at the effective sample size
        ``n / design_effect`` (correlated trials: see :func:`design_effect`). 1 is the plain
        Wilson interval.

    Returns:
      (low, high), within [0, 1].
    """
    _counts(wins, n)
    z = _z(confidence)
    if isinstance(design_effect, bool) or not (
        isinstance(design_effect, (int, float)) and 1.0 <= design_effect < math.inf
    ):
        raise ValueError(f"design_effect={design_effect!r}; expected a number >= 1 (1: none)")
    if n == 0:
        return float("nan"), float("nan")
    p = wins / n
    # The effective sample size (the rate stays wins / n); n itself without a design effect.
    m = n if design_effect == 1.0 else n / design_effect
    denom = 1.0 + z * z / m
    center = (p + z * z / (2 * m)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / m + z * z / (4 * m * m))
    # At 0 or n wins one bound is exactly the observed rate; rounding must not push it past.
    low = 0.0 if wins == 0 else max(0.0, center - half)
    high = 1.0 if wins == n else min(1.0, center + half)
    return low, high


def design_effect(wins: Sequence[int], episodes: Sequence[int]) -> float:
    """Kish's design effect of a success rate measured over games of several episodes each.

    With w_i wins in n_i episodes of game i (k games, n = sum n_i, p = sum w_i / n)::

        deff = max(1, [sum_i (w_i - p n_i)^2 / n^2] / [p (1 - p) / n])

    the ratio estimator's variance over games (clusters) against the binomial variance of n
    independent episodes. It is exactly 1 with one episode per game. Where the games cannot show
    how alike their episodes are (a single game, or p of 0 or 1) it is n / k: each game counts
    as one observation, as if its episodes all agreed.

    Args:
      wins: wins per game.
      episodes: counted episodes per game (each >= 1), in the same order.

    Returns:
      The design effect, >= 1 (1 without games).
    """
    if len(wins) != len(episodes):
        raise ValueError(
            f"design_effect: {len(wins)} wins counts but {len(episodes)} episode counts; "
            "expected one of each per game"
        )
    for w, m in zip(wins, episodes):
        _counts(w, m)
    k, n, total = len(episodes), sum(episodes), sum(wins)
    if n == k:  # one episode per game (or none): independent episodes
        return 1.0
    if k < 2 or total in (0, n):
        return n / k
    p = total / n
    between = sum((w - p * m) ** 2 for w, m in zip(wins, episodes)) / (n * n)
    return max(1.0, between / (p * (1.0 - p) / n))


def clustered_wilson_interval(
    wins: Sequence[int], episodes: Sequence[int], confidence: float = CONFIDENCE
) -> tuple[float, float]:
    """The Wilson interval of ``sum(wins) / sum(episodes)`` with episodes clustered by game.

    Args:
      wins, episodes: per game, as :func:`design_effect` reads them.
      confidence: the two-sided level.

    Returns:
      (low, high): :func:`wilson_interval` at the effective sample size; exactly the plain
      Wilson interval with one episode per game.
    """
    deff = design_effect(wins, episodes)
    return wilson_interval(sum(wins), sum(episodes), confidence, design_effect=deff)


@dataclasses.dataclass(frozen=True)
class PairedDifference:
    """``after - before`` success rate on the same games, with Newcombe's paired interval.

    Attributes:
      n: games counted in both runs.
      both: games both won; only_after: won after but not before; only_before: the reverse;
        neither: lost in both. Only the discordant games (only_after, only_before) move the
        difference.
      diff: (only_after - only_before) / n.
      low, high: the interval of ``diff`` (NaN when n is 0).
    """

    n: int
    both: int
    only_after: int
    only_before: int
    neither: int
    diff: float
    low: float
    high: float

    def to_json(self) -> dict:
        return {
            k: (None if isinstance(v, float) and math.isnan(v) else v)
            for k, v in vars(self).items()
        }


def paired_difference(
    before: Sequence[bool], after: Sequence[bool], confidence: float = CONFIDENCE
) -> PairedDifference:
    """The difference of two success rates measured on the same games (Newcombe's method 10).

    Args:
      before, after: the outcome of each game, in the same order (game i of ``before`` is
        game i of ``after``).
      confidence: the two-sided level.

    Returns:
      PairedDifference of ``after - before``.
    """
    if len(before) != len(after):
        raise ValueError(
            f"paired_difference: {len(before)} outcomes before but {len(after)} after; expected "
            "one outcome per game in each, in the same order"
        )
    pairs = [(bool(b), bool(a)) for b, a in zip(before, after)]
    n = len(pairs)
    both = sum(a and b for b, a in pairs)
    only_after = sum(a and not b for b, a in pairs)
    only_before = sum(b and not a for b, a in pairs)
    neither = n - both - only_after - only_before
    if n == 0:
        nan = float("nan")
        return PairedDifference(0, 0, 0, 0, 0, nan, nan, nan)
    after_wins, before_wins = both + only_after, both + only_before
    p1, p2 = after_wins / n, before_wins / n
    l1, u1 = wilson_interval(after_wins, n, confidence)
    l2, u2 = wilson_interval(before_wins, n, confidence)
    # The correlation of the paired outcomes; |ad - bc| up to n/2 counts as no correlation
    # (Newcombe's continuity correction of phi). A margin of 0 leaves phi 0.
    margins = after_wins * (n - after_wins) * before_wins * (n - before_wins)
    cross = both * neither - only_after * only_before
    if margins == 0:
        phi = 0.0
    elif cross > n / 2:
        phi = (cross - n / 2) / math.sqrt(margins)
    elif cross >= 0:
        phi = 0.0
    else:
        phi = cross / math.sqrt(margins)
    diff = p1 - p2
    d1, d2 = p1 - l1, u2 - p2  # below p1, above p2: how far diff can fall
    e1, e2 = u1 - p1, p2 - l2  # how far it can rise
    low = diff - math.sqrt(max(0.0, d1 * d1 + d2 * d2 - 2 * phi * d1 * d2))
    high = diff + math.sqrt(max(0.0, e1 * e1 + e2 * e2 - 2 * phi * e1 * e2))
    return PairedDifference(
        n, both, only_after, only_before, neither, diff, max(-1.0, low), min(1.0, high)
    )


def t_interval(
    values: Sequence[float], confidence: float = CONFIDENCE
) -> tuple[float, float, float]:
    """The mean of ``values`` and its Student t interval (seeds are few: t, not normal).

    Returns:
      (mean, low, high); with one value the bounds are NaN; with none, everything is.
    """
    xs = [float(v) for v in values]
    n = len(xs)
    nan = float("nan")
    if n == 0:
        return nan, nan, nan
    mean = sum(xs) / n
    if n == 1:
        return mean, nan, nan
    _z(confidence)  # validates the level
    from scipy.stats import t  # noqa: PLC0415

    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = float(t.ppf(0.5 + confidence / 2.0, n - 1)) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def rate_json(
    wins: int, n: int, confidence: float = CONFIDENCE, *, design_effect: float = 1.0
) -> dict:
    """``{"wins", "n", "rate", "low", "high"}`` of a success rate (nulls when n is 0); the
    interval is :func:`wilson_interval`'s with ``design_effect``."""
    low, high = wilson_interval(wins, n, confidence, design_effect=design_effect)
    rate = wins / n if n else float("nan")
    out = {"wins": wins, "n": n, "rate": rate, "low": low, "high": high}
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in out.items()}


def fmt_interval(low: float, high: float, scale: float = 100.0, digits: int = 1) -> str:
    """``[68.0, 84.1]`` in percent (``n/a`` for a NaN bound)."""
    if math.isnan(low) or math.isnan(high):
        return "n/a"
    return f"[{scale * low:.{digits}f}, {scale * high:.{digits}f}]"


__all__ = [
    "CONFIDENCE",
    "PairedDifference",
    "clustered_wilson_interval",
    "design_effect",
    "fmt_interval",
    "paired_difference",
    "rate_json",
    "t_interval",
    "wilson_interval",
]
