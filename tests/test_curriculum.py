"""Curriculum: exact mixtures, schedule and success advancement, JSON state round trip."""

import json

import numpy as np
import pytest

from agentrl_jax.rollout.curriculum import Curriculum, CurriculumConfig


def test_mixture_proportions_are_exact():
    cur = Curriculum(CurriculumConfig(stages=((("simple", 1.0), ("medium", 1.0)),)))
    levels = cur.sample_levels(10, np.random.default_rng(0))
    assert sorted(levels) == ["medium"] * 5 + ["simple"] * 5
    levels = cur.sample_levels(7, np.random.default_rng(1))
    assert abs(levels.count("simple") - levels.count("medium")) == 1


def test_schedule_advances_after_fixed_iterations():
    cfg = CurriculumConfig(stages=((("simple", 1.0),), (("medium", 1.0),)), stage_iterations=(2, 5))
    cur = Curriculum(cfg)
    assert not cur.update([False])
    assert cur.update([False])
    assert cur.mixture() == {"medium": 1.0}
    for _ in range(10):
        assert not cur.update([True])  # the last stage lasts


def test_success_threshold_advances_on_rolling_window():
    cfg = CurriculumConfig(stages=((("simple", 1.0),), (("hard", 1.0),)), advance_at=0.75, window=4)
    cur = Curriculum(cfg)
    assert not cur.update([True, True, True])  # 3 episodes: the window of 4 is not full yet
    assert not cur.update([False, False])  # window [T, T, F, F]: 0.5 < 0.75
    assert not cur.update([True])  # window [T, F, F, T]: 0.5
    assert cur.update([True, True])  # window [F, T, T, T]: 0.75 -> next stage
    assert cur.stage == 1 and cur.mixture() == {"hard": 1.0}
    assert cur.success_rate() == 0.0  # the new stage starts its own window


def test_state_round_trips_through_json():
    cfg = CurriculumConfig(stages=((("a", 1.0),), (("b", 1.0),)), advance_at=0.9, window=8)
    cur = Curriculum(cfg)
    cur.update([True, False, True])
    state = json.loads(json.dumps(cur.state_dict()))
    other = Curriculum(cfg)
    other.load_state_dict(state)
    assert other.state_dict() == cur.state_dict()
    assert other.success_rate() == pytest.approx(2 / 3)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(stages=()), "at least one stage"),
        (dict(stages=((("a", -1.0),),)), "non-negative"),
        (dict(stages=((("a", 1.0),),), stage_iterations=(1, 2)), "one per stage"),
        (dict(stages=((("a", 1.0),),), advance_at=1.5), "advance_at"),
    ],
)
def test_bad_config_names_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CurriculumConfig(**kwargs)
