"""The actions the model takes, its two formats, the file editor and output truncation.

Two formats (``SweEnv(action_format=...)``): function tools (``"tools"``), declared as JSON
schemas (``TOOL_SCHEMAS``) that the checkpoint's chat template renders and that the policy calls
in its own format (the rollout parses and checks a call; ``from_call`` makes it an ``Action``),
or fenced blocks (``"fenced"``, the default) that ``parse_action`` reads.

Fenced: each turn the model writes one fenced block; the word after the opening fence names the
tool::

    ```bash
    grep -rn "def insert" src/
    ```

    ```view src/pkg/core.py 10 40
    ```

    ```create src/pkg/new.py
    <whole file content>
    ```

    ```str_replace src/pkg/core.py
    <<<<<<< OLD
    return a < b
    =======
    return a <= b
    >>>>>>> NEW
    ```

    ```insert src/pkg/core.py 12
    <lines inserted after line 12; 0 inserts at the top>
    ```

    ```undo src/pkg/core.py
    ```

    ```submit
    ```

Text outside the block is free (reasoning). Only the first block is executed; a reply without a
block, or with an unknown tool or wrong arguments, gets feedback that says what was wrong and
repeats this format (``FORMAT_HELP``). Paths are relative to the repository root.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from typing import Any

from agentrl_jax.envs.base import ToolCall

TOOLS = ("bash", "view", "create", "str_replace", "insert", "undo", "submit")
_FENCE = re.compile(r"```([A-Za-z_]+)([^\n]*)\n(.*?)^```", re.S | re.M)
_REPLACE = re.compile(r"\A<<<<<<< OLD\n(.*?)\n?=======\n(.*?)\n?>>>>>>> NEW\s*\Z", re.S)

FORMAT_HELP = """Reply with exactly one fenced block; the word after ``` names the tool:
```bash
<shell command, run in a fresh shell at the repository root>
```
```view PATH [START END]
```
```create PATH
<file content>
```
```str_replace PATH
<<<<<<< OLD
<exact text to replace, unique in the file>
=======
<new text>
>>>>>>> NEW
```
```insert PATH LINE
<text inserted after LINE (0 = top of file)>
```
```undo PATH
```
```submit
```"""


class ActionError(ValueError):
    """A malformed action; the message is shown to the model."""


@dataclasses.dataclass(frozen=True)
class Action:
    """A parsed action: ``tool``, its ``args`` (from the fence line) and the block ``body``;
    ``replace``: a str_replace's (old, new) text as a tool call gives it (the fenced format
    writes them in the body)."""

    tool: str
    args: tuple[str, ...] = ()
    body: str = ""
    replace: tuple[str, str] | None = None


def _tool(name: str, description: str, properties: dict[str, Any], required=()) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": list(required),
                "additionalProperties": False,
            },
        },
    }


_PATH = {"type": "string", "description": "a path relative to the repository root"}

# The tools as function schemas (apply_chat_template(tools=...)): the same actions as the fenced
# blocks, one schema each.
TOOL_SCHEMAS = (
    _tool(
        "bash",
        "Run a shell command in a fresh shell at the repository root; returns its output and "
        "exit code.",
        {"command": {"type": "string", "description": "the command"}},
        ["command"],
    ),
    _tool(
        "view",
        "Show a file with line numbers (lines start..end when given), or list a directory.",
        {
            "path": _PATH,
            "start": {"type": "integer", "description": "first line shown (with end)"},
            "end": {"type": "integer", "description": "last line shown (with start)"},
        },
        ["path"],
    ),
    _tool(
        "create",
        "Create a new file with the given content.",
        {"path": _PATH, "content": {"type": "string", "description": "the whole file"}},
        ["path", "content"],
    ),
    _tool(
        "str_replace",
        "Replace old_str, which must occur exactly once in the file, with new_str.",
        {
            "path": _PATH,
            "old_str": {"type": "string", "description": "the exact text to replace"},
            "new_str": {"type": "string", "description": "the text it becomes"},
        },
        ["path", "old_str", "new_str"],
    ),
    _tool(
        "insert",
        "Insert text after line `line` of the file (0 inserts at the top).",
        {
            "path": _PATH,
            "line": {"type": "integer", "description": "the line after which to insert"},
            "text": {"type": "string", "description": "the lines inserted"},
        },
        ["path", "line", "text"],
    ),
    _tool("undo", "Undo the last edit of a file.", {"path": _PATH}, ["path"]),
    _tool("submit", "Submit the repository's current diff as the fix; ends the episode.", {}),
)
assert tuple(t["function"]["name"] for t in TOOL_SCHEMAS) == TOOLS

TOOLS_HELP = (
    "Use the tools to explore the repository, edit the code and run commands; call submit "
    "when the issue is resolved."
)


def from_call(call: ToolCall) -> Action:
    """The action of a tool call (already checked against ``TOOL_SCHEMAS`` by the rollout).

    Raises:
      ActionError: what the schemas cannot say: an unknown tool (a call that was not checked),
        an empty command, a view with start but no end (or the other way round).
    """
    a = call.arguments
    if call.name not in TOOLS:
        raise ActionError(f"unknown tool {call.name!r}; tools are {', '.join(TOOLS)}.")
    if call.name == "bash":
        if not str(a.get("command", "")).strip():
            raise ActionError("bash: the command is empty.")
        return Action("bash", (), a["command"])
    if call.name == "submit":
        return Action("submit")
    path = str(a["path"])
    if call.name == "view":
        if ("start" in a) != ("end" in a):
            raise ActionError("view takes path alone, or path with both start and end.")
        lines = (str(a["start"]), str(a["end"])) if "start" in a else ()
        return Action("view", (path, *lines))
    if call.name == "create":
        return Action("create", (path,), a["content"].removesuffix("\n"))
    if call.name == "str_replace":
        return Action("str_replace", (path,), replace=(a["old_str"], a["new_str"]))
    if call.name == "insert":
        return Action("insert", (path, str(a["line"])), a["text"].removesuffix("\n"))
    return Action("undo", (path,))


def parse_action(text: str) -> Action:
    """Parses the first fenced block of a model reply.

    Raises:
      ActionError: no block, unknown tool, or wrong arguments (the message says which).
    """
    m = _FENCE.search(text if text.endswith("\n") else text + "\n")
    if not m:
        raise ActionError("no fenced action block found.")
    tool, rest, body = m.group(1), m.group(2), m.group(3)
    if tool not in TOOLS:
        raise ActionError(f"unknown tool {tool!r}; tools are {', '.join(TOOLS)}.")
    try:
        args = tuple(shlex.split(rest))
    except ValueError as e:
        raise ActionError(f"cannot split the arguments {rest.strip()!r}: {e}.") from None
    if body.endswith("\n"):
        body = body[:-1]
    wanted = {
        "bash": (0, 0),
        "submit": (0, 0),
        "view": (1, 3),
        "create": (1, 1),
        "str_replace": (1, 1),
        "insert": (2, 2),
        "undo": (1, 1),
    }[tool]
    if not wanted[0] <= len(args) <= wanted[1]:
        usage = FORMAT_HELP.split("```" + tool)[1].split("\n")[0].strip() if tool != "bash" else ""
        raise ActionError(
            f"{tool} takes {'no' if wanted[1] == 0 else wanted} argument(s) on the fence line, "
            f"got {list(args)}. Usage: ```{tool} {usage}".rstrip()
        )
    if tool == "bash" and not body.strip():
        raise ActionError("empty bash block: put the command between the fences.")
    if tool == "view" and len(args) == 2:
        raise ActionError("view takes PATH or PATH START END.")
    for a in args[1:]:
        if not a.lstrip("-").isdigit():
            raise ActionError(f"{tool}: {a!r} is not a line number.")
    return Action(tool, args, body)


def truncate(text: str, max_chars: int) -> str:
    """``text`` cut to its head and tail when longer than ``max_chars``, with the elided count."""
    if len(text) <= max_chars:
        return text
    half = max_chars // 2
    elided = len(text) - 2 * half
    return f"{text[:half]}\n[... {elided} characters elided ...]\n{text[-half:]}"


class FileEditor:
    """view / create / str_replace / insert / undo on top of a runtime's file access.

    Args:
      runtime: anything with ``read_file(path) -> str``, ``write_file(path, text)``,
        ``exists(path) -> bool`` and ``exec(command, timeout_s)``.
    """

    def __init__(self, runtime):
        self.runtime = runtime
        self.history: dict[str, list[str | None]] = {}

    def run(self, action: Action) -> str:
        """Applies an editor action and returns the text shown to the model.

        Raises:
          ActionError: a failed edit (missing file, OLD text absent or not unique, ...).
        """
        path = action.args[0]
        return getattr(self, "_" + action.tool)(path, action)

    def _read(self, path: str) -> str:
        try:
            return self.runtime.read_file(path)
        except FileNotFoundError:
            raise ActionError(f"{path}: no such file.") from None
        except IsADirectoryError:
            raise ActionError(f"{path} is a directory.") from None
        except (PermissionError, ValueError) as e:
            raise ActionError(f"{path}: {e}") from None

    def _write(self, path: str, text: str) -> None:
        old = self.runtime.read_file(path) if self.runtime.exists(path) else None
        try:
            self.runtime.write_file(path, text)
        except (PermissionError, ValueError, IsADirectoryError) as e:
            raise ActionError(f"{path}: {e}") from None
        self.history.setdefault(path, []).append(old)

    def _view(self, path: str, action: Action) -> str:
        if self.runtime.is_dir(path):
            r = self.runtime.exec(
                f"find {shlex.quote(path)} -maxdepth 2 -not -path '*/.*' | sort | head -200", 30
            )
            return r.output
        lines = self._read(path).splitlines()
        start, end = 1, len(lines)
        if len(action.args) == 3:
            start, end = int(action.args[1]), int(action.args[2])
            if not 1 <= start <= max(end, 1) or end > len(lines) + 1:
                raise ActionError(f"{path}: lines {start}-{end} out of range 1-{len(lines)}.")
        return "\n".join(f"{i:6d}\t{lines[i - 1]}" for i in range(start, min(end, len(lines)) + 1))

    def _create(self, path: str, action: Action) -> str:
        if self.runtime.exists(path):
            raise ActionError(f"{path} already exists; use str_replace to edit it.")
        self._write(path, action.body + "\n")
        return f"created {path} ({action.body.count(chr(10)) + 1} lines)."

    def _str_replace(self, path: str, action: Action) -> str:
        if action.replace is not None:
            old, new = action.replace
        else:
            m = _REPLACE.match(action.body)
            if not m:
                raise ActionError(
                    "str_replace body must be:\n<<<<<<< OLD\n<old text>\n=======\n<new text>\n"
                    ">>>>>>> NEW"
                )
            old, new = m.group(1), m.group(2)
        text = self._read(path)
        count = text.count(old) if old else 0
        if count != 1:
            what = "not found" if count == 0 else f"found {count} times; make it unique"
            raise ActionError(f"{path}: the OLD text was {what}.")
        self._write(path, text.replace(old, new, 1))
        line = text[: text.index(old)].count("\n") + 1
        return f"edited {path} at line {line}."

    def _insert(self, path: str, action: Action) -> str:
        lines = self._read(path).splitlines(keepends=True)
        at = int(action.args[1])
        if not 0 <= at <= len(lines):
            raise ActionError(f"{path}: insert line {at} out of range 0-{len(lines)}.")
        if lines and not lines[-1].endswith("\n"):
            lines[-1] += "\n"
        lines[at:at] = [action.body + "\n"]
        self._write(path, "".join(lines))
        return f"inserted {action.body.count(chr(10)) + 1} line(s) after line {at} of {path}."

    def _undo(self, path: str, action: Action) -> str:
        stack = self.history.get(path)
        if not stack:
            raise ActionError(f"{path}: no edit to undo.")
        old = stack.pop()
        if old is None:
            self.runtime.remove_file(path)
            return f"undid the creation of {path}."
        self.runtime.write_file(path, old)
        return f"undid the last edit of {path}."
