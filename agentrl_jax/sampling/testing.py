"""Test helpers: a small random policy (numpy weights, no compilation; see
``agentrl_jax.models.testing.random_model``) and a teacher-forced reference."""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from agentrl_jax.models import registry
from agentrl_jax.models.config import ModelConfig
from agentrl_jax.models.decoder import CausalLM
from agentrl_jax.models.testing import random_model

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


def random_policy(cfg: ModelConfig = SMALL, *, seed: int = 0, std: float = 0.08) -> CausalLM:
    """A policy with N(0, std) weights and N(1, std) norm scales, built without compiling.

    The default std (4x the usual 0.02) makes next-token distributions peaked, so top-k/top-p
    and stopping checks are not vacuous on an otherwise near-uniform random model.
    """
    return random_model(registry.family(cfg).policy, cfg, seed=seed, std=std)


class TeacherForcer:
    """Logits of whole sequences in one padded teacher-forced pass (the independent reference).

    Pads every call to the same [batch, length] so the reference compiles once per test session.
    """

    def __init__(self, model: CausalLM, *, batch: int = 4, length: int = 128):
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
