"""A checkpoint's own chat template, rendered into the pieces a multi-turn rollout feeds.

A Hugging Face checkpoint carries its chat template as jinja text: ``chat_template.jinja`` beside
the tokenizer (what recent transformers write), else the ``chat_template`` field of
``tokenizer_config.json`` (or of ``chat_template.json``). A rollout never renders a whole
conversation: it encodes each piece once, as it enters the model's context (``ChatTemplate``):
the system piece, each user turn with the generation prompt, and the text that closes an action
after the stop token the sampler emits. :func:`derive_template` gets those pieces from the template
itself, by rendering short conversations with ``tokenizer.apply_chat_template`` (transformers' own
jinja environment) and differencing the strings::

    A = render([system])                                         system piece
    B = render([system, user], generation prompt)                A + first user turn
    D = render([system, user, assistant, user], generation p.)   B + action + stop token
                                                                   + closing text + next user turn

Every message's content is a sentinel word, found by position in the rendered text.

:func:`check_prefix_stable` then checks that the pieces are the template: a 10-turn conversation
rendered whole by ``apply_chat_template`` must equal its pieces concatenated, as text and as token
ids (each piece encoded apart, as the rollout does, against the whole text encoded at once: a BPE
merge across a piece boundary shows only there). Nothing is guessed: a template that fails is
refused with a :class:`ChatTemplateError` naming the template's file and the first position
where the two differ. Refused:

- a template that rewrites earlier turns, e.g. Qwen3's, which drops the ``<think>`` block of every
  assistant turn before the last user message: the context a rollout keeps across turns holds the
  action as sampled, which is not what the template renders once the next turn is added. Such a
  template is accepted for a policy that cannot think: under constrained decoding
  (``checkpoint_template(..., actions_think=False)``) every action is one of the env's
  admissible commands, so the check's actions are the probe's without their think blocks (Qwen3
  is then exact over 10 turns, as ChatML);
- one whose earlier text changes when a turn is added (the system piece, or a generation prompt
  that the rendered assistant turn does not start with);
- one whose assistant turn is not closed by a single token (no stop id for the sampler);
- one whose first user turn is not the tail of the later ones (e.g. a system prompt folded into
  the first user message);
- one that changes message content other than by stripping its surrounding whitespace (Llama 3's
  ``| trim`` is handled: the system prompt and observations are stripped before they are fed);
- under free decoding, one that strips the whitespace around assistant content (Llama 3's, again):
  a freely decoded action keeps its whitespace in the rollout's context, its ids as sampled, but
  the template renders it trimmed. Constrained decoding feeds every admissible command (and an
  expert's) stripped, as the template renders it, so there such a template is exact;
- pieces whose token ids differ from the whole conversation's at a boundary, e.g. a generation
  prompt ending in a space that the whole text's encoding merges into the action's first word.

Tool calling (``checkpoint_template(..., tools=ToolCalling(...))``): the template is rendered with
``apply_chat_template(tools=...)``. :func:`derive_tool_template` finds where the tools go (the
system piece, as Qwen's templates put them, or the first user turn, as Llama 3.1's does), how a
call in the policy's format closes, and the text around a ``tool`` result (verbatim, trimmed, or
a JSON string as Llama 3.1's ``tojson`` writes it). :func:`check_tool_turns_stable` then checks a
conversation of 10 calls and 10 tool results, fed piece by piece, against the whole rendered at
once, as text and id for id. In such a conversation every turn after the first user message is a
tool turn, so Qwen3's template keeps every think block (it drops only those before the last user
query); the calls are each format's ``render`` of them, as the template writes ``tool_calls``.

**Append-only** (``checkpoint_template(..., append_only=True)``, ``config.model.template_mode=
'append_only'``, opt-in), for a template that rewrites history (Qwen3 thinking, DeepSeek-R1-
Distill): each turn kept as the policy saw and wrote it, checked by ``rollout/chat_append_only.py``
(with tools too). The probe conversation, :class:`ChatTemplateError` and the rendering and
comparison of pieces that every check uses are ``rollout/chat_probe.py``'s.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Sequence

from agentrl_jax.rollout.chat_append_only import check_append_only, check_tool_turns_append_only
from agentrl_jax.rollout.chat_probe import (
    _ACTION1,
    _SYSTEM,
    _USER1,
    _USER2,
    ACTIONS,
    OBSERVATIONS,
    PLAIN_ACTIONS,
    ChatTemplateError,
    TemplateSource,
    _assistant,
    _compare_pieces,
    _encode,
    _probe_calls,
    _render,
    _split_once,
    _unstable,
    _user,
)
from agentrl_jax.rollout.chat_template import ChatTemplate
from agentrl_jax.rollout.tool_calls import ToolCall, ToolCalling, assistant_message

CHECKPOINT = "checkpoint"  # the name of the template a checkpoint's own becomes

# Where a checkpoint keeps its chat template, most specific first (transformers' order).
JINJA_FILE = "chat_template.jinja"
JSON_FILES = ("tokenizer_config.json", "chat_template.json")

# Sentinel contents for the tool turn and for whitespace (the rest: chat_probe.py).
_TOOL = "TOOLxQ7"
_TOOL_WIDE = ' TOOLxQ7 "quoted"\n\ttab \\ end\n'  # how a template writes a result
_PAD = " \n"  # whitespace around a sentinel, to see whether the template strips content

_APPEND_ONLY = "config.model.template_mode='append_only'"


def read_chat_template(directory: str | pathlib.Path) -> TemplateSource:
    """Reads the chat template of a local checkpoint or tokenizer directory.

    ``chat_template.jinja`` when present, else the ``chat_template`` field of
    ``tokenizer_config.json``, then of ``chat_template.json``. A field holding named templates
    (``[{"name": ..., "template": ...}]``) gives its ``default`` one.

    Raises:
      FileNotFoundError: the directory does not exist.
      ChatTemplateError: no file holds a template, or one is not valid JSON or not jinja text.
    """
    directory = pathlib.Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"checkpoint directory {directory} does not exist")
    jinja = directory / JINJA_FILE
    if jinja.is_file():
        return TemplateSource(jinja.read_text(encoding="utf-8"), str(jinja))
    for name in JSON_FILES:
        path = directory / name
        if not path.is_file():
            continue
        try:
            fields = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ChatTemplateError(f"{path} is not valid JSON: {e}") from e
        template = fields.get("chat_template") if isinstance(fields, dict) else None
        if template is None:
            continue
        if isinstance(template, list):
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            if "default" not in named:
                raise ChatTemplateError(
                    f"{path}: chat_template holds the named templates {sorted(map(str, named))}; "
                    "expected one called 'default'"
                )
            template = named["default"]
        if not isinstance(template, str) or not template.strip():
            raise ChatTemplateError(
                f"{path}: chat_template is {template!r}; expected the template's jinja text"
            )
        return TemplateSource(template, f"{path} (chat_template)")
    found = sorted(p.name for p in directory.iterdir())[:12]
    raise ChatTemplateError(
        f"no chat template in {directory}: expected {JINJA_FILE}, or a chat_template field in "
        f"{' or '.join(JSON_FILES)} (found: {found}); config.model.template='qwen' or 'plain' "
        "names a fixed layout instead"
    )


def derive_template(
    tokenizer, source: TemplateSource, *, append_only: bool = False
) -> ChatTemplate:
    """The template's pieces, by rendering short conversations and differencing the strings.

    Args:
      tokenizer: the checkpoint's tokenizer (transformers), which renders with its special tokens
        (``bos_token`` and the like) as the template expects.
      source: the template's text and origin (:func:`read_chat_template`).
      append_only: the run keeps each turn as fed (module docstring), so the assistant turn the
        template renders once the next user turn follows need not start with the generation
        prompt (DeepSeek-R1-Distill's opens ``<think>\\n``, its rendered turns do not): the stop
        token and the closing text are read after the action wherever the template puts it.

    Returns:
      A ``ChatTemplate`` named ``"checkpoint"`` whose stop token is the token that closes the
      template's assistant turn (``<|im_end|>`` for Qwen, ``<|eot_id|>`` for Llama 3), and
      whose ``strip_content`` / ``strip_actions`` say whether it trims the prompts / actions.

    Raises:
      ChatTemplateError: the template cannot be cut into those pieces (module docstring).
    """
    strip, strip_actions = _strips_content(tokenizer, source)
    system = {"role": "system", "content": _SYSTEM}
    user1, user2 = _user(_USER1), _user(_USER2)
    a = _render(tokenizer, source, [system], generation_prompt=False)
    b = _render(tokenizer, source, [system, user1], generation_prompt=True)
    d = _render(
        tokenizer, source, [system, user1, _assistant(_ACTION1), user2], generation_prompt=True
    )
    system_prefix, system_suffix = _split_once(source, a, _SYSTEM, "[system]")
    if not b.startswith(a):
        raise _unstable(source, "adding the first user turn changes the system piece", a, b)
    user_prefix, user_suffix = _split_once(source, b[len(a) :], _USER1, "[system, user]")
    if append_only:
        _, closing = _split_once(source, d[len(a) :], _ACTION1, "[system, user, assistant, user]")
    elif not d.startswith(b + _ACTION1):
        raise _unstable(
            source,
            "the generation prompt is not how the template renders the assistant turn once the "
            "next user turn follows",
            b + _ACTION1,
            d,
        )
    else:
        closing = d[len(b) + len(_ACTION1) :]
    stop = _stop_token(tokenizer, source, closing)
    later_prefix, later_suffix = _split_once(
        source, closing[len(stop) :], _USER2, "[system, user, assistant, user]"
    )
    if later_suffix != user_suffix:
        raise ChatTemplateError(
            f"chat template {source.origin}: the second user turn ends with {later_suffix!r}, "
            f"the first with {user_suffix!r}; every turn must end with the same generation prompt"
        )
    if not later_prefix.endswith(user_prefix):
        raise ChatTemplateError(
            f"chat template {source.origin}: the first user turn opens with {user_prefix!r}, "
            f"which is not the end of the later turns' opening {later_prefix!r} (a template that "
            "renders the first user message apart, e.g. with the system prompt folded in, is not "
            "supported)"
        )
    return ChatTemplate(
        name=CHECKPOINT,
        system_prefix=system_prefix,
        system_suffix=system_suffix,
        user_prefix=user_prefix,
        user_suffix=user_suffix,
        action_suffix=later_prefix[: len(later_prefix) - len(user_prefix)],
        stop_token=stop,
        strip_content=strip,
        strip_actions=strip_actions,
        source=source.origin,
        append_only=append_only,
    )


def check_prefix_stable(
    template: ChatTemplate,
    tokenizer,
    source: TemplateSource,
    *,
    system_prompt: str,
    observations: Sequence[str] = OBSERVATIONS,
    actions: Sequence[str] = ACTIONS,
) -> None:
    """Checks that the pieces concatenate to what ``apply_chat_template`` renders whole.

    The conversation is the system prompt, ``len(actions)`` turns of (observation, action), then
    one more observation with the generation prompt: what a rollout has fed when it samples its
    next action. The pieces are what the rollout feeds: ``template.system_ids``, then for each
    turn ``template.turn_ids`` and the action's ids closed by the stop id (the action encoded
    alone, as a policy that writes it token by token in its canonical encoding would).

    Args:
      template: the pieces (:func:`derive_template`).
      tokenizer: the checkpoint's tokenizer.
      source: the template's text and origin.
      system_prompt: the run's system prompt.
      observations: ``len(actions) + 1`` user messages.
      actions: the assistant messages.

    Raises:
      ChatTemplateError: the text or the token ids differ; the message gives the first position
        (a character or an id), the piece it falls in, and both sides there.
    """
    if len(observations) != len(actions) + 1:
        raise ValueError(
            f"{len(actions)} actions need {len(actions) + 1} observations; got {len(observations)}"
        )
    messages = [{"role": "system", "content": system_prompt}]
    texts = [("the system piece", template.system_text(system_prompt))]
    ids = [("the system piece", template.system_ids(tokenizer, system_prompt))]
    stop_id = template.stop_id(tokenizer)
    for k, obs in enumerate(observations):
        turn = f"user turn {k + 1}"
        messages.append(_user(obs))
        texts.append((turn, template.turn_text(obs, first=k == 0)))
        ids.append((turn, template.turn_ids(tokenizer, obs, first=k == 0)))
        if k < len(actions):
            messages.append(_assistant(actions[k]))
            texts.append((f"action {k + 1}", actions[k] + template.stop_token))
            ids.append((f"action {k + 1}", _encode(tokenizer, actions[k]) + [stop_id]))

    _compare_pieces(
        tokenizer,
        source,
        messages,
        texts,
        ids,
        unstable=(
            f"a conversation of {len(actions)} turns rendered whole by apply_chat_template "
            "differs from its turns rendered one at a time"
        ),
        why=(
            "The template renders an earlier turn differently once later turns follow (Qwen3's, "
            "e.g., drops the <think> block of assistant turns before the last user message), so "
            "the context a rollout keeps across turns is not what the template renders."
        ),
    )


def derive_tool_template(
    tokenizer, source: TemplateSource, base: ChatTemplate, tools: ToolCalling
) -> ChatTemplate:
    """``base`` (:func:`derive_template`) with the tools rendered in and the tool turn's pieces.

    Renders, with ``apply_chat_template(tools=tools.tools)``: the system prompt and a first user
    message (where the tools land: the system piece, or the first user turn's opening), then a
    call in ``tools.format`` and a ``tool`` result (the text around the result, and how the
    template writes it: verbatim, trimmed, or as a JSON string).

    Raises:
      ChatTemplateError: the template puts the tools elsewhere, renders the call otherwise than
        the format writes it, or changes a result other than those ways.
    """
    schemas = tools.tools
    system = {"role": "system", "content": _SYSTEM}
    first = [system, _user(_USER1)]
    b = _render(tokenizer, source, first, generation_prompt=True, tools=schemas)
    system_prefix, rest = _split_once(source, b, _SYSTEM, "[system, user] with tools")
    middle, user_suffix = _split_once(source, rest, _USER1, "[system, user] with tools")
    if user_suffix != base.user_suffix:
        raise ChatTemplateError(
            f"chat template {source.origin}: with tools, the first user turn ends with "
            f"{user_suffix!r}; without, {base.user_suffix!r}; expected the same generation prompt"
        )
    if middle.endswith(base.user_prefix):  # the tools are in the system piece (Qwen's)
        system_suffix, first_user_prefix = middle[: -len(base.user_prefix)], None
    elif middle.startswith(base.system_suffix):  # in the first user turn (Llama 3.1's)
        system_suffix = base.system_suffix
        first_user_prefix = middle[len(base.system_suffix) :]
    else:
        raise ChatTemplateError(
            f"chat template {source.origin}: with tools, the text between the system prompt and "
            f"the first user message is {middle[:80]!r}..., which neither ends with the user "
            f"turn's opening {base.user_prefix!r} nor starts with the system piece's end "
            f"{base.system_suffix!r}: the tools are rendered where the pieces cannot hold them"
        )
    call = _probe_calls(schemas, 1)[0]
    action = tools.render(call)
    fed = b + action + base.stop_token
    # Append-only: the assistant turn the template renders once a result follows need not open
    # with the generation prompt (the module docstring); the call is read wherever it starts.
    opening = b[: len(b) - len(user_suffix)]

    def tail(content: str) -> str:
        messages = [*first, assistant_message(call), {"role": "tool", "content": content}]
        whole = _render(tokenizer, source, messages, generation_prompt=True, tools=schemas)
        if base.append_only:
            closed = action + base.stop_token
            if whole.startswith(opening) and closed in whole[len(opening) :]:
                return whole[len(opening) :].split(closed, 1)[1]
            raise _unstable(
                source,
                f"a call written in the {tools.format.name!r} format, closed by the stop token, "
                "is not how the template renders the assistant turn's tool_calls (append-only), "
                "or the template changes the first turn once a tool result follows",
                opening + "..." + closed,
                whole,
            )
        if not whole.startswith(fed):
            raise _unstable(
                source,
                f"a call written in the {tools.format.name!r} format is not how the template "
                "renders the assistant turn's tool_calls, or the template changes earlier text "
                "once a tool result follows",
                fed,
                whole,
            )
        return whole[len(fed) :]

    bare, wide = tail(_TOOL), tail(_TOOL_WIDE)
    writes = {
        "verbatim": lambda c: c,
        "strip": lambda c: c.strip(),
        "json": lambda c: json.dumps(c, ensure_ascii=False),
    }
    for mode, write in writes.items():
        if bare.count(write(_TOOL)) != 1:
            continue
        tool_prefix, tool_suffix = bare.split(write(_TOOL))
        if wide == tool_prefix + write(_TOOL_WIDE) + tool_suffix:
            return dataclasses.replace(
                base,
                system_prefix=system_prefix,
                system_suffix=system_suffix,
                first_user_prefix=first_user_prefix,
                tool_prefix=tool_prefix,
                tool_suffix=tool_suffix,
                tool_content=mode,
            )
    raise ChatTemplateError(
        f"chat template {source.origin} writes a tool result other than verbatim, trimmed or as "
        f"a JSON string: {_TOOL_WIDE!r} renders as {wide!r} (with {_TOOL!r}: {bare!r}); the "
        "pieces cannot hold arbitrary results"
    )


def check_tool_turns_stable(
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
    """Checks that a tool-calling conversation fed piece by piece is what ``apply_chat_template
    (tools=...)`` renders whole, as text and id for id.

    The conversation: the system prompt (with the tools), the first observation as the user
    message, then per turn a call (``tools.render``, closed by the stop id) and its ``tool``
    result, then the generation prompt. The pieces are what the rollout feeds:
    ``template.system_ids``, ``template.turn_ids(first=True)``, each call's ids, and
    ``template.tool_ids`` of each result.

    Args:
      template: the tool template (:func:`derive_tool_template`).
      tokenizer, source: the checkpoint's tokenizer and template.
      tools: the run's tools and call format.
      system_prompt: the run's system prompt.
      first_observation: the user message.
      calls: the calls (default: ``len(results)`` calls of the tools, in turn, with arguments
        of each declared type: strings with newlines, quotes and unicode, numbers).
      results: the tool results, one per call.

    Raises:
      ChatTemplateError: the text or the ids differ (the first position, its piece, both sides).
    """
    calls = list(calls) if calls is not None else _probe_calls(tools.tools, len(results))
    if len(calls) != len(results):
        raise ValueError(f"{len(calls)} calls need {len(calls)} results; got {len(results)}")
    messages = [{"role": "system", "content": system_prompt}, _user(first_observation)]
    texts = [
        ("the system piece", template.system_text(system_prompt)),
        ("user turn 1", template.turn_text(first_observation, first=True)),
    ]
    ids = [
        ("the system piece", template.system_ids(tokenizer, system_prompt)),
        ("user turn 1", template.turn_ids(tokenizer, first_observation, first=True)),
    ]
    stop_id = template.stop_id(tokenizer)
    for k, (call, result) in enumerate(zip(calls, results, strict=True)):
        action = tools.render(call)
        messages += [assistant_message(call), {"role": "tool", "content": result}]
        texts += [
            (f"call {k + 1}", action + template.stop_token),
            (f"tool turn {k + 1}", template.tool_text(result)),
        ]
        ids += [
            (f"call {k + 1}", _encode(tokenizer, action) + [stop_id]),
            (f"tool turn {k + 1}", template.tool_ids(tokenizer, result)),
        ]
    _compare_pieces(
        tokenizer,
        source,
        messages,
        texts,
        ids,
        tools=tools.tools,
        unstable=(
            f"a conversation of {len(calls)} tool calls and results rendered whole by "
            "apply_chat_template(tools=...) differs from its turns rendered one at a time"
        ),
        why=(
            "The template renders an earlier call or tool result differently once later turns "
            "follow, so the context a rollout keeps across turns is not what it renders."
        ),
    )


def checkpoint_template(
    directory: str | pathlib.Path,
    tokenizer,
    *,
    system_prompt: str,
    actions_think: bool = True,
    tools: ToolCalling | None = None,
    append_only: bool = False,
) -> ChatTemplate:
    """The chat template of a checkpoint directory, cut into pieces and checked (run start).

    ``actions_think``: free decoding, the policy may write think blocks and whitespace around an
    action, so the check's actions include a think block and a template that trims actions is
    refused; False (constrained decoding: only admissible commands) checks ``PLAIN_ACTIONS``.

    ``tools``: tool calling; the template is derived with the tools rendered in and tool turns
    (:func:`derive_tool_template`) and checked on a tool-calling conversation
    (:func:`check_tool_turns_stable`): every action is then a call, rendered by the template
    from its ``tool_calls`` (never trimmed), so ``actions_think`` does not apply.

    ``append_only``: each turn is kept as the policy saw and wrote it, so a template that
    rewrites earlier turns (or trims actions) is taken, checked by :func:`check_append_only`;
    with ``tools``, by :func:`check_tool_turns_append_only` (its tool turns held to the same).

    Raises:
      FileNotFoundError: no such directory.
      ChatTemplateError: no template, or one refused (module docstring).
    """
    source = read_chat_template(directory)
    template = derive_template(tokenizer, source, append_only=append_only)
    if tools is not None:
        template = derive_tool_template(tokenizer, source, template, tools)
        check = check_tool_turns_append_only if append_only else check_tool_turns_stable
        check(template, tokenizer, source, tools, system_prompt=system_prompt)
        return template
    actions = ACTIONS if actions_think else PLAIN_ACTIONS
    if append_only:
        check_append_only(template, tokenizer, source, system_prompt=system_prompt, actions=actions)
        return template
    if actions_think and template.strip_actions:
        raise ChatTemplateError(
            f"chat template {source.origin} strips the whitespace around assistant content "
            "(Llama 3's | trim): under free decoding an action the policy writes with whitespace "
            'at either end ("go north\\n") stays in the rollout\'s context as sampled but is '
            "rendered trimmed, so the context is not the template's conversation. Use "
            "constrained decoding (config.rollout.constrain_actions=True), which feeds the "
            "admissible commands stripped as the template renders them, or a template that "
            "keeps assistant content verbatim: config.model.template='qwen' or 'plain', or a "
            "chat_template.jinja of your own beside the checkpoint's tokenizer; or keep each "
            f"action as the policy wrote it: {_APPEND_ONLY}"
        )
    check_prefix_stable(template, tokenizer, source, system_prompt=system_prompt, actions=actions)
    return template


# ------------------------------------------------------------------------ helpers


def _strips_content(tokenizer, source: TemplateSource) -> tuple[bool, bool]:
    """Whether the template strips the content of the prompts (system and user) and of the
    assistant's turns (Llama 3's ``| trim``, every role), or keeps it verbatim.

    Raises:
      ChatTemplateError: it does something else to a role's content, or strips system content
        but not user content (or the other way round).
    """
    padded = _PAD + "{}" + _PAD
    system = {"role": "system", "content": _SYSTEM}
    cases = {
        "system": (lambda c: [{"role": "system", "content": c}], _SYSTEM),
        "user": (lambda c: [system, _user(c)], _USER1),
        # The assistant turn closed by a next user turn, as a rollout's context holds it.
        "assistant": (lambda c: [system, _user(_USER1), _assistant(c), _user(_USER2)], _ACTION1),
    }
    strips = {}
    for role, (conversation, word) in cases.items():
        bare = _render(tokenizer, source, conversation(word), generation_prompt=True)
        wide = _render(tokenizer, source, conversation(padded.format(word)), generation_prompt=True)
        if wide == bare.replace(word, padded.format(word)):
            strips[role] = False
        elif wide == bare:
            strips[role] = True
        else:
            raise ChatTemplateError(
                f"chat template {source.origin} changes {role} content other than by stripping "
                f"its surrounding whitespace: {padded.format(word)!r} renders as {wide!r} (with "
                f"{word!r}: {bare!r}); the pieces cannot hold arbitrary text"
            )
    if strips["system"] != strips["user"]:
        raise ChatTemplateError(
            f"chat template {source.origin} strips the whitespace around "
            f"{'system' if strips['system'] else 'user'} content but not around "
            f"{'user' if strips['system'] else 'system'} content; expected both or neither"
        )
    return strips["user"], strips["assistant"]


def _stop_token(tokenizer, source: TemplateSource, closing: str) -> str:
    """The token that closes an assistant turn: the tokenizer's longest added token that the
    text after the action starts with (``<|im_end|>``, ``<|eot_id|>``), one id."""
    added = {t.content for t in tokenizer.added_tokens_decoder.values() if t.content}
    starts = [t for t in added if closing.startswith(t)]
    if not starts:
        raise ChatTemplateError(
            f"chat template {source.origin}: the text that closes an assistant turn, "
            f"{closing[:40]!r}, does not start with one of the tokenizer's special or added "
            "tokens, so the sampler has no stop id that ends an action"
        )
    stop = max(starts, key=len)
    if _encode(tokenizer, stop) != [tokenizer.convert_tokens_to_ids(stop)]:
        raise ChatTemplateError(
            f"chat template {source.origin}: the stop token {stop!r} encodes as "
            f"{_encode(tokenizer, stop)}; expected one id"
        )
    return stop
