"""The probe a checkpoint's chat template is checked on, and how it is rendered and compared.

Shared by the checks of ``rollout/chat_checkpoint.py`` (prefix stability, tool turns) and
``rollout/chat_append_only.py``: the error a refused template raises (:class:`ChatTemplateError`)
and its source (:class:`TemplateSource`); the sentinel words and the 10-turn conversation the
checks render (``OBSERVATIONS``, ``ACTIONS``, ``PLAIN_ACTIONS``); calls of a run's tools with
arguments of each declared type; and the helpers that render a conversation with
``tokenizer.apply_chat_template`` (transformers' own jinja environment, as text and as ids) and
compare it with the pieces a rollout feeds, naming the first position where they differ.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from agentrl_jax.rollout.tool_calls import ToolCall

# Sentinel contents: single words no template trims, escapes or splits.
_SYSTEM, _USER1, _ACTION1, _USER2 = "SYSTEMxQ7", "USERxQ7a", "ACTIONxQ7", "USERxQ7b"

# The conversation the check renders: env-like observations (newlines, runs of spaces, digits,
# unicode, whitespace at either end) and actions as a policy writes them (one with a think block,
# which a template that rewrites reasoning in earlier turns changes).
OBSERVATIONS = (
    "-= Kitchen =-\nYou are in a kitchen. There is a closed fridge and a wooden table here.\n\n"
    "Admissible commands: open fridge, go north, look",
    "You open the fridge, revealing 2 red apples and 12 eggs.",
    " Your score has just gone up by 1 point.\n",
    "\nYou are carrying:\n  a brass key\n  a loaf of bread",
    "-= Corridor =-\n\n\nExits: north, south. There is a locked door here.",
    "You arrive at countertop 1. On the countertop 1, you see a mug 2, and a knife 1.",
    "Nothing happens.  ",
    "Ünïcödé signs: ∑ ≥ 😀 — “quoted” text.",
    "Your task is to: put a clean mug in coffeemachine.\t",
    "> look\nYou see nothing special.",
    "*** The End *** You scored 3 out of a possible 3, in 10 turns.",
)
ACTIONS = (
    "open fridge",
    "take red apple from fridge",
    "go north",
    "<think>\nThe door is locked; the brass key opens it.\n</think>\n\nunlock door with brass key",
    "inventory",
    "take mug 2 from countertop 1",
    "look",
    "examine ∑",
    "put mug 2 in/on coffeemachine 1",
    "go south",
)

# The probe's actions as a policy under constrained decoding writes them: no think block.
PLAIN_ACTIONS = tuple(a.split("</think>")[-1].strip() for a in ACTIONS)

_FIXES = (
    "Use a template that renders every turn once, as it was fed: config.model.template='qwen' for "
    "a ChatML checkpoint (Qwen2.5, Qwen3), or a chat_template.jinja of your own beside the "
    "checkpoint's tokenizer. A template that only drops think blocks is exact for a policy that "
    "writes none: constrained decoding (config.rollout.constrain_actions=True) checks it so. Or "
    "opt in to keeping each turn exactly as the policy saw and wrote it, with the generation "
    "prompt from the template (Qwen3 thinking, DeepSeek-R1-Distill): "
    "config.model.template_mode='append_only' (docs/models.md says what serving such a policy "
    "must then reproduce)."
)


class ChatTemplateError(ValueError):
    """A checkpoint's chat template cannot be used; the message names it and says where."""


@dataclasses.dataclass(frozen=True)
class TemplateSource:
    """A chat template's jinja text and the file it was read from (``origin``, for messages)."""

    text: str
    origin: str


# Argument values of each JSON type for the probe's calls: text as an agent writes it.
_PROBE_VALUES = {
    "string": (
        "src/pkg/core.py",
        'grep -rn "def insert" src/ | head -5\necho done',
        "    return a <= b\n",
        "Ünïcödé ∑ ≥ 😀 — “quoted” \\ backslash\ttab",
    ),
    "integer": (0, 12, 7, 240),
    "number": (1.5, 0, -2.25, 10),
    "boolean": (True, False, True, False),
    "array": (["a", 1], [], ["x"], [True]),
    "object": ({"k": "v"}, {}, {"n": 2}, {"a": [1]}),
}


def _probe_calls(tools: Sequence[dict], count: int) -> list[ToolCall]:
    """``count`` calls of ``tools`` in turn, every declared argument given a value of its type."""
    calls = []
    for k in range(count):
        fn = tools[k % len(tools)].get("function", tools[k % len(tools)])
        props = (fn.get("parameters") or {}).get("properties", {})
        arguments = {}
        for j, (name, schema) in enumerate(props.items()):
            kind = schema.get("type", "string")
            kind = kind[0] if isinstance(kind, list) else kind
            values = schema.get("enum") or _PROBE_VALUES.get(kind, _PROBE_VALUES["string"])
            arguments[name] = values[(k + j) % len(values)]
        calls.append(ToolCall(fn["name"], arguments))
    return calls


# ----------------------------------------------------------------------------- helpers


def _compare_pieces(tokenizer, source, messages, texts, ids, *, unstable, why, tools=None):
    """Raises ChatTemplateError where the pieces (``texts``, ``ids``: (label, piece) pairs) are
    not ``messages`` rendered whole (with the generation prompt), as text, then id for id."""
    whole = _render(tokenizer, source, messages, generation_prompt=True, tools=tools)
    pieces = "".join(text for _, text in texts)
    if pieces != whole:
        at = _first_difference(pieces, whole)
        raise ChatTemplateError(
            f"chat template {source.origin} is not prefix-stable: {unstable}, first at character "
            f"{at} (in {_piece_at(texts, at)}): {_show(pieces, whole, at)}. {why} {_FIXES}"
        )
    whole_ids = _render_ids(tokenizer, source, messages, tools=tools)
    piece_ids = [i for _, part in ids for i in part]
    if piece_ids != whole_ids:
        at = _first_difference(piece_ids, whole_ids)
        window = slice(max(0, at - 3), at + 4)
        raise ChatTemplateError(
            f"chat template {source.origin}: the text is prefix-stable but the token ids are not: "
            f"the pieces encoded one at a time ({len(piece_ids)} ids) differ from "
            f"apply_chat_template(tokenize=True) of the whole conversation ({len(whole_ids)} "
            f"ids), first at id {at} (in {_piece_at(ids, at)}): pieces "
            f"{tokenizer.convert_ids_to_tokens(piece_ids[window])}, whole "
            f"{tokenizer.convert_ids_to_tokens(whole_ids[window])} (ids from {window.start}). "
            "The tokenizer merges characters across a piece boundary (a generation prompt ending "
            "in whitespace that the action's first token absorbs, or a pre-tokenizer that splits "
            "a run of newlines by what follows), so the pieces cannot be encoded apart. Use a "
            "template whose pieces meet at special tokens: config.model.template='qwen' or "
            "'plain', or a chat_template.jinja of your own beside the checkpoint's tokenizer."
        )


def _user(content: str) -> dict[str, str]:
    return {"role": "user", "content": content}


def _assistant(content: str) -> dict[str, str]:
    return {"role": "assistant", "content": content}


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def _render_ids(tokenizer, source: TemplateSource, messages, tools=None) -> list[int]:
    """``apply_chat_template(tokenize=True)`` of ``messages`` with the generation prompt (and
    ``tools``): the reference ids (the template text encoded at once, its special tokens as
    single ids)."""
    return list(
        tokenizer.apply_chat_template(
            messages,
            chat_template=source.text,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
            tools=list(tools) if tools else None,
        )
    )


def _render(
    tokenizer, source: TemplateSource, messages, generation_prompt: bool, tools=None
) -> str:
    try:
        return tokenizer.apply_chat_template(
            messages,
            chat_template=source.text,
            add_generation_prompt=generation_prompt,
            tokenize=False,
            tools=list(tools) if tools else None,
        )
    except Exception as e:  # A template is user code: any failure names it and the conversation.
        roles = [m["role"] for m in messages]
        raise ChatTemplateError(
            f"chat template {source.origin} failed to render the conversation {roles} "
            f"(add_generation_prompt={generation_prompt}): {type(e).__name__}: {e}"
        ) from e


def _split_once(source: TemplateSource, text: str, word: str, what: str) -> tuple[str, str]:
    """``text`` before and after the one occurrence of sentinel ``word``."""
    if text.count(word) != 1:
        raise ChatTemplateError(
            f"chat template {source.origin}: rendering {what} shows the message content "
            f"{text.count(word)} times in {text!r}; expected it once"
        )
    before, after = text.split(word)
    return before, after


def _unstable(source: TemplateSource, what: str, before: str, after: str) -> ChatTemplateError:
    at = _first_difference(before, after)
    return ChatTemplateError(
        f"chat template {source.origin} is not prefix-stable: {what}, first at character {at}: "
        f"{_show(before, after, at, ('fed', 'rendered later'))}. {_FIXES}"
    )


def _first_difference(a: Sequence, b: Sequence) -> int:
    """The first index where ``a`` and ``b`` differ (the shorter one's length if one is a prefix
    of the other)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _piece_at(pieces: list[tuple[str, Sequence]], at: int) -> str:
    """The label of the piece that holds position ``at`` of the pieces concatenated."""
    start = 0
    for label, part in pieces:
        if at < start + len(part):
            return f"{label}, at {at - start} of its {len(part)}"
        start += len(part)
    return "the end of the pieces"


def _show(a: str, b: str, at: int, names: tuple[str, str] = ("turn by turn", "whole")) -> str:
    return (
        f"after {a[max(0, at - 40) : at]!r}, {names[0]} {a[at : at + 40]!r} but {names[1]} "
        f"{b[at : at + 40]!r}"
    )
