"""Chat templates that turn environment text into token ids, once, as it is fed to the model.

Token-in, token-out: every piece of text is encoded exactly once, when it enters the model's
context, and the training batch is assembled from those ids and the sampler's own ids. Nothing is
decoded and re-encoded between acting and training, so a lossy decode/encode round trip cannot
change what is trained.

A conversation is ``system + (user turn + assistant action)*``. An action ends with the stop token
(``<|im_end|>``) that the sampler emits; the next user turn starts right after it.

- ``qwen``: the ChatML layout of Qwen2/2.5 instruct checkpoints::

      <|im_start|>system\\n{system}<|im_end|>\\n<|im_start|>user\\n{obs}<|im_end|>\\n
      <|im_start|>assistant\\n{action}<|im_end|>

- ``plain``: a short layout for the tiny built-in model (fewer tokens per turn)::

      {system}\\n<|im_start|>{obs}\\n>{action}<|im_end|>
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"


class TokenizerLike(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def convert_tokens_to_ids(self, token: str) -> int: ...


@dataclasses.dataclass(frozen=True)
class ChatTemplate:
    """Encodes the pieces of a multi-turn conversation.

    Attributes:
      name: 'qwen' or 'plain'.
      system_prefix, system_suffix: text around the system prompt.
      user_prefix, user_suffix: text around each observation (the suffix opens the action).
      action_suffix: text after the stop token that closes an action, before the next turn.
    """

    name: str
    system_prefix: str
    system_suffix: str
    user_prefix: str
    user_suffix: str
    action_suffix: str

    def system_ids(self, tokenizer: TokenizerLike, system: str) -> list[int]:
        return _encode(tokenizer, self.system_prefix + system + self.system_suffix)

    def turn_ids(self, tokenizer: TokenizerLike, observation: str, *, first: bool) -> list[int]:
        """Ids fed before an action: the previous action's closing text (unless first), the obs."""
        text = ("" if first else self.action_suffix) + self.user_prefix + observation
        return _encode(tokenizer, text + self.user_suffix)

    def stop_id(self, tokenizer: TokenizerLike) -> int:
        return tokenizer.convert_tokens_to_ids(IM_END)


TEMPLATES = {
    "qwen": ChatTemplate(
        name="qwen",
        system_prefix=f"{IM_START}system\n",
        system_suffix=f"{IM_END}\n",
        user_prefix=f"{IM_START}user\n",
        user_suffix=f"{IM_END}\n{IM_START}assistant\n",
        action_suffix="\n",
    ),
    "plain": ChatTemplate(
        name="plain",
        system_prefix="",
        system_suffix="\n",
        user_prefix=IM_START,
        user_suffix="\n>",
        action_suffix="\n",
    ),
}


def get_template(name: str) -> ChatTemplate:
    if name not in TEMPLATES:
        raise ValueError(f"unknown chat template {name!r}; valid templates: {sorted(TEMPLATES)}")
    return TEMPLATES[name]


def _encode(tokenizer: TokenizerLike, text: str) -> list[int]:
    # Special tokens in the template text are parsed as single ids by HF tokenizers; no BOS/EOS
    # is added, so pieces concatenate to exactly what the model reads.
    return list(tokenizer.encode(text, add_special_tokens=False))
