"""The learner's programs are traced under their mesh: the model's activation constraints reach
XLA, and the hidden states are split over the batch, not over the FSDP-sharded hidden width.

On a (data, fsdp, tp) = (2, 4, 1) mesh of 8 fake CPU devices the weights' ``embed`` axis is split
4 ways. Traced without the mesh, ``sharding.constrain`` is the identity and XLA follows the
weights: the [B, T, D] residual stream comes out [B / 2, T, D / 4] per device. Under the mesh it
is [B / 8, T, D], rows over (data, fsdp), as the logical-axis rules say.
"""

import jax
import jax.numpy as jnp
import optax
import pytest

from agentrl_jax import sharding
from agentrl_jax.models import CausalLM, ValueModel
from agentrl_jax.models.testing import TEST_CONFIG, random_model
from agentrl_jax.rl.learner import Learner

CFG = TEST_CONFIG.replace(num_layers=1)
B, T, D = 16, 32, CFG.hidden_size
BATCH_SPLIT = f"f32[{B // 8},{T},{D}]"  # rows over data x fsdp = 8, width whole
WIDTH_SPLIT = f"f32[{B // 2},{T},{D // 4}]"  # rows over data = 2, width over fsdp = 4


@pytest.fixture(scope="module")
def parts():
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (tests/conftest.py fakes 8 CPU devices)")
    mesh = sharding.make_mesh((2, 4, 1))
    policy = random_model(CausalLM, CFG, seed=0, mesh=mesh)
    critic = random_model(ValueModel, CFG, seed=1, mesh=mesh)
    adam = optax.adam(1e-3)
    sft = Learner(policy, None, adam, mesh=mesh, logits_chunk=16)
    rl = Learner(policy, critic, adam, adam, mesh=mesh, logits_chunk=16)
    return policy, critic, sft, rl


def _batch(learner, *keys):
    dtypes = {"tokens": jnp.int32, "step_ids": jnp.int32}
    return learner.abstract_batch({k: ((B, T), dtypes.get(k, jnp.float32)) for k in keys})


def _hidden_layouts(lowered) -> dict[str, int]:
    """Per-device [B, T, D] buffers of each layout in the compiled (partitioned) program."""
    text = lowered.compile().as_text()
    return {"batch": text.count(BATCH_SPLIT), "width": text.count(WIDTH_SPLIT)}


def test_score_pass_hidden_states_are_batch_sharded(parts):
    policy, _, learner, _ = parts
    state = learner.abstract_state(policy)
    batch = _batch(learner, "tokens", "mask")
    lowered = learner.score.lower(state.policy, None, None, batch, rows_per_chunk=B)
    # The model's constraints are in the program: the residual stream's rows over (data, fsdp).
    text = lowered.as_text()
    assert f'[{{"data", "fsdp"}}, {{}}, {{}}]> : tensor<{B}x{T}x{D}xf32>' in text
    got = _hidden_layouts(lowered)
    assert got["batch"] > 0 and got["width"] == 0, got
    # Control: the same pass traced without the mesh follows the FSDP weights instead.
    unconstrained = learner.score.jitted.lower(state.policy, None, None, batch, rows_per_chunk=B)
    assert "sharding_constraint" not in unconstrained.as_text()
    assert _hidden_layouts(unconstrained)["width"] > 0


@pytest.mark.slow
def test_train_steps_hidden_states_are_batch_sharded(parts):
    policy, critic, sft, rl = parts
    state = rl.abstract_state(policy, critic)
    scored = ("old_logprobs", "advantages", "old_values", "returns")
    batch = _batch(rl, "tokens", "mask", "loss_mask", "step_ids", *scored)
    replicated = jax.sharding.NamedSharding(rl.mesh, jax.sharding.PartitionSpec())
    index = jax.ShapeDtypeStruct((2, B), jnp.int32, sharding=replicated)
    for lowered in (
        sft.sft_step.lower(sft.abstract_state(policy), _batch(sft, "tokens", "mask", "loss_mask")),
        rl.rl_update.lower(state, batch, index, {}),
        rl.score.lower(state.policy, state.policy, state.value, batch, rows_per_chunk=B),
    ):
        got = _hidden_layouts(lowered)
        assert got["batch"] > 0 and got["width"] == 0, got
