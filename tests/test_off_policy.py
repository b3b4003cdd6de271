"""Off-policy correction (``rl.off_policy_correction``): TIS and MIS weights against a plain-Python
reference, token and action level, and the update's advantages weighted by them."""

import math
import os

import numpy as np
import pytest
from flax import nnx

from agentrl_jax import kernels
from agentrl_jax.benchmarks.learner import synthetic_episodes
from agentrl_jax.models import CausalLM, preset
from agentrl_jax.rl import rl_batch
from agentrl_jax.rl.rl_update import RLUpdate
from agentrl_jax.run.build import rl_learner
from agentrl_jax.run.config import ConfigError, from_config_dict, load_config_file

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def reference(old, behaviour, mask, step_ids, mode, cap, level):
    """Plain loops: each agent token's ratio (its action's geometric mean at action level), then
    the weight of ``mode``; the weights' mean, the largest ratio and the fraction changed."""
    b, t = old.shape
    ratio = np.zeros((b, t))
    for i in range(b):
        for j in range(t):
            if mask[i, j] <= 0:
                continue
            if level == "token":
                ratio[i, j] = math.exp(old[i, j] - behaviour[i, j])
            else:
                same = [k for k in range(t) if mask[i, k] > 0 and step_ids[i, k] == step_ids[i, j]]
                mean = sum(old[i, k] - behaviour[i, k] for k in same) / len(same)
                ratio[i, j] = math.exp(mean)
    weights, changed, tokens = np.zeros((b, t)), 0, 0
    for i in range(b):
        for j in range(t):
            if mask[i, j] <= 0:
                continue
            tokens += 1
            r = ratio[i, j]
            if mode == "none":
                w = 1.0
            elif mode == "tis":
                w = min(r, cap)
                changed += r > cap
            else:
                inside = 1 / cap <= r <= cap
                w = r if inside else 0.0
                changed += not inside
            weights[i, j] = w
    metrics = {
        "off_policy/is_weight_mean": weights.sum() / tokens,
        "off_policy/is_ratio_max": ratio.max(),
        "off_policy/clipped_fraction": changed / tokens,
    }
    return weights, metrics


def _inputs(seed=0, b=4, t=12):
    rng = np.random.default_rng(seed)
    mask = np.zeros((b, t), np.float32)
    step_ids = np.full((b, t), -1, np.int32)
    for i in range(b):  # actions of 1-3 tokens with gaps (observations) between them
        j, step = int(rng.integers(0, 2)), 0
        while j < t:
            n = int(rng.integers(1, 4))
            mask[i, j : j + n] = 1
            step_ids[i, j : j + n] = step
            j, step = j + n + int(rng.integers(1, 3)), step + 1
    old = (-rng.random((b, t)) * 3).astype(np.float32)
    # Log-ratios from -1.5 to 1.5: ratios from 0.22 to 4.5, on both sides of the caps.
    behaviour = (old - rng.uniform(-1.5, 1.5, (b, t))).astype(np.float32)
    return old, behaviour, mask, step_ids


@pytest.mark.parametrize("level", ["token", "action"])
@pytest.mark.parametrize("mode", ["none", "tis", "mis"])
@pytest.mark.parametrize("cap", [1.5, 2.0])
def test_weights_match_the_plain_reference(mode, level, cap):
    old, behaviour, mask, step_ids = _inputs()
    got, metrics = kernels.importance_weights(
        old, behaviour, mask, mode=mode, cap=cap, step_ids=step_ids, ratio_level=level
    )
    want, want_metrics = reference(old, behaviour, mask, step_ids, mode, cap, level)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
    for name, value in want_metrics.items():
        assert float(metrics[name]) == pytest.approx(value, rel=1e-5), name
    if mode != "none":  # both sides of the caps are exercised
        assert 0 < want_metrics["off_policy/clipped_fraction"] < 1


def test_errors_name_the_argument():
    old, behaviour, mask, step_ids = _inputs()
    with pytest.raises(ValueError, match="mode is 'clip'; expected one of"):
        kernels.importance_weights(old, behaviour, mask, mode="clip", cap=2.0)
    with pytest.raises(ValueError, match="cap is 1.0; expected > 1"):
        kernels.importance_weights(old, behaviour, mask, mode="tis", cap=1.0)
    with pytest.raises(ValueError, match="ratio_level='action' needs step_ids"):
        kernels.importance_weights(old, behaviour, mask, mode="tis", cap=2.0, ratio_level="action")


def _config(**rl):
    cd = load_config_file(os.path.join(REPO, "configs", "tiny_textworld.py") + ":test")
    for key, value in rl.items():
        cd.rl[key] = value
    return from_config_dict(cd)


def test_config_names_the_field():
    with pytest.raises(ConfigError, match="config.rl.off_policy_correction is 'is'; valid"):
        _config(off_policy_correction="is")
    with pytest.raises(ConfigError, match="config.rl.is_cap is 1(.0)?; expected > 1"):
        _config(off_policy_correction="tis", is_cap=1)
    spec = _config(off_policy_correction="mis", is_cap=3.0).rl_spec()
    assert (spec.off_policy_correction, spec.is_cap) == ("mis", 3.0)
    assert _config().rl_spec().off_policy_correction == "none"


@pytest.mark.parametrize("mode", ["tis", "mis"])
def test_the_update_weights_each_tokens_advantage(mode):
    """The update's batch: the advantages without correction times the reference's weights of
    the learner's old log-probs against the sampler's (the episodes' own, random here); the
    metrics logged are the reference's."""
    batches, metrics = {}, {}
    for correction in ("none", mode):
        config = _config(off_policy_correction=correction)
        cfg = preset(
            config.model.preset,
            vocab_size=config.model.tokenizer_vocab,
            **dict(config.model.overrides),
        )
        policy = CausalLM(cfg, rngs=nnx.Rngs(0))
        learner = rl_learner(config, policy, None)
        update = RLUpdate(learner.spec, learner, pad_id=0)
        trajs = synthetic_episodes(2, config.rollout.group_size, cfg.vocab_size, 3)
        rng = np.random.default_rng(1)
        for traj in trajs:  # the sampler's log-probs: about the random policy's, -log(allowed)
            for step in traj.steps:  # (constrained decoding), off by up to e^1.5 either way
                step.action_logprobs = [
                    -math.log(len(allowed)) + rng.uniform(-1.5, 1.5)
                    for allowed in step.action_allowed
                ]
        state = learner.init(policy, None)
        batch, _, logged = update.batch(state, nnx.state(policy, nnx.Param), trajs)
        batches[correction] = {k: np.asarray(v) for k, v in batch.items()}
        metrics[correction] = logged
    spec = learner.spec
    rows = rl_batch.build_rows(trajs, spec.context_mode, 0, spec.minibatch_size).rows
    plain, weighted = batches["none"], batches[mode]
    np.testing.assert_array_equal(plain["old_logprobs"], weighted["old_logprobs"])
    want, want_metrics = reference(
        plain["old_logprobs"],
        rows.old_logprobs,
        rows.loss_mask,
        rows.step_ids,
        mode,
        spec.is_cap,
        spec.loss.ratio_level,
    )
    np.testing.assert_allclose(weighted["advantages"], plain["advantages"] * want, atol=1e-5)
    assert want_metrics["off_policy/clipped_fraction"] > 0  # random behaviour log-probs
    for name, value in want_metrics.items():
        assert metrics[mode][name] == pytest.approx(value, rel=1e-4), name
    assert not any(k.startswith("off_policy/") for k in metrics["none"])
