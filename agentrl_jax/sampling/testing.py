"""Test helpers: a small random policy built without compiling, and a teacher-forced reference.

Random weights come from numpy rather than the model's jitted initialisers: on a loaded 2-core
machine compiling the initialiser costs more than the whole test it serves.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.qwen2 import Qwen2ForCausalLM

SMALL = ModelConfig(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    rope_theta=10_000.0,
)


def random_policy(
    cfg: ModelConfig = SMALL, *, seed: int = 0, std: float = 0.08
) -> Qwen2ForCausalLM:
    """A policy with N(0, std) weights and biases and N(1, std) norm scales.

    The default std (4x the usual 0.02) makes next-token distributions peaked, so top-k/top-p
    and stopping checks are not vacuous on an otherwise near-uniform random model.
    """
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Qwen2ForCausalLM(cfg, rngs=nnx.Rngs(0))))
    rng = np.random.default_rng(seed)

    def draw(path, leaf):
        mean = 1.0 if any("norm" in str(p) for p in path) else 0.0
        return jnp.asarray(rng.normal(mean, std, leaf.shape).astype(leaf.dtype))

    return nnx.merge(graphdef, jax.tree_util.tree_map_with_path(draw, abstract))


class TeacherForcer:
    """Logits of whole sequences in one padded teacher-forced pass (the independent reference).

    Pads every call to the same [batch, length] so the reference compiles once per test session.
    """

    def __init__(self, model: Qwen2ForCausalLM, *, batch: int = 4, length: int = 128):
        self.batch, self.length = batch, length
        self.graphdef, self.state = nnx.split(model)
        self._fn = jax.jit(
            lambda state, tokens, mask: nnx.merge(self.graphdef, state)(tokens, mask_bt=mask)[0]
        )

    def logits(self, sequences: list[list[int]]) -> np.ndarray:
        """[len(sequences), length, V] float32 logits; row b is valid up to len(sequences[b])."""
        if len(sequences) > self.batch or max(len(s) for s in sequences) > self.length:
            raise ValueError(
                f"TeacherForcer holds {self.batch} rows of {self.length} tokens; got "
                f"{len(sequences)} rows, the longest {max(len(s) for s in sequences)}"
            )
        tokens = np.zeros((self.batch, self.length), np.int32)
        mask = np.zeros((self.batch, self.length), np.int32)
        for i, s in enumerate(sequences):
            tokens[i, : len(s)] = s
            mask[i, : len(s)] = 1
        return np.asarray(self._fn(self.state, tokens, mask))[: len(sequences)]
