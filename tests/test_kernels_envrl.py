"""ENVRL auxiliary examples, losses and the cosine weight schedule."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax import kernels as K

# Two trajectories: states are lists of token ids, one more state than actions in the first
# (the final state is known), as many in the second (its last step has no next state).
TRAJS = [
    ([[10, 11], [12], [13, 14, 15]], [[20], [21, 22]]),
    ([[30], [31, 32]], [[40, 41], [42]]),
]


def test_state_prediction_examples():
    ex = K.build_state_prediction(TRAJS, max_len=8, instruction_ids=[99], pad_id=0)
    assert ex.rows.tolist() == [0, 0, 1] and ex.steps.tolist() == [0, 1, 0]
    # [s_t, a_t, instruction, s_{t+1}], targets on s_{t+1}.
    assert ex.input_ids[0].tolist() == [10, 11, 20, 99, 12, 0, 0, 0]
    assert ex.target_mask[0].tolist() == [0, 0, 0, 0, 1, 0, 0, 0]
    assert ex.input_ids[1].tolist() == [12, 21, 22, 99, 13, 14, 15, 0]
    assert ex.target_mask[1].tolist() == [0, 0, 0, 0, 1, 1, 1, 0]
    assert ex.attention_mask[1].tolist() == [1, 1, 1, 1, 1, 1, 1, 0]
    assert ex.input_ids[2].tolist() == [30, 40, 41, 99, 31, 32, 0, 0]


def test_inverse_dynamics_examples_and_truncation():
    ex = K.build_inverse_dynamics(TRAJS, max_len=8, instruction_ids=[98])
    # [s_t, s_{t+1}, instruction, a_t], targets on a_t.
    assert ex.input_ids[0].tolist() == [10, 11, 12, 98, 20, 0, 0, 0]
    assert ex.target_mask[0].tolist() == [0, 0, 0, 0, 1, 0, 0, 0]
    assert ex.input_ids[1].tolist() == [12, 13, 14, 15, 98, 21, 22, 0]
    short = K.build_inverse_dynamics(TRAJS, max_len=5, instruction_ids=[98])
    # The oldest context goes first, then the front of s_{t+1}; the instruction and a_t stay.
    assert short.input_ids[1].tolist() == [14, 15, 98, 21, 22]
    assert short.target_mask[1].tolist() == [0, 0, 0, 1, 1]
    with pytest.raises(ValueError, match="3 states for 1 actions"):
        K.build_state_prediction([([[1], [2], [3]], [[4]])], max_len=8)
    with pytest.raises(ValueError, match="max_len is 1"):
        K.build_state_prediction(TRAJS, max_len=1, instruction_ids=[1])


# One step as ENVRL reads it: goal 1 2, history 3 4 5, newest observation 6 7, action 8 9, next
# observation 10 11 12.
STEP = K.Transition(goal=[1, 2], context=[3, 4, 5, 6, 7], action=[8, 9], next_obs=[10, 11, 12])


def test_transitions_keep_the_goal_and_cut_the_oldest_history_first():
    sp = K.build_state_prediction([[STEP]], max_len=16, instruction_ids=[99])
    assert sp.input_ids[0].tolist()[:13] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 99, 10, 11, 12]
    assert sp.target_mask[0].tolist()[:13] == [0] * 10 + [1] * 3
    inv = K.build_inverse_dynamics([[STEP]], max_len=16, instruction_ids=[98])
    assert inv.input_ids[0].tolist()[:13] == [1, 2, 3, 4, 5, 6, 7, 10, 11, 12, 98, 8, 9]
    # Over budget: the history between the goal and the newest observation goes first...
    sp = K.build_state_prediction([[STEP]], max_len=11, instruction_ids=[99])
    assert sp.input_ids[0].tolist() == [1, 2, 5, 6, 7, 8, 9, 99, 10, 11, 12]
    # ... then s_{t+1} (the target's end in SP, down to one token; the front in ID) ...
    sp = K.build_state_prediction([[STEP]], max_len=6, instruction_ids=[99])
    assert sp.input_ids[0].tolist() == [1, 2, 8, 9, 99, 10]
    inv = K.build_inverse_dynamics([[STEP]], max_len=6, instruction_ids=[98])
    assert inv.input_ids[0].tolist() == [1, 2, 12, 98, 8, 9]  # a_t whole
    # ... then a_t; the goal and the instruction stay.
    sp = K.build_state_prediction([[STEP]], max_len=5, instruction_ids=[99])
    assert sp.input_ids[0].tolist() == [1, 2, 9, 99, 10]
    inv = K.build_inverse_dynamics([[STEP]], max_len=4, instruction_ids=[98])
    assert inv.input_ids[0].tolist() == [1, 2, 98, 8]
    with pytest.raises(ValueError, match="step 0: max_len is 3; expected more than the goal's 2"):
        K.build_state_prediction([[STEP]], max_len=3, instruction_ids=[99])


def test_aux_loss_is_target_negative_log_likelihood():
    ex = K.build_state_prediction(TRAJS, max_len=8, instruction_ids=[99])
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 2, (3, 8, 100)).astype(np.float32)
    lp = K.target_logprobs(jnp.asarray(logits), jnp.asarray(ex.input_ids))
    total, count = 0.0, 0
    for n in range(3):
        for i in range(1, 8):
            if ex.target_mask[n, i]:
                z = logits[n, i - 1].astype(np.float64)
                logz = z.max() + math.log(np.exp(z - z.max()).sum())
                total += -(z[ex.input_ids[n, i]] - logz)
                count += 1
    loss = K.aux_loss(lp, jnp.asarray(ex.target_mask))
    assert float(loss.denominator) == count
    assert abs(float(loss.value) - total / count) <= 1e-5 * max(1.0, total / count)


def test_cosine_weights_and_total_loss():
    cfg = K.EnvrlConfig(sp_weight=0.2, id_weight=0.1, horizon=100)
    assert float(K.cosine_weight(0, 0.2, 100)) == pytest.approx(0.2)
    assert float(K.cosine_weight(50, 0.2, 100)) == pytest.approx(0.1)
    assert float(K.cosine_weight(25, 0.2, 100)) == pytest.approx(0.1 * (1 + math.cos(math.pi / 4)))
    assert float(K.cosine_weight(100, 0.2, 100)) == pytest.approx(0.0, abs=1e-9)
    assert float(K.cosine_weight(500, 0.2, 100)) == pytest.approx(0.0, abs=1e-9)
    total, w = jax.jit(K.envrl_total_loss, static_argnames="config")(
        jnp.float32(1.0), jnp.float32(2.0), jnp.float32(3.0), 50, config=cfg
    )
    assert float(total) == pytest.approx(1.0 + 0.1 * 2.0 + 0.05 * 3.0)
    assert float(w["envrl/sp_weight"]) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="horizon is 0"):
        K.EnvrlConfig(horizon=0)
