"""The host-side numpy random streams of a run: one per consumer, never shared.

    rng = numpy_rng(seed, RL_ITERATION, it)     # RL iteration ``it``'s tasks and shuffles

Every consumer draws from ``np.random.default_rng([seed, stream, *index])``: the run's seed, the
consumer's tag, then its own index (the RL iteration, the SFT epoch). Distinct tags keep the
consumers apart whatever their indices; without them the demonstrations' ``[seed, 7]`` was RL
iteration 7's stream, and SFT epoch e's batch plan RL iteration e's.

numpy's SeedSequence reads ``[seed, tag]`` and ``[seed, tag, 0]`` as the same entropy (trailing
zeros), so a consumer's stream is only told apart by its tag: give every new consumer a new one.
"""

from __future__ import annotations

import numpy as np

# The consumers' tags (never reuse or renumber one: that would change every run's draws).
DEMONSTRATIONS = 1  # which train games the SFT demonstrations play
RL_ITERATION = 2  # an RL iteration's levels, tasks, minibatch shuffles and ENVRL draws
SFT_EPOCH = 3  # the length-grouped SFT batch plan of an epoch

STREAMS = {"demonstrations": DEMONSTRATIONS, "rl_iteration": RL_ITERATION, "sft_epoch": SFT_EPOCH}


def numpy_rng(seed: int, stream: int, *index: int) -> np.random.Generator:
    """The generator of consumer ``stream`` (one of :data:`STREAMS`) at ``index``.

    Args:
      seed: the run's seed (>= 0).
      stream: the consumer's tag.
      index: the consumer's own counters (an RL iteration, an SFT epoch), >= 0.

    Returns:
      ``np.random.default_rng([seed, stream, *index])``.
    """
    if stream not in STREAMS.values():
        raise ValueError(
            f"numpy_rng: stream is {stream!r}; expected one of the tags {STREAMS} "
            "(a new consumer needs a new tag)"
        )
    return np.random.default_rng([seed, stream, *index])
