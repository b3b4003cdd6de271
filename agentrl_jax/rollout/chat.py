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

The pieces' type, ``ChatTemplate``, is defined in ``rollout/chat_template.py`` (which
``chat_checkpoint`` builds on) and re-exported here; ``get_template`` is the one way in.
"""

from __future__ import annotations

from agentrl_jax.rollout import chat_checkpoint
from agentrl_jax.rollout.chat_checkpoint import CHECKPOINT
from agentrl_jax.rollout.chat_template import (
    ENDOFTEXT,
    IM_END,
    IM_START,
    ChatTemplate,
    TokenizerLike,
)
from agentrl_jax.rollout.tool_calls import ToolCalling

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


def get_template(
    name: str,
    tokenizer=None,
    *,
    directory: str = "",
    system_prompt: str = "",
    actions_think: bool = True,
    tools: ToolCalling | None = None,
    append_only: bool = False,
) -> ChatTemplate:
    """The chat template called ``name``: a fixed one, or ``"checkpoint"``, read and checked.

    Args:
      name: ``"qwen"``, ``"plain"`` or ``"checkpoint"``.
      tokenizer: the run's tokenizer (``"checkpoint"`` only: it renders and encodes the checks).
      directory: the checkpoint or tokenizer directory whose chat template to read
        (``"checkpoint"`` only).
      system_prompt: the run's system prompt, used in the check (``"checkpoint"`` only).
      actions_think: free decoding: the policy's actions may hold think blocks and whitespace
        at either end; False for constrained decoding, whose actions are admissible commands
        (``"checkpoint"`` only: a template that drops earlier think blocks, Qwen3's, or trims
        actions, Llama 3's, is then exact; under free decoding it is refused).
      append_only: keep each turn as the policy saw and wrote it, the generation prompt from the
        template, for a template that rewrites history (``"checkpoint"`` only;
        ``chat_append_only.check_append_only``).

    Raises:
      ValueError: an unknown name; ``"checkpoint"`` without a tokenizer or directory; a
        checkpoint template that cannot be used (``chat_probe.ChatTemplateError``).
    """
    if name == CHECKPOINT:
        if tokenizer is None or not directory:
            raise ValueError(
                "chat template 'checkpoint' reads the template of a checkpoint or tokenizer "
                "directory: pass tokenizer= and directory= (config.model.checkpoint or "
                "config.model.tokenizer)"
            )
        return chat_checkpoint.checkpoint_template(
            directory,
            tokenizer,
            system_prompt=system_prompt,
            actions_think=actions_think,
            tools=tools,
            append_only=append_only,
        )
    if tools is not None:
        raise ValueError(
            f"chat template {name!r} cannot render tools: tool calling renders the env's tools "
            "and the tool turns with the checkpoint's own template (config.model.template="
            "'checkpoint')"
        )
    if append_only:
        raise ValueError(
            f"append-only applies to a checkpoint's own chat template; {name!r} renders every "
            "turn as it was fed"
        )
    if name not in TEMPLATES:
        valid = sorted((*TEMPLATES, CHECKPOINT))
        raise ValueError(f"unknown chat template {name!r}; valid templates: {valid}")
    return TEMPLATES[name]


__all__ = [
    "CHECKPOINT",
    "ENDOFTEXT",
    "IM_END",
    "IM_START",
    "TEMPLATES",
    "ChatTemplate",
    "TokenizerLike",
    "get_template",
]
