"""The SFT-to-RL budget: 10 units per demonstration, 1 per RL episode, split as configured."""

import dataclasses

import pytest

from agentrl_jax.run.budget import from_config, split_budget


@pytest.mark.parametrize(
    "total, fraction, demos, episodes",
    [
        (2000, 0.5, 100, 1000),  # the default config
        (1000, 0.3, 30, 700),  # 0.3 * 1000 is 300.00000000000006 in floats: still 30 demos
        (1000, 0.0, 0, 1000),  # RL only
        (1000, 1.0, 100, 0),  # SFT only
        (1005, 1.0, 100, 5),  # units that buy no whole demonstration go to RL
        (95, 0.5, 4, 55),  # 47.5 units for SFT -> 4 demos (40 units); 55 units left for RL
        (9, 1.0, 0, 9),  # too little for one demonstration
        (0, 0.5, 0, 0),
    ],
)
def test_split_matches_hand_computed_counts(total, fraction, demos, episodes):
    split = split_budget(total, fraction)
    assert (split.num_demos, split.num_rl_episodes) == (demos, episodes)
    assert split.sft_units == 10 * demos and split.rl_units == episodes
    assert split.sft_units + split.rl_units + split.unused_units == total
    assert split.unused_units == 0  # with unit-cost episodes the whole budget is spent


def test_other_costs_and_leftovers():
    split = split_budget(100, 0.5, demo_cost=20, episode_cost=3)
    # 50 units -> 2 demos (40 units); 60 units -> 20 episodes (60 units); nothing left.
    assert (split.num_demos, split.num_rl_episodes, split.unused_units) == (2, 20, 0)
    split = split_budget(101, 0.5, demo_cost=20, episode_cost=3)
    # floor(50.5) = 50 units -> 2 demos; 61 units -> 20 episodes; 1 unit left.
    assert (split.num_demos, split.num_rl_episodes, split.unused_units) == (2, 20, 1)


def test_rl_iterations():
    split = split_budget(2000, 0.5)
    assert split.rl_iterations(8 * 4) == 31  # 1000 episodes at 32 per iteration
    with pytest.raises(ValueError, match="episodes_per_iteration is 0"):
        split.rl_iterations(0)


@dataclasses.dataclass
class _Section:
    total: object = 2000
    sft_fraction: object = 0.5


def test_from_config_reads_the_budget_section():
    assert from_config(_Section(total=300, sft_fraction=0.5)).num_demos == 15
    assert from_config(_Section(total=300.0, sft_fraction=0.5)).num_rl_episodes == 150


@pytest.mark.parametrize(
    "total, fraction, message",
    [
        (-1, 0.5, r"config.budget.total is -1; expected an integer >= 0"),
        (10.5, 0.5, r"config.budget.total is 10.5"),
        (True, 0.5, r"config.budget.total is True"),
        (100, 1.5, r"config.budget.sft_fraction is 1.5; expected in \[0, 1\]"),
        (100, -0.1, r"config.budget.sft_fraction is -0.1"),
        (100, float("nan"), r"config.budget.sft_fraction is nan"),
        (100, "half", r"config.budget.sft_fraction is 'half'"),
    ],
)
def test_invalid_values_fail_with_the_field_name(total, fraction, message):
    with pytest.raises(ValueError, match=message):
        from_config(_Section(total=total, sft_fraction=fraction))


def test_invalid_costs_and_missing_fields():
    with pytest.raises(ValueError, match="demo_cost is 0"):
        split_budget(100, 0.5, demo_cost=0)
    with pytest.raises(ValueError, match="no field 'sft_fraction'"):
        from_config(type("S", (), {"total": 10})())
