"""The run state (run/state.py): its JSON round trip, checkpoint metas of every version, and the
restore of an old checkpoint whose frozen reference sits in the state tree (``has_ref``)."""

import copy
import os

import jax
import numpy as np
import pytest
import train_cli

from agentrl_jax.run.config import from_config_dict
from agentrl_jax.run.state import CheckpointMeta, RunState, restore_latest

CURRICULUM = {"stage": 1, "stage_iteration": 4, "recent": [1, 0, 1]}
EVALS = {"after_sft": {"simple": {"num_tasks": 2, "overall": {"episodes": 2, "wins": 1}}}}

# Metas as the trainer's untyped dict wrote them, one per kind of checkpoint.
OLD_METAS = {
    # SFT, at the end of epoch 1 (the iterator's position; no evaluation yet).
    "sft": {
        "phase": "sft",
        "rl_iteration": 0,
        "evals": {},
        "sft_iterator": {"next_index": 2, "epoch": 1},
        "checkpoint": 0,
        "curriculum": {"stage": 0, "stage_iteration": 0, "recent": []},
    },
    # RL, the reference beside the checkpoints.
    "rl": {
        "phase": "rl",
        "rl_iteration": 3,
        "evals": EVALS,
        "checkpoint": 4,
        "curriculum": CURRICULUM,
        "reference": "reference",
    },
    # The run's end, the KL term off (no reference).
    "done": {
        "phase": "done",
        "rl_iteration": 5,
        "evals": EVALS,
        "checkpoint": 7,
        "curriculum": CURRICULUM,
    },
    # Older: the reference inside the state tree.
    "has_ref": {
        "phase": "rl",
        "rl_iteration": 1,
        "evals": EVALS,
        "checkpoint": 2,
        "curriculum": CURRICULUM,
        "has_ref": True,
    },
}


def test_a_fresh_run_state_is_the_old_initial_meta():
    assert RunState().to_json() == {"phase": "sft", "rl_iteration": 0, "evals": {}}


def test_the_run_state_round_trips_through_json():
    evals = copy.deepcopy(EVALS)
    state = RunState(
        phase="rl", rl_iteration=3, evals=evals, checkpoint=4, sft_iterator={"next_index": 6}
    )
    data = state.to_json()
    assert data == {
        "phase": "rl",
        "rl_iteration": 3,
        "evals": EVALS,
        "checkpoint": 4,
        "sft_iterator": {"next_index": 6},
    }
    assert RunState.from_json(data) == state
    # A copy: the write may happen while the run goes on.
    state.evals["rl_4"] = {}
    state.sft_iterator["next_index"] = 8
    assert "rl_4" not in data["evals"] and data["sft_iterator"] == {"next_index": 6}


@pytest.mark.parametrize("kind", sorted(OLD_METAS))
def test_every_old_meta_reads_and_is_written_back_unchanged(kind):
    old = OLD_METAS[kind]
    meta = CheckpointMeta.from_json(old)
    assert meta.run.phase == old["phase"] and meta.run.rl_iteration == old["rl_iteration"]
    assert meta.run.checkpoint == old["checkpoint"] and meta.run.evals == old["evals"]
    assert meta.run.sft_iterator == old.get("sft_iterator")
    assert meta.curriculum == old["curriculum"]
    assert meta.reference == old.get("reference")
    assert meta.has_ref == old.get("has_ref", False)
    # The same keys and values: a checkpoint written now is read by the code before it.
    assert meta.to_json() == old


def test_the_evaluations_are_read_by_name():
    state = RunState.from_json(OLD_METAS["rl"])
    assert state.evaluation("after_sft") == EVALS["after_sft"]
    with pytest.raises(KeyError, match=r"no evaluation 'after_rl'; the run has \['after_sft'\]"):
        state.evaluation("after_rl")


def test_a_meta_of_another_program_is_refused():
    with pytest.raises(ValueError, match=r"unknown keys \['step'\], missing keys \[\]"):
        CheckpointMeta.from_json(dict(OLD_METAS["rl"], step=3))
    with pytest.raises(ValueError, match=r"missing keys \['curriculum'\]"):
        CheckpointMeta.from_json({"phase": "rl", "rl_iteration": 0})
    with pytest.raises(ValueError, match="phase 'eval'"):
        RunState(phase="eval")


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


@pytest.mark.parametrize("reference", [True, False])
def test_an_old_checkpoint_with_its_reference_in_the_state_tree_restores(tmp_path, reference):
    """``has_ref``: the reference was saved in every checkpoint's state tree (item ``ref``)."""
    from agentrl_jax.models import CausalLM
    from agentrl_jax.models.testing import random_model
    from agentrl_jax.run.build import rl_learner
    from agentrl_jax.run.checkpoint import Checkpointer

    config = from_config_dict(train_cli.tiny_config(rl=dict(kl_coef=0.05)), num_devices=1)
    policy = random_model(CausalLM)
    learner = rl_learner(config, policy, None)
    state = learner.init(policy)
    ref = jax.tree.map(lambda x: x - 1.0, state.policy)
    directory = os.path.join(tmp_path, "checkpoints")
    written = Checkpointer(directory, keep_last=2, keep_best=0, async_save=False)
    written.save(2, {"train": state, "ref": ref}, OLD_METAS["has_ref"])
    written.close()
    ckpt = Checkpointer(directory, keep_last=2, keep_best=0, async_save=False)
    restored = restore_latest(
        ckpt, config, policy=policy, critic=None, learner=learner, reference=reference
    )
    ckpt.close()
    assert restored.step == 2 and restored.meta == CheckpointMeta.from_json(OLD_METAS["has_ref"])
    assert restored.meta.run == RunState(phase="rl", rl_iteration=1, evals=EVALS, checkpoint=2)
    for a, b in zip(_leaves(restored.train), _leaves(state), strict=True):
        assert (a == b).all()
    for a, b in zip(_leaves(restored.reference), _leaves(ref), strict=True):
        assert (a == b).all()
