"""The pieces of a multi-turn conversation and their token ids: ``ChatTemplate``.

A template is text around the system prompt, around each observation (the user turn, whose
suffix opens the action) and after the stop token that closes an action. A template for tool
calling (``chat_checkpoint.checkpoint_template(..., tools=...)``) has the tools rendered into its
system piece (or its first user turn, as Llama 3.1's does), and text around each tool result (the
``tool`` turn that answers a call). Each piece is encoded once, as it enters the model's context
(token-in, token-out: ``rollout/chat.py``). The templates themselves, by name, are in
``rollout/chat.py``; a checkpoint's own, read from its jinja text, in
``rollout/chat_checkpoint.py``.
"""

from __future__ import annotations

import dataclasses
import json
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
      strip_actions: the template trims assistant content too (Llama 3's): the rollout feeds
        admissible and expert commands stripped (``action_text``); free decoding, whose actions
        keep their whitespace as sampled, refuses such a template (``chat_checkpoint``).
      source: where the template came from (a checkpoint's file), for messages.
      first_user_prefix: the first user turn's opening where it differs from the later turns'
        (Llama 3.1 renders the tools there); None: ``user_prefix``.
      tool_prefix, tool_suffix: text around a tool result: from after the stop token that
        closed the call to the result, and from the result through the next generation prompt.
      tool_content: how the template writes a result: ``"verbatim"``, ``"strip"`` (trimmed) or
        ``"json"`` (as a JSON string, Llama 3.1's ``tojson``); ``""``: no tool turns.
      append_only: the template rewrites earlier turns (drops their think blocks, or renders an
        assistant turn without the generation prompt that opened it) and the run keeps each turn
        as the policy saw and wrote it instead (``config.model.template_mode='append_only'``;
        ``chat_append_only.check_append_only``). The pieces are the same; only the check differs.
    """

    name: str
    system_prefix: str
    system_suffix: str
    user_prefix: str
    user_suffix: str
    action_suffix: str
    stop_token: str = IM_END
    strip_content: bool = False
    strip_actions: bool = False
    source: str = ""
    first_user_prefix: str | None = None
    tool_prefix: str = ""
    tool_suffix: str = ""
    tool_content: str = ""
    append_only: bool = False

    @property
    def has_tools(self) -> bool:
        """Whether the template was derived with tools: its calls are answered by tool turns."""
        return bool(self.tool_content)

    def system_text(self, system: str) -> str:
        """The system piece as text: what ``system_ids`` encodes."""
        return self.system_prefix + self._content(system) + self.system_suffix

    def turn_text(self, observation: str, *, first: bool) -> str:
        """A user turn as text: what ``turn_ids`` encodes."""
        prefix = self.user_prefix
        if first and self.first_user_prefix is not None:
            prefix = self.first_user_prefix
        text = ("" if first else self.action_suffix) + prefix
        return text + self._content(observation) + self.user_suffix

    def tool_text(self, result: str) -> str:
        """A tool turn as text (what ``tool_ids`` encodes): the text after the call's stop
        token, the result as the template writes it, and the next generation prompt."""
        if not self.has_tools:
            raise ValueError(
                f"chat template {self.name!r} has no tool turns: tool calling needs the "
                "checkpoint's template derived with the env's tools (config.model.template="
                "'checkpoint')"
            )
        content = {"verbatim": result, "strip": result.strip()}.get(self.tool_content)
        if content is None:  # "json"
            content = json.dumps(result, ensure_ascii=False)
        return self.tool_prefix + content + self.tool_suffix

    def tool_ids(self, tokenizer: TokenizerLike, result: str) -> list[int]:
        """Ids fed after a tool call: the tool turn of its ``result`` and the generation prompt."""
        return _encode(tokenizer, self.tool_text(result))

    def system_ids(self, tokenizer: TokenizerLike, system: str) -> list[int]:
        return _encode(tokenizer, self.system_text(system))

    def turn_ids(self, tokenizer: TokenizerLike, observation: str, *, first: bool) -> list[int]:
        """Ids fed before an action: the previous action's closing text (unless first), the obs."""
        return _encode(tokenizer, self.turn_text(observation, first=first))

    def action_text(self, action: str) -> str:
        """A command as the template renders an assistant turn of it (before the stop token)."""
        return action.strip() if self.strip_actions else action

    def stop_id(self, tokenizer: TokenizerLike) -> int:
        return tokenizer.convert_tokens_to_ids(self.stop_token)

    def _content(self, text: str) -> str:
        return text.strip() if self.strip_content else text


def _encode(tokenizer: TokenizerLike, text: str) -> list[int]:
    # Special tokens in the template text are parsed as single ids by HF tokenizers; no BOS/EOS
    # is added, so pieces concatenate to exactly what the model reads.
    return list(tokenizer.encode(text, add_special_tokens=False))
