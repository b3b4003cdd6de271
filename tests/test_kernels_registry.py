"""The registries, and the user example of docs/algorithms.md run as written."""

import pathlib
import re

import numpy as np
import pytest

from agentrl_jax import kernels as K
from agentrl_jax.kernels import registry

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "algorithms.md"


def test_builtin_names_and_requirements():
    assert K.advantage_estimators() == ("gae", "gagpo", "gigpo", "grpo", "reinforce_pp", "rloo")
    assert K.get_advantage_spec("gae").needs_values
    assert not any(K.get_advantage_spec(n).needs_values for n in ("grpo", "gagpo", "gigpo"))
    grouped = {n for n in K.advantage_estimators() if K.get_advantage_spec(n).needs_groups}
    assert grouped == {"grpo", "rloo", "gigpo", "gagpo"}
    # GAGPO is defined with one ratio per action; the others with one per token.
    levels = {n: K.get_advantage_spec(n).ratio_level for n in K.advantage_estimators()}
    assert levels == {n: "action" if n == "gagpo" else "token" for n in levels}
    assert set(K.policy_losses()) >= {"ppo", "pg"}
    assert K.get_policy_loss("ppo") is K.ppo_loss


def test_unknown_names_list_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown advantage estimator 'ppo'; valid names: gae, "):
        K.get_advantage_estimator("ppo")
    with pytest.raises(ValueError, match=r"unknown policy loss 'gae'; valid names: .*ppo"):
        K.get_policy_loss("gae")
    with pytest.raises(ValueError, match="'grpo' is already registered"):
        K.register_advantage_estimator("grpo", lambda *a, **k: None)
    with pytest.raises(ValueError, match=r"'mine': ratio_level is 'seq'; expected one of"):
        K.register_advantage_estimator("mine", lambda *a, **k: None, ratio_level="seq")
    assert "mine" not in K.advantage_estimators()


def test_docs_example_registers_and_runs():
    text = DOC.read_text()
    block = re.search(
        r"<!-- registry-example -->\s*```python\n(.*?)```\s*<!-- /registry-example -->", text, re.S
    )
    assert block, "docs/algorithms.md lost its registry example"
    code = block.group(1)
    assert len(code.strip().splitlines()) <= 16  # a short example, as the README promises
    namespace = {}
    try:
        exec(compile(code, str(DOC), "exec"), namespace)
        batch = K.make_batch(
            loss_mask=np.array([[0, 1, 1], [0, 1, 0], [0, 0, 0]]),
            step_ids=np.array([[-1, 0, 0], [-1, 0, -1], [-1, -1, -1]]),
            rewards=np.array([[1.0], [0.0], [0.0]]),
            step_mask=np.array([[1], [1], [0]]),
            group_ids=np.array([0, 1, 2]),
        )
        fn = K.get_advantage_estimator("batch_baseline")
        assert fn is namespace["estimator"]
        out = fn(batch, K.AdvantageConfig())
        np.testing.assert_allclose(
            np.asarray(out.tokens), [[0, 0.5, 0.5], [0, -0.5, 0], [0, 0, 0]], atol=1e-6
        )
    finally:
        registry.unregister("batch_baseline")
    assert "batch_baseline" not in K.advantage_estimators()


def test_custom_policy_loss_is_selected_by_name():
    @K.register_policy_loss("halved_pg")
    def halved(logprobs, old_logprobs, advantages, loss_mask, *, step_ids=None, config=None):
        loss, metrics = K.pg_loss(logprobs, old_logprobs, advantages, loss_mask)
        return K.Weighted(loss.numerator / 2, loss.denominator), metrics

    try:
        ones = np.ones((1, 2), np.float32)
        loss, _ = K.get_policy_loss("halved_pg")(-ones, -ones, ones, ones)
        assert float(loss.value) == pytest.approx(0.5)
    finally:
        registry.unregister("halved_pg")
