"""Host-side validation of the batch: bad input fails before compute, naming what is wrong."""

import numpy as np
import pytest

from agentrl_jax import kernels as K


def good():
    """Two rows: env, action(step 0), env, action(step 1) / env, action(step 0), padding."""
    return dict(
        loss_mask=np.array([[0, 1, 1, 0, 1], [0, 1, 0, 0, 0]]),
        step_ids=np.array([[-1, 0, 0, -1, 1], [-1, 0, -1, -1, -1]]),
        rewards=np.array([[0.0, 1.0, 0.0], [0.5, 0.0, 0.0]]),
        step_mask=np.array([[1, 1, 0], [1, 0, 0]]),
        group_ids=np.array([2**40, 2**40]),
        state_keys=np.array([[2**62, 5, 0], [2**62, 0, 0]], np.int64),
    )


def test_good_batch_and_dense_ids():
    batch = K.make_batch(**good())
    assert batch.shape == (2, 5, 3)
    assert batch.group_ids.tolist() == [0, 0]
    # (group, key) pairs: (g, 2**62) shared by both rows' step 0; (g, 5) unique.
    assert batch.state_ids[0, 0] == batch.state_ids[1, 0]
    assert batch.state_ids[0, 1] != batch.state_ids[0, 0]
    assert str(batch.state_ids.dtype) == "int32"


def test_same_key_in_different_groups_is_different_state():
    kw = good()
    kw["group_ids"] = np.array([1, 2])
    batch = K.make_batch(**kw)
    assert batch.state_ids[0, 0] != batch.state_ids[1, 0]


def test_string_state_keys_are_accepted():
    kw = good()
    kw["state_keys"] = np.array([["kitchen", "hall", ""], ["kitchen", "", ""]], object)
    batch = K.make_batch(**kw)
    assert batch.state_ids[0, 0] == batch.state_ids[1, 0]


@pytest.mark.parametrize(
    "field, value, message",
    [
        (
            "rewards",
            np.array([[0.0, np.nan, 0.0], [0.5, 0, 0]]),
            r"rewards is nan at index \(0, 1\)",
        ),
        ("rewards", np.array([[0.0, 0, np.inf], [0.5, 0, 0]]), r"rewards is inf at index \(0, 2\)"),
        (
            "rewards",
            np.zeros((3, 3)),
            r"rewards is of shape \(3, 3\); expected \[B, S\] with B = 2",
        ),
        ("step_ids", np.zeros((2, 4), int), r"step_ids is of shape \(2, 4\); expected \(2, 5\)"),
        ("step_mask", np.ones((2, 2)), r"step_mask is of shape \(2, 2\); expected \(2, 3\)"),
        ("group_ids", np.array([1, 2, 3]), r"group_ids is of shape \(3,\); expected \(2,\)"),
        ("state_keys", np.zeros((2, 4)), r"state_keys is of shape \(2, 4\); expected \(2, 3\)"),
        ("loss_mask", np.zeros(5), r"loss_mask is of shape \(5,\) \(1-D\)"),
        (
            "loss_mask",
            np.full((2, 5), 2),
            r"loss_mask is 2 at index \(0, 0\); expected only 0 and 1",
        ),
        ("step_mask", np.array([[1, 0, 1], [1, 0, 0]]), r"step_mask is \[1, 0, 1\] in row 0"),
        ("step_ids", np.array([[0, 0, 0, -1, 1], [-1, 0, -1, -1, -1]]), r"-1 off agent tokens"),
        ("step_ids", np.array([[-1, 0, 0, -1, 2], [-1, 0, -1, -1, -1]]), r"in \[0, 2\)"),
        ("step_ids", np.array([[-1, 1, 1, -1, 0], [-1, 0, -1, -1, -1]]), r"contiguous run"),
        ("step_ids", np.array([[-1, 0, 0, -1, 0], [-1, 0, -1, -1, -1]]), r"run of step 0 starting"),
        ("step_ids", np.zeros((2, 5)), r"dtype float64; expected an integer array"),
        ("bootstrap_values", np.zeros(3), r"bootstrap_values is of shape \(3,\); expected \(2,\)"),
        ("bootstrap_values", np.array([0.0, np.nan]), r"bootstrap_values is nan at index \(1,\)"),
    ],
)
def test_bad_input_names_the_argument(field, value, message):
    kw = good()
    kw[field] = value
    with pytest.raises(ValueError, match=message):
        K.make_batch(**kw)


def test_a_step_without_tokens_is_rejected():
    kw = good()
    kw["loss_mask"] = np.array([[0, 1, 1, 0, 0], [0, 1, 0, 0, 0]])
    kw["step_ids"] = np.array([[-1, 0, 0, -1, -1], [-1, 0, -1, -1, -1]])
    with pytest.raises(ValueError, match=r"1 actions in row 0 while step_mask has 2 real steps"):
        K.make_batch(**kw)


def test_estimators_check_their_extra_inputs():
    batch = K.make_batch(**good())
    cfg = K.AdvantageConfig()
    with pytest.raises(ValueError, match=r"gae: values is None"):
        K.gae(batch, cfg)
    with pytest.raises(ValueError, match=r"gae: values has shape \(2, 4\); expected \(2, 5\)"):
        K.gae(batch, cfg, values=np.zeros((2, 4)))
    with pytest.raises(ValueError, match=r"gae: values is nan at index \(1, 3\)"):
        values = np.zeros((2, 5))
        values[1, 3] = np.nan
        K.gae(batch, cfg, values=values)
    no_states = K.make_batch(**{**good(), "state_keys": None})
    with pytest.raises(ValueError, match=r"gagpo: batch.state_ids is None"):
        K.gagpo(no_states, cfg)
    with pytest.raises(ValueError, match=r"grpo: kl_coef is 0.1 with kl given"):
        K.grpo(batch, K.AdvantageConfig(kl_coef=0.1), kl=np.zeros((2, 5)))
    with pytest.raises(ValueError, match=r"AdvantageConfig.gamma is 1.5"):
        K.AdvantageConfig(gamma=1.5)
    with pytest.raises(ValueError, match=r"config is a dict"):
        K.grpo(batch, {"gamma": 1.0})
