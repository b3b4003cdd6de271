"""The append-only checks of a checkpoint's chat template (called by chat_checkpoint.py).

Append-only (``checkpoint_template(..., append_only=True)``, ``config.model.template_mode=
'append_only'``, opt-in) is for a template that rewrites history, Qwen3's thinking mode (earlier
think blocks dropped) or DeepSeek-R1-Distill's (the generation prompt opens ``<think>\\n``, which
the earlier assistant turns it renders leave out, with their reasoning). The run keeps each turn
exactly as the policy saw and wrote it: the rollout feeds the same pieces, and the context at turn
k is every earlier turn as it was fed then, never the template's rewrite of it. Only the newest
turn and its generation prompt come from the template, as a server that renders the conversation
for turn k would give them. :func:`check_append_only` verifies what such a context can be checked
against: the first turn (system piece, first user turn and generation prompt) equal to the
template's, as text and ids; the stop token (one id) closing the previous action in the
template's rendering of every later turn; and the piece after it, the next user turn with the
generation prompt, encoded apart equal to the tail of ``apply_chat_template(tokenize=True)``: the
pieces meet at the special stop token. Serving such a policy must feed it the same way (docs/
models.md, "Templates that rewrite history").

The two compose: with tools and append-only (``checkpoint_template(..., tools=...,
append_only=True)``), the call is read after the template's rendering of it wherever that starts,
and :func:`check_tool_turns_append_only` holds the tool turns to the same checks as
:func:`check_append_only` holds user turns: the first turn (with the tools rendered in) as the
template renders it, and each tool result with the generation prompt after the stop id, as the
tail of the template's rendering, text and ids.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentrl_jax.rollout.chat_probe import (
    ACTIONS,
    OBSERVATIONS,
    ChatTemplateError,
    TemplateSource,
    _assistant,
    _first_difference,
    _probe_calls,
    _render,
    _render_ids,
    _show,
    _user,
)
from agentrl_jax.rollout.chat_template import ChatTemplate
from agentrl_jax.rollout.tool_calls import ToolCall, ToolCalling, assistant_message


def check_append_only(
    template: ChatTemplate,
    tokenizer,
    source: TemplateSource,
    *,
    system_prompt: str,
    observations: Sequence[str] = OBSERVATIONS,
    actions: Sequence[str] = ACTIONS,
) -> None:
    """Checks what an append-only context shares with the template (module docstring).

    The context a rollout keeps is every turn as it was fed and sampled; the template may render
    the earlier ones otherwise (that is why the run opted in), so only these are compared:

    - the first turn: the system piece and the first user turn with the generation prompt equal
      ``apply_chat_template([system, user], add_generation_prompt=True)``, as text and as ids;
    - every later turn k: the template's rendering of the conversation up to observation k with
      the generation prompt (what a server renders to ask for action k) ends with the stop token
      and then exactly ``template.turn_text`` of observation k: the previous action is closed by
      the stop id the sampler stops on, and the turn and its generation prompt are the template's;
    - where the pieces meet: that turn's ids encoded apart, after the stop id, are the tail of
      ``apply_chat_template(tokenize=True)`` of the same conversation (no merge across the stop
      token, which is special).

    Args:
      template: the pieces (:func:`derive_template` with ``append_only=True``).
      tokenizer: the checkpoint's tokenizer.
      source: the template's text and origin.
      system_prompt: the run's system prompt.
      observations: ``len(actions) + 1`` user messages.
      actions: the assistant messages (as a policy writes them; the template may rewrite them).

    Raises:
      ChatTemplateError: a turn differs; the message names it and shows both sides.
    """
    if len(observations) != len(actions) + 1:
        raise ValueError(
            f"{len(actions)} actions need {len(actions) + 1} observations; got {len(observations)}"
        )
    messages = _check_first_turn(template, tokenizer, source, system_prompt, observations[0])
    for k, obs in enumerate(observations[1:], start=1):
        messages += [_assistant(actions[k - 1]), _user(obs)]
        _check_newest_turn(
            template,
            tokenizer,
            source,
            messages,
            f"user turn {k + 1} of a {k + 1}-turn conversation",
            template.turn_text(obs, first=False),
            template.turn_ids(tokenizer, obs, first=False),
        )


def check_tool_turns_append_only(
    template: ChatTemplate,
    tokenizer,
    source: TemplateSource,
    tools: ToolCalling,
    *,
    system_prompt: str,
    first_observation: str = OBSERVATIONS[0],
    calls: Sequence[ToolCall] | None = None,
    results: Sequence[str] = OBSERVATIONS[1:],
) -> None:
    """:func:`check_append_only` for tool calling: the same checks, the later turns tool turns.

    The first turn (system piece and first user turn, the tools rendered in, with the generation
    prompt) is compared whole with ``apply_chat_template([system, user], tools=...)``, as text and
    ids; after each call (``tools.render``, rendered by the template from ``tool_calls``), the
    template's rendering of the conversation up to its ``tool`` result must end with the stop
    token and then exactly ``template.tool_text`` of the result, and the ids likewise.

    Args:
      template: the tool template (:func:`derive_tool_template` of an append-only base).
      tokenizer, source: the checkpoint's tokenizer and template.
      tools: the run's tools and call format.
      system_prompt: the run's system prompt.
      first_observation: the user message.
      calls: the calls (default: ``len(results)`` calls of the tools, as
        :func:`check_tool_turns_stable` makes them).
      results: the tool results, one per call.

    Raises:
      ChatTemplateError: a turn differs; the message names it and shows both sides.
    """
    calls = list(calls) if calls is not None else _probe_calls(tools.tools, len(results))
    if len(calls) != len(results):
        raise ValueError(f"{len(calls)} calls need {len(calls)} results; got {len(results)}")
    messages = _check_first_turn(
        template, tokenizer, source, system_prompt, first_observation, tools=tools.tools
    )
    for k, (call, result) in enumerate(zip(calls, results, strict=True)):
        messages += [assistant_message(call), {"role": "tool", "content": result}]
        _check_newest_turn(
            template,
            tokenizer,
            source,
            messages,
            f"tool turn {k + 1} of a conversation of {k + 1} calls",
            template.tool_text(result),
            template.tool_ids(tokenizer, result),
            tools=tools.tools,
        )


def _check_first_turn(
    template: ChatTemplate,
    tokenizer,
    source: TemplateSource,
    system_prompt: str,
    observation: str,
    tools=None,
) -> list[dict]:
    """Append-only's first check: the system piece and the first user turn with the generation
    prompt are the template's rendering of them, as text and ids. Returns the messages."""
    messages = [{"role": "system", "content": system_prompt}, _user(observation)]
    fed = template.system_text(system_prompt) + template.turn_text(observation, first=True)
    whole = _render(tokenizer, source, messages, generation_prompt=True, tools=tools)
    if fed != whole:
        at = _first_difference(fed, whole)
        raise ChatTemplateError(
            f"chat template {source.origin}: append-only keeps the first turn as the template "
            "renders it, but the system piece and the first user turn with the generation prompt "
            f"differ from apply_chat_template of [system, user], first at character {at}: "
            f"{_show(fed, whole, at, ('pieces', 'template'))}"
        )
    fed_ids = template.system_ids(tokenizer, system_prompt)
    fed_ids += template.turn_ids(tokenizer, observation, first=True)
    whole_ids = _render_ids(tokenizer, source, messages, tools=tools)
    if fed_ids != whole_ids:
        at = _first_difference(fed_ids, whole_ids)
        raise ChatTemplateError(
            f"chat template {source.origin}: the first turn's text is the template's but its "
            f"ids encoded piece by piece differ from apply_chat_template(tokenize=True), first at "
            f"id {at}: pieces {tokenizer.convert_ids_to_tokens(fed_ids[at : at + 4])}, whole "
            f"{tokenizer.convert_ids_to_tokens(whole_ids[at : at + 4])}: the system piece and the "
            "first user turn do not meet at a special token"
        )
    return messages


def _check_newest_turn(
    template: ChatTemplate, tokenizer, source: TemplateSource, messages, what, text, ids, tools=None
) -> None:
    """Append-only's check of a later turn (``what``, fed as ``text`` and ``ids``): the template's
    rendering of ``messages`` with the generation prompt ends with the stop token and ``text``,
    and its ids with the stop id and ``ids``."""
    tail = template.stop_token + text
    whole = _render(tokenizer, source, messages, generation_prompt=True, tools=tools)
    if not whole.endswith(tail):
        ends = whole[max(0, len(whole) - len(tail) - 40) :]
        raise ChatTemplateError(
            f"chat template {source.origin}: append-only feeds each later turn as the "
            f"template renders the newest one, after the stop token {template.stop_token!r} "
            f"that closes the previous action, but {what} rendered by apply_chat_template ends "
            f"{ends!r}, not {tail!r}: the template renders a later turn, or the text between an "
            "action and it, otherwise than the first ones (no fixed pieces to feed)"
        )
    tail_ids = [template.stop_id(tokenizer)] + list(ids)
    whole_ids = _render_ids(tokenizer, source, messages, tools=tools)
    if whole_ids[-len(tail_ids) :] != tail_ids:
        raise ChatTemplateError(
            f"chat template {source.origin}: {what} encoded apart, after the stop id, is "
            f"{tokenizer.convert_ids_to_tokens(tail_ids)}, but the tail of "
            "apply_chat_template(tokenize=True) of the conversation is "
            f"{tokenizer.convert_ids_to_tokens(whole_ids[-len(tail_ids) :])}: the pieces do "
            "not meet at the stop token, so the turn cannot be encoded apart"
        )
