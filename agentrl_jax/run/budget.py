"""The SFT-to-RL budget of the practitioner's guide, in its units.

The guide prices data in one currency: an expert demonstration for SFT costs 10 units (it needs an
expert: a human, a planner or a stronger model), an RL episode costs 1 (the policy plays it
alone). A run gets a total budget and the share of it spent on SFT; the rest buys RL episodes:

    split = split_budget(total=2000, sft_fraction=0.5)
    split.num_demos        # 100 demonstrations = 1000 units
    split.num_rl_episodes  # 1000 episodes     = 1000 units

Demonstrations are whole: the SFT share is rounded down to a multiple of the demonstration cost,
and the units that rounding frees go to RL, so the whole budget is always spent (up to less than
one RL episode's cost).
"""

from __future__ import annotations

import dataclasses
import math

SFT_DEMO_COST = 10
RL_EPISODE_COST = 1


@dataclasses.dataclass(frozen=True)
class BudgetSplit:
    """Attributes:
    total: the budget, in units.
    sft_fraction: the share of ``total`` asked for SFT.
    num_demos: expert demonstrations to collect for SFT.
    num_rl_episodes: RL episodes to play.
    sft_units, rl_units: what they cost.
    unused_units: left over (less than one RL episode's cost).
    """

    total: int
    sft_fraction: float
    num_demos: int
    num_rl_episodes: int
    sft_units: int
    rl_units: int
    unused_units: int

    def rl_iterations(self, episodes_per_iteration: int) -> int:
        """RL iterations the episodes pay for (whole iterations only, rounded down).

        Args:
          episodes_per_iteration: tasks per iteration times the group size G.
        """
        if episodes_per_iteration < 1:
            raise ValueError(
                f"episodes_per_iteration is {episodes_per_iteration}; expected >= 1 "
                "(rl.tasks_per_iteration * rollout.group_size)"
            )
        return self.num_rl_episodes // episodes_per_iteration


def split_budget(
    total: int,
    sft_fraction: float,
    *,
    demo_cost: int = SFT_DEMO_COST,
    episode_cost: int = RL_EPISODE_COST,
) -> BudgetSplit:
    """Splits ``total`` units into demonstrations and RL episodes.

    Args:
      total: the budget in units (config.budget.total), >= 0.
      sft_fraction: the share spent on SFT (config.budget.sft_fraction), in [0, 1].
      demo_cost: units per demonstration (the guide: 10).
      episode_cost: units per RL episode (the guide: 1).

    Returns:
      The BudgetSplit. Raises ValueError, naming the config field, on any invalid value.
    """
    if isinstance(total, bool) or not isinstance(total, int) or total < 0:
        raise ValueError(f"config.budget.total is {total!r}; expected an integer >= 0 (units)")
    if (
        isinstance(sft_fraction, bool)
        or not isinstance(sft_fraction, (int, float))
        or not math.isfinite(sft_fraction)
        or not 0.0 <= sft_fraction <= 1.0
    ):
        raise ValueError(f"config.budget.sft_fraction is {sft_fraction!r}; expected in [0, 1]")
    for name, cost in (("demo_cost", demo_cost), ("episode_cost", episode_cost)):
        if isinstance(cost, bool) or not isinstance(cost, int) or cost < 1:
            raise ValueError(f"budget {name} is {cost!r}; expected an integer >= 1 (units)")
    # Exact for fractions given as decimals (0.3 * 1000 must be 300 units, not 299.99...).
    sft_share = math.floor(round(total * sft_fraction, 9))
    num_demos = sft_share // demo_cost
    sft_units = num_demos * demo_cost
    num_episodes = (total - sft_units) // episode_cost
    rl_units = num_episodes * episode_cost
    return BudgetSplit(
        total=total,
        sft_fraction=float(sft_fraction),
        num_demos=num_demos,
        num_rl_episodes=num_episodes,
        sft_units=sft_units,
        rl_units=rl_units,
        unused_units=total - sft_units - rl_units,
    )


def from_config(budget) -> BudgetSplit:
    """The split of a config section with ``total`` and ``sft_fraction`` (``BudgetSection``)."""
    for name in ("total", "sft_fraction"):
        if not hasattr(budget, name):
            raise ValueError(
                f"config.budget has no field {name!r}; expected fields total and sft_fraction"
            )
    total = budget.total
    if isinstance(total, float) and total.is_integer():
        total = int(total)  # A ConfigDict override from the command line may arrive as 2000.0.
    return split_budget(total, budget.sft_fraction)


__all__ = ["RL_EPISODE_COST", "SFT_DEMO_COST", "BudgetSplit", "from_config", "split_budget"]
