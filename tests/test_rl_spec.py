"""The resolved RL spec (rl/spec.py): made once from the config, and the only thing rl/ reads.

The KL to the reference is decided by the spec: its mode, estimator and clamp, whether a
reference is needed, and which of the loss weights and the estimator's config carry it.
"""

import ast
import dataclasses
import os
import pathlib
import sys
import types

import pytest

from agentrl_jax import kernels
from agentrl_jax.rl.spec import KLSpec, LossWeights, RLSpec
from agentrl_jax.run.config import from_config_dict
from agentrl_jax.run.config_learning import EnvrlSection, RLSection

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, os.fspath(REPO))
from train_cli import tiny_config as _config  # noqa: E402


def _spec(num_iterations=1, **sections):
    return from_config_dict(_config(**sections), num_devices=1).rl_spec(num_iterations)


def test_the_default_run_has_no_kl_and_no_reference():
    spec = _spec()
    assert spec.kl == KLSpec()
    assert not spec.kl.needs_reference
    assert spec.weights.kl == 0.0 and spec.advantage.kl_coef == 0.0


def test_kl_as_a_loss_term():
    spec = _spec(rl=dict(kl_coef=0.05, kl_estimator="k2", kl_clamp=3.0, entropy_coef=0.01))
    assert spec.kl == KLSpec(mode="loss", coef=0.05, estimator="k2", clamp=3.0)
    assert spec.kl.needs_reference
    assert spec.weights == LossWeights(value=0.5, kl=0.05, entropy=0.01)
    assert spec.advantage.kl_coef == 0.0  # no reward penalty
    assert (spec.loss.kl_estimator, spec.loss.kl_clamp) == ("k2", 3.0)


def test_kl_as_a_reward_penalty_has_no_loss_weight():
    spec = _spec(
        rl=dict(
            algo="reinforce_pp",
            kl_mode="reward",
            kl_coef=0.2,
            kl_estimator="k1",
            reference_dtype="bfloat16",
        )
    )
    assert spec.kl.mode == "reward" and spec.kl.needs_reference  # still scored and logged
    assert spec.kl.reference_dtype == "bfloat16"
    assert spec.weights.kl == 0.0
    assert spec.advantage.kl_coef == 0.2
    assert spec.loss.kl_estimator == "k1"  # one estimator in either mode


def test_the_spec_resolves_ratio_level_critic_and_sizes():
    spec = _spec(rl=dict(algo="gagpo", microbatch_size=4, minibatch_size=8, epochs=3))
    assert spec.loss.ratio_level == "action"  # "auto": the estimator's own
    assert not spec.needs_critic
    assert (spec.epochs, spec.minibatch_size, spec.microbatch_size) == (3, 8, 4)
    assert spec.score_rows == 4  # a microbatch's rows
    assert _spec(rl=dict(microbatch_size=0)).score_rows == _spec().minibatch_size
    assert _spec(rl=dict(algo="gae")).needs_critic


def test_envrl_horizon_is_the_runs_iterations_unless_set():
    spec = _spec(7, envrl=dict(enabled=True, sp_weight=0.3, horizon=0))
    assert spec.envrl == kernels.EnvrlConfig(sp_weight=0.3, id_weight=0.1, horizon=7)
    assert not spec.envrl_by_updates  # the schedule steps by the RL phase's progress
    spec = _spec(7, envrl=dict(enabled=True, horizon=50))
    assert spec.envrl.horizon == 50 and spec.envrl_by_updates
    assert _spec(7).envrl is None


def test_the_config_s_kernel_configs_are_the_spec_s():
    run = from_config_dict(_config(rl=dict(kl_mode="reward", algo="gae", kl_coef=0.1)))
    spec = run.rl_spec()
    assert run.rl_spec().advantage == spec.advantage
    assert run.rl_spec().loss == spec.loss
    assert run.rl_spec().loss.ratio_level == spec.loss.ratio_level
    assert run.needs_critic == spec.needs_critic


def test_rl_section_defaults_are_declared_once_where_the_settings_are():
    """RLSection names the spec's and the kernels' defaults; it does not restate them."""
    spec = RLSpec()
    defaults = {f.name: f.default for f in dataclasses.fields(RLSection)}
    assert defaults["gamma"] == kernels.AdvantageConfig().gamma
    assert defaults["clip_low"] == kernels.LossConfig().clip_low
    assert defaults["value_coef"] == LossWeights().value
    assert defaults["kl_estimator"] == spec.kl.estimator
    assert defaults["epochs"] == spec.epochs
    assert RLSpec.from_sections(RLSection(), EnvrlSection(), context_mode="episode") == RLSpec()


def test_a_hand_built_spec_takes_its_kl_from_kl_alone():
    """The KL is set once (``RLSpec.kl``); the kernels' configs' copies are made from it."""
    loss_mode = RLSpec(kl=KLSpec(coef=0.1, estimator="k1", clamp=5.0))
    assert loss_mode.weights.kl == 0.1 and loss_mode.advantage.kl_coef == 0.0
    assert (loss_mode.loss.kl_estimator, loss_mode.loss.kl_clamp) == ("k1", 5.0)
    reward_mode = RLSpec(kl=KLSpec(mode="reward", coef=0.2))
    assert reward_mode.weights.kl == 0.0 and reward_mode.advantage.kl_coef == 0.2
    # A copy given in a kernel's config is not a second setting: it follows the KL's.
    assert RLSpec(advantage=kernels.AdvantageConfig(kl_coef=0.1)).advantage.kl_coef == 0.0
    assert RLSpec(weights=LossWeights(kl=0.3)) == RLSpec()
    ok = RLSpec.for_losses(weights=LossWeights(kl=0.1))
    assert ok.kl.needs_reference and ok.kl.mode == "loss" and ok.weights.kl == 0.1


def test_the_learner_takes_a_spec_or_its_settings_not_both():
    import optax
    from flax import nnx

    from agentrl_jax.models import CausalLM, preset
    from agentrl_jax.rl.learner import Learner

    policy = CausalLM(
        preset("tiny", vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=1),
        rngs=nnx.Rngs(0),
    )
    spec = _spec(rl=dict(kl_coef=0.1))
    assert Learner(policy, None, optax.sgd(0.1), spec=spec).spec is spec
    plain = Learner(policy, None, optax.sgd(0.1))  # SFT, or a test: the default losses
    assert plain.spec == RLSpec.for_losses() and not plain.spec.kl.needs_reference


def test_nothing_in_rl_imports_run():
    """rl/ reads the spec, never the run's config (tests/test_layers.py checks every layer)."""
    for path in sorted((REPO / "agentrl_jax" / "rl").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            for name in names:
                assert not name.startswith("agentrl_jax.run"), (path.name, name)


def test_the_kl_term_is_switched_on_by_the_spec_not_by_the_batch():
    import jax.numpy as jnp
    import numpy as np

    from agentrl_jax.rl import losses

    rng = np.random.default_rng(0)
    logp = jnp.asarray(-rng.random((2, 5)), jnp.float32)
    stats = {"logprobs": logp, "entropy": jnp.ones((2, 5))}
    mask = jnp.asarray([[0, 1, 1, 1, 0], [0, 0, 1, 1, 1]], jnp.float32)
    batch = {
        "old_logprobs": logp,
        "advantages": jnp.asarray(rng.normal(size=(2, 5)), jnp.float32) * mask,
        "loss_mask": mask,
        "step_ids": jnp.where(mask > 0, 0, -1),
        "ref_logprobs": logp - 0.3,
    }
    ppo = kernels.get_policy_loss("ppo")

    def terms(spec, b=batch):
        return losses.rl_terms(spec, ppo, stats, b)

    terms_, metrics = terms(RLSpec())  # a reference in the batch, but no KL in the spec
    assert "losses/kl_ref" not in metrics and "losses/kl_ref" not in terms_
    reward = _spec(rl=dict(algo="reinforce_pp", kl_mode="reward", kl_coef=0.2))
    terms_, metrics = terms(reward)
    assert "losses/kl_ref" in metrics and "losses/kl_ref" not in terms_  # logged, not a term
    loss = _spec(rl=dict(kl_coef=0.2))
    terms_, metrics = terms(loss)
    assert terms_["losses/kl_ref"][0] == 0.2 and float(metrics["losses/kl_ref"].value) > 0
    without = {k: v for k, v in batch.items() if k != "ref_logprobs"}
    with pytest.raises(KeyError, match="ref_logprobs"):  # never silently dropped
        terms(loss, without)


@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_the_kl_reference_is_decided_once(lora, kl_coef):
    """``build.kl_reference`` (the trainer's update, its frozen copy and the memory plan):
    none without a KL; LoRA's base, the state's own arrays; else a frozen copy, made once in
    the reference dtype and then the one the caller keeps."""
    import jax.numpy as jnp
    import numpy as np

    from agentrl_jax.run import build

    spec = _spec(rl=dict(kl_coef=kl_coef, reference_dtype="bfloat16"))
    policy = {"w": jnp.ones((2, 2), jnp.float32), "n": jnp.arange(2)}
    learner = types.SimpleNamespace(spec=spec, lora=lora, base_state=lambda p: ("base", p))
    ref, frozen = build.kl_reference(learner, policy)
    if not kl_coef:
        assert (ref, frozen) == (None, False)
    elif lora:
        assert ref == ("base", policy) and not frozen
    else:
        assert frozen and ref["w"].dtype == jnp.bfloat16 and ref["n"].dtype == policy["n"].dtype
        np.testing.assert_array_equal(np.asarray(ref["w"], np.float32), 1.0)
        assert build.kl_reference(learner, policy, frozen=ref) == (ref, True)
