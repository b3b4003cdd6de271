"""Tool calls in the checkpoint's own format: parsing, checking against the schemas, rendering.

An env that offers function tools (``Env.tool_schemas``) is played in tool-calling mode: the
checkpoint's chat template renders the tools in its system turn (``apply_chat_template(tools=...)``,
``chat_checkpoint.checkpoint_template(..., tools=...)``), the policy writes a call in its model
family's format, and the env's answer comes back as a ``tool`` turn. This module holds the formats
and the check of a call against the tools' JSON schemas; it sits beside the template that renders
the calls and results (``chat_template.py``, ``chat_checkpoint.py``).

Formats (a registry keyed by name, as the model families' in ``models/registry.py``):

- ``qwen``: Qwen2.5 and Qwen3 (Hermes style), one block anywhere in the reply (text before it,
  e.g. reasoning, is free)::

      <tool_call>
      {"name": "view", "arguments": {"path": "src/core.py"}}
      </tool_call>

- ``llama3_json``: Llama 3.1 / 3.2 / 3.3, the whole reply is one JSON object::

      {"name": "view", "parameters": {"path": "src/core.py"}}

``register_format(ToolFormat(...))`` adds another. A format's ``render`` writes a call exactly as
the family's template renders an assistant turn's ``tool_calls`` (``json.dumps`` with its default
separators, non-ASCII kept, as the templates' ``tojson``), so a policy that writes that text holds
the template's own conversation in its context, token for token.

A reply that is not a well-formed call is not an exception: ``ToolCalling.parse`` raises
``ToolCallError`` whose message names the problem (no call, bad JSON, unknown tool, a missing
required argument, an argument of the wrong type), and the rollout feeds that message back as the
tool turn, counts it (``rollout/invalid_tool_call_rate``), and the episode goes on.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from agentrl_jax.envs.base import ToolCall

__all__ = [
    "FORMATS",
    "ToolCall",
    "ToolCallError",
    "ToolCalling",
    "ToolFormat",
    "assistant_message",
    "get_format",
    "register_format",
    "tool_names",
    "validate_call",
]


class ToolCallError(ValueError):
    """A reply that is not a valid call of one of the env's tools; the message, shown to the
    policy as the tool turn, names the problem."""


@dataclasses.dataclass(frozen=True)
class ToolFormat:
    """How one model family writes a tool call.

    Attributes:
      name: the registry key (``config`` names it).
      parse: the policy's reply text -> ``ToolCall`` (name and arguments; not yet checked
        against the schemas); raises ``ToolCallError`` naming what is malformed.
      render: a call -> the reply text the family's template renders for an assistant turn with
        that one ``tool_calls`` entry (what ``parse`` reads back to the same call).
      description: one line for docs and errors.
    """

    name: str
    parse: Callable[[str], ToolCall]
    render: Callable[[ToolCall], str]
    description: str = ""


FORMATS: dict[str, ToolFormat] = {}


def register_format(fmt: ToolFormat) -> ToolFormat:
    """Adds ``fmt`` to the registry under ``fmt.name`` (replacing none: a name is taken once).

    Raises:
      ValueError: the name is already registered.
    """
    if fmt.name in FORMATS:
        raise ValueError(f"tool-call format {fmt.name!r} is already registered")
    FORMATS[fmt.name] = fmt
    return fmt


def get_format(name: str) -> ToolFormat:
    """The registered format called ``name``.

    Raises:
      ValueError: naming the registered formats.
    """
    if name not in FORMATS:
        raise ValueError(f"unknown tool-call format {name!r}; registered: {sorted(FORMATS)}")
    return FORMATS[name]


def _dumps(value: Any) -> str:
    # transformers' jinja ``tojson``: json.dumps with its default separators, non-ASCII kept.
    return json.dumps(value, ensure_ascii=False)


def _call_from(obj: Any, args_key: str, where: str) -> ToolCall:
    """A ``ToolCall`` from a decoded JSON object ``{"name": ..., args_key: {...}}``."""
    if not isinstance(obj, dict):
        raise ToolCallError(
            f"the {where} is {type(obj).__name__} JSON; expected an object "
            f'{{"name": <tool name>, "{args_key}": {{...}}}}'
        )
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise ToolCallError(f'the {where} has no "name" string; expected the tool\'s name')
    arguments = obj.get(args_key, {})
    if isinstance(arguments, str):  # some checkpoints write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as e:
            raise ToolCallError(f'"{args_key}" of {name} is a string that is not JSON: {e}') from e
    if not isinstance(arguments, dict):
        raise ToolCallError(
            f'"{args_key}" of {name} is {type(arguments).__name__}; expected a JSON object of '
            "argument names and values"
        )
    return ToolCall(name, arguments)


def _loads(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ToolCallError(f"bad JSON in the {where}: {e.msg} at character {e.pos}") from e


_QWEN_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


def _parse_qwen(text: str) -> ToolCall:
    blocks = _QWEN_BLOCK.findall(text)
    if not blocks:
        if "<tool_call>" in text:
            raise ToolCallError("a <tool_call> block is not closed by </tool_call>")
        raise ToolCallError(
            'no tool call: write one <tool_call>{"name": <tool name>, "arguments": {...}}'
            "</tool_call> block"
        )
    if len(blocks) > 1:
        raise ToolCallError(f"{len(blocks)} <tool_call> blocks; expected one call per turn")
    return _call_from(_loads(blocks[0].strip(), "<tool_call> block"), "arguments", "tool call")


def _render_qwen(call: ToolCall) -> str:
    return (
        f'<tool_call>\n{{"name": "{call.name}", "arguments": {_dumps(call.arguments)}}}\n'
        "</tool_call>"
    )


def _parse_llama3_json(text: str) -> ToolCall:
    body = text.strip().removeprefix("<|python_tag|>").strip()
    if not body.startswith("{"):
        raise ToolCallError(
            'no tool call: reply with one JSON object {"name": <tool name>, "parameters": {...}}'
        )
    try:
        obj, end = json.JSONDecoder().raw_decode(body)
    except json.JSONDecodeError as e:
        raise ToolCallError(f"bad JSON in the tool call: {e.msg} at character {e.pos}") from e
    if body[end:].strip():
        raise ToolCallError(
            f"text after the tool call's JSON object: {body[end:].strip()[:40]!r}; expected one "
            "call per turn and nothing else"
        )
    key = "parameters" if not isinstance(obj, dict) or "arguments" not in obj else "arguments"
    return _call_from(obj, key, "tool call")


def _render_llama3_json(call: ToolCall) -> str:
    return f'{{"name": "{call.name}", "parameters": {_dumps(call.arguments)}}}'


register_format(
    ToolFormat(
        "qwen",
        _parse_qwen,
        _render_qwen,
        'Qwen2.5 / Qwen3: <tool_call>{"name": ..., "arguments": {...}}</tool_call>',
    )
)
register_format(
    ToolFormat(
        "llama3_json",
        _parse_llama3_json,
        _render_llama3_json,
        'Llama 3.1+: the reply is {"name": ..., "parameters": {...}}',
    )
)


# ------------------------------------------------------------------------- schema checks

_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}
_JSON_NAMES = {str: "a string", bool: "a boolean", int: "an integer", float: "a number"}


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    """The ``function`` part of a tool schema (``{"type": "function", "function": {...}}``), or
    the schema itself when it is given bare (``{"name", "parameters"}``)."""
    return tool.get("function", tool)


def tool_names(tools: Sequence[dict[str, Any]]) -> list[str]:
    return [_function(t)["name"] for t in tools]


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return _JSON_NAMES.get(type(value), type(value).__name__)


def validate_call(call: ToolCall, tools: Sequence[dict[str, Any]]) -> None:
    """Checks ``call`` against the tools' JSON schemas: a known tool, its required arguments
    present, each argument of its declared ``type`` (and in its ``enum``), and no argument the
    schema does not declare where it sets ``additionalProperties: false``.

    Raises:
      ToolCallError: the first problem, named (the tool, the argument, what was expected).
    """
    by_name = {_function(t)["name"]: _function(t) for t in tools}
    if call.name not in by_name:
        raise ToolCallError(f"unknown tool {call.name!r}; the tools are {', '.join(by_name)}")
    params = by_name[call.name].get("parameters") or {}
    props = params.get("properties", {})
    for name in params.get("required", ()):
        if name not in call.arguments:
            raise ToolCallError(f"missing required argument {name!r} of {call.name}")
    for name, value in call.arguments.items():
        if name not in props:
            if params.get("additionalProperties", True) is False:
                raise ToolCallError(
                    f"unknown argument {name!r} of {call.name}; its arguments are "
                    f"{', '.join(props) or 'none'}"
                )
            continue
        schema = props[name]
        types = schema.get("type")
        types = [types] if isinstance(types, str) else list(types or ())
        if types and not any(_TYPES.get(t, lambda v: True)(value) for t in types):
            raise ToolCallError(
                f"argument {name!r} of {call.name} must be {' or '.join(types)}; got "
                f"{_dumps(value)[:40]} ({_kind(value)})"
            )
        if "enum" in schema and value not in schema["enum"]:
            raise ToolCallError(
                f"argument {name!r} of {call.name} is {_dumps(value)[:40]}; expected one of "
                f"{schema['enum']}"
            )


@dataclasses.dataclass(frozen=True)
class ToolCalling:
    """A run's tool calling: the env's tools and the policy's call format.

    Attributes:
      tools: the env's function tools as JSON schemas (``Env.tool_schemas``).
      format: how the policy writes a call (its model family's, or a registered one).
    """

    tools: tuple[dict[str, Any], ...]
    format: ToolFormat

    def __post_init__(self):
        if not self.tools:
            raise ValueError("tool calling needs at least one tool schema; the env offers none")
        for t in self.tools:
            if not isinstance(_function(t).get("name"), str):
                raise ValueError(f"tool schema {t!r} has no function name")

    def parse(self, text: str) -> ToolCall:
        """The call in the policy's reply ``text``, checked against the tools.

        Raises:
          ToolCallError: naming what is malformed (the message becomes the tool turn).
        """
        call = self.format.parse(text)
        validate_call(call, self.tools)
        return call

    def render(self, call: ToolCall) -> str:
        return self.format.render(call)


def assistant_message(call: ToolCall) -> dict[str, Any]:
    """The assistant message of one call, as ``apply_chat_template`` takes it."""
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": call.name, "arguments": call.arguments}}
        ],
    }
