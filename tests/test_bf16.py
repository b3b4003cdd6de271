"""bfloat16 against float32 on the same weights: the policy's logits, and the sampler's log-probs
against the learner's (the baseline of ``rollout/logprob_mismatch`` in a bf16 run).

bfloat16 keeps 8 significant bits: one rounding is off by up to 2^-8 of the value (relative), so
a logit computed in bf16 through two layers is expected within a few such units of the logits'
scale. The bounds below are 4 units; measured on this model (CPU): logits max |diff| 0.0052 at
scale 1.46 (about 1 unit), mean 0.0007. Sampler vs learner log-probs in bf16: max 5e-7 since
both attend with the same code (queries as the rows of one matmul against keys in the cache's
layout; before, teacher forcing had its own einsum and they differed by up to 0.0020), the same
as in float32; the learner's bf16 log-probs differ from its float32 ones by far more, so the
comparison really is in bf16. The PPO ratio uses the learner's own recomputed old log-probs, so
this mismatch never enters the loss.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from agentrl_jax.models import CausalLM
from agentrl_jax.rl.learner import Learner
from agentrl_jax.sampling import Sampler, SamplingParams
from agentrl_jax.sampling.testing import SMALL

CFG = SMALL
UNIT = 2.0**-8  # bfloat16's relative rounding step


@pytest.fixture(scope="module")
def models():
    # The models' own initialisation (the scale a fresh policy starts at).
    f32 = CausalLM(CFG, rngs=nnx.Rngs(0))
    bf16 = CausalLM(CFG.replace(dtype=jnp.bfloat16, param_dtype=jnp.bfloat16), rngs=nnx.Rngs(1))
    # The same weights, rounded to bf16 once.
    nnx.update(bf16, jax.tree.map(lambda x: x.astype(jnp.bfloat16), nnx.state(f32, nnx.Param)))
    return {"float32": f32, "bfloat16": bf16}


def test_bf16_logits_are_within_a_few_bf16_units_of_f32(models):
    tokens = jnp.asarray(np.random.default_rng(0).integers(1, CFG.vocab_size, (8, 48)), jnp.int32)
    mask = jnp.ones(tokens.shape, jnp.float32)
    f32 = np.asarray(models["float32"](tokens, mask_bt=mask)[0])
    bf16 = np.asarray(models["bfloat16"](tokens, mask_bt=mask)[0])
    scale = np.abs(f32).max()
    diff = np.abs(f32 - bf16)
    print(f"logits: scale {scale:.3f}, max |diff| {diff.max():.2e}, mean {diff.mean():.2e}")
    assert diff.max() <= 4 * UNIT * scale
    assert diff.mean() <= UNIT * scale
    assert diff.max() > 0  # really computed in bf16


# float32 is the control (the sampler tests check it against teacher forcing already).
@pytest.mark.parametrize("dtype", [pytest.param("float32", marks=pytest.mark.slow), "bfloat16"])
def test_sampler_logprobs_against_the_learners(models, dtype):
    model = models[dtype]
    rng = np.random.default_rng(1)
    prompts = [rng.integers(1, CFG.vocab_size, n).tolist() for n in (5, 17, 9, 30)]
    sampler = Sampler(model, sampling=SamplingParams(temperature=1.0), pad_id=0)
    out = sampler.generate(prompts, 16, jax.random.key(1))
    rows = [p + g for p, g in zip(prompts, out.token_lists())]
    tokens = np.zeros((len(rows), 64), np.int32)
    mask = np.zeros(tokens.shape, np.float32)
    for i, row in enumerate(rows):
        tokens[i, : len(row)], mask[i, : len(row)] = row, 1
    learner = Learner(model, None, optax.sgd(0.1))
    batch = {"tokens": jnp.asarray(tokens), "mask": jnp.asarray(mask)}
    learned = np.asarray(learner.policy_logprobs(nnx.state(model, nnx.Param), batch))
    diffs = np.concatenate(
        [
            np.abs(learned[i, len(p) : len(p) + len(g)] - np.asarray(out.logprobs[i, : len(g)]))
            for i, (p, g) in enumerate(zip(prompts, out.token_lists()))
        ]
    )
    print(f"{dtype}: sampler vs learner log-probs max |diff| {diffs.max():.2e}")
    if dtype == "float32":
        assert diffs.max() <= 1e-5
    else:
        scale = np.abs(np.asarray(model(batch["tokens"], mask_bt=batch["mask"])[0])).max()
        assert diffs.max() <= 4 * UNIT * scale
        # Really computed in bf16: the same rows scored in float32 differ by far more.
        f32_learner = Learner(models["float32"], None, optax.sgd(0.1))
        f32 = np.asarray(
            f32_learner.policy_logprobs(nnx.state(models["float32"], nnx.Param), batch)
        )
        gap = max(
            np.abs(learned[i, len(p) : len(p) + len(g)] - f32[i, len(p) : len(p) + len(g)]).max()
            for i, (p, g) in enumerate(zip(prompts, out.token_lists()))
        )
        print(f"bfloat16 vs float32 learner log-probs max |diff| {gap:.2e}")
        assert gap > 1e-5
