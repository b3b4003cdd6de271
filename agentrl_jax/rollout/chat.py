"""Chat templates that turn environment text into token ids, once, as it is fed to the model.

Token-in, token-out: every piece of text is encoded exactly once, when it enters the model's
context, and the training batch is assembled from those ids and the sampler's own ids. Nothing is
decoded and re-encoded between acting and training, so a lossy decode/encode round trip cannot
change what is trained.

A conversation is ``system + (user turn + assistant action)*``. An action ends with the stop token
that the sampler emits (``<|im_end|>`` here); the next user turn starts right after it.

- ``qwen``: the ChatML layout of Qwen2/2.5 instruct checkpoints::

      <|im_start|>system\\n{system}<|im_end|>\\n<|im_start|>user\\n{obs}<|im_end|>\\n
      <|im_start|>assistant\\n{action}<|im_end|>

- ``plain``: a short layout for the tiny built-in model (fewer tokens per turn)::

      {system}\\n<|im_start|>{obs}\\n>{action}<|im_end|>

- ``checkpoint``: the checkpoint's own jinja chat template, rendered into these same pieces and
  checked against ``apply_chat_template`` when the run starts (``rollout/chat_checkpoint.py``).
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
      name: 'qwen', 'plain' or 'checkpoint'.
      system_prefix, system_suffix: text around the system prompt.
      user_prefix, user_suffix: text around each observation (the suffix opens the action).
      action_suffix: text after the stop token that closes an action, before the next turn.
      stop_token: the token that ends an action (the sampler's stop; one id).
      strip_content: the system prompt and observations are stripped of surrounding whitespace
        first, as a template that ``trim``s message content (Llama 3's) renders them.
      source: where the template came from (a checkpoint's file), for messages.
    """

    name: str
    system_prefix: str
    system_suffix: str
    user_prefix: str
    user_suffix: str
    action_suffix: str
    stop_token: str = IM_END
    strip_content: bool = False
    source: str = ""

    def system_text(self, system: str) -> str:
        """The system piece as text: what ``system_ids`` encodes."""
        return self.system_prefix + self._content(system) + self.system_suffix

    def turn_text(self, observation: str, *, first: bool) -> str:
        """A user turn as text: what ``turn_ids`` encodes."""
        text = ("" if first else self.action_suffix) + self.user_prefix
        return text + self._content(observation) + self.user_suffix

    def system_ids(self, tokenizer: TokenizerLike, system: str) -> list[int]:
        return _encode(tokenizer, self.system_text(system))

    def turn_ids(self, tokenizer: TokenizerLike, observation: str, *, first: bool) -> list[int]:
        """Ids fed before an action: the previous action's closing text (unless first), the obs."""
        return _encode(tokenizer, self.turn_text(observation, first=first))

    def stop_id(self, tokenizer: TokenizerLike) -> int:
        return tokenizer.convert_tokens_to_ids(self.stop_token)

    def _content(self, text: str) -> str:
        return text.strip() if self.strip_content else text


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


CHECKPOINT = "checkpoint"


def get_template(
    name: str, tokenizer=None, *, directory: str = "", system_prompt: str = ""
) -> ChatTemplate:
    """The chat template called ``name``: a fixed one, or ``"checkpoint"``, read and checked.

    Args:
      name: ``"qwen"``, ``"plain"`` or ``"checkpoint"``.
      tokenizer: the run's tokenizer (``"checkpoint"`` only: it renders and encodes the checks).
      directory: the checkpoint or tokenizer directory whose chat template to read
        (``"checkpoint"`` only).
      system_prompt: the run's system prompt, used in the check (``"checkpoint"`` only).

    Raises:
      ValueError: an unknown name; ``"checkpoint"`` without a tokenizer or directory; a
        checkpoint template that cannot be used (``chat_checkpoint.ChatTemplateError``).
    """
    if name == CHECKPOINT:
        if tokenizer is None or not directory:
            raise ValueError(
                "chat template 'checkpoint' reads the template of a checkpoint or tokenizer "
                "directory: pass tokenizer= and directory= (config.model.checkpoint or "
                "config.model.tokenizer)"
            )
        # Imported here: chat_checkpoint builds on this module's ChatTemplate.
        from agentrl_jax.rollout import chat_checkpoint

        return chat_checkpoint.checkpoint_template(
            directory, tokenizer, system_prompt=system_prompt
        )
    if name not in TEMPLATES:
        valid = sorted((*TEMPLATES, CHECKPOINT))
        raise ValueError(f"unknown chat template {name!r}; valid templates: {valid}")
    return TEMPLATES[name]


def _encode(tokenizer: TokenizerLike, text: str) -> list[int]:
    # Special tokens in the template text are parsed as single ids by HF tokenizers; no BOS/EOS
    # is added, so pieces concatenate to exactly what the model reads.
    return list(tokenizer.encode(text, add_special_tokens=False))
