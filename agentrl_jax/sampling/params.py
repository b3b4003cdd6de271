"""How to sample (temperature, top-k, top-p) and when to stop (EOS ids, stop-token sequences).

Both are frozen, hashable dataclasses: the jitted turn function closes over them as static
configuration, so each distinct setting compiles once (training and greedy evaluation are two).
"""

from __future__ import annotations

import dataclasses
import enum

import numpy as np


class DoneReason(enum.IntEnum):
    """Why a row stopped generating in a turn (``TurnOutput.done_reason``)."""

    INACTIVE = 0  # the row got no new tokens this turn: nothing was fed, nothing generated
    EOS = 1  # sampled one of ``StopConfig.eos_ids`` (the EOS token is kept in the output)
    STOP_SEQUENCE = 2  # the generated tokens end with one of ``StopConfig.stop_sequences``
    MAX_NEW_TOKENS = 3  # generated the row's ``max_new_tokens`` (or it was 0: prefill only)


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """The processed distribution that tokens are drawn from.

    Attributes:
      temperature: logits are divided by it; 0 means greedy (argmax, processed log-prob 0).
      top_k: keep the k most likely tokens (0 keeps all). Ties at the k-th value are kept.
      top_p: keep the smallest set of most likely tokens whose probability reaches top_p
        (1.0 keeps all); the most likely token is always kept.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if not self.temperature >= 0.0:
            raise ValueError(f"SamplingParams.temperature={self.temperature}: expected >= 0")
        if self.top_k < 0:
            raise ValueError(f"SamplingParams.top_k={self.top_k}: expected >= 0 (0 keeps all)")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplingParams.top_p={self.top_p}: expected in (0, 1]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def filters(self) -> bool:
        """True when top-k or top-p removes tokens (the sort is skipped otherwise)."""
        return self.top_k > 0 or self.top_p < 1.0


GREEDY = SamplingParams(temperature=0.0)


@dataclasses.dataclass(frozen=True)
class StopConfig:
    """Per-row stopping: a row stops on its own, the others keep going.

    Attributes:
      eos_ids: token ids that end a row's action (e.g. ``<|im_end|>``, ``<|endoftext|>``).
      stop_sequences: token-id sequences; a row stops once its generated tokens end with one.
        Only this turn's generated tokens are matched, never the prompt.
    """

    eos_ids: tuple[int, ...] = ()
    stop_sequences: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "eos_ids", tuple(int(t) for t in self.eos_ids))
        seqs = tuple(tuple(int(t) for t in s) for s in self.stop_sequences)
        for i, s in enumerate(seqs):
            if not s:
                raise ValueError(f"StopConfig.stop_sequences[{i}] is empty; expected >= 1 token")
        object.__setattr__(self, "stop_sequences", seqs)

    @property
    def window(self) -> int:
        """How many trailing generated tokens the stop-sequence check needs to see."""
        return max((len(s) for s in self.stop_sequences), default=0)

    def stop_table(self) -> tuple[np.ndarray, np.ndarray]:
        """Stop sequences right-aligned in a [num_seqs, window] int32 table (-1 = don't care).

        Returns:
          (table [Q, W] int32, lengths [Q] int32); Q = 0 when there are no stop sequences.
        """
        w = self.window
        table = np.full((len(self.stop_sequences), w), -1, np.int32)
        for i, s in enumerate(self.stop_sequences):
            table[i, w - len(s) :] = s
        lengths = np.array([len(s) for s in self.stop_sequences], np.int32)
        return table, lengths
