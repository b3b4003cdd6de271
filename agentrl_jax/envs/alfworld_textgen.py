"""Memoized parsing for TextWorld's PDDL text generator: same text, several times faster steps.

Every step of TextWorld's PDDL engine renders the command of each admissible action, and the
feedback, through its context-sensitive grammar (``textworld.envs.pddl.textgen``). Each render
re-parses the same few hundred template strings with a tatsu PEG parser: ``_parse_and_convert``
for grammar symbols and ``Rule.parse_conjunctive_query`` for rule conditions. Profiling one real
ALFWorld game (textworld 1.7.0) puts about 60% of a step in those two parsers.

Both are pure functions of their string argument, so ``install()`` memoizes them: the first parse
of a string is kept and each call gets a deep copy (the engine mutates the symbols it is given, so
sharing them would not be safe). The patch is confined to the ``textgen`` module's own names (no
other TextWorld code path sees it), is idempotent, and ``uninstall()`` restores the originals.
tests/test_alfworld.py checks that whole episodes (every feedback, admissible command list and
state key) are identical with and without it.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from textworld.envs.pddl import textgen
from textworld.logic import Rule

_ORIGINAL_PARSE = textgen._parse_and_convert
_ORIGINAL_RULE = textgen.Rule


@functools.lru_cache(maxsize=8192)
def _parsed_symbols(text: str, kwargs: tuple[tuple[str, Any], ...]) -> Any:
    return _ORIGINAL_PARSE(text, **dict(kwargs))


@functools.lru_cache(maxsize=8192)
def _parsed_query(expr: str) -> Rule:
    return _ORIGINAL_RULE.parse_conjunctive_query(expr)


def _parse_and_convert(*args: Any, **kwargs: Any) -> Any:
    if len(args) != 1 or not isinstance(args[0], str):
        return _ORIGINAL_PARSE(*args, **kwargs)
    return copy.deepcopy(_parsed_symbols(args[0], tuple(sorted(kwargs.items()))))


class _MemoRule(Rule):
    """``Rule`` whose conjunctive-query parser is memoized (seen only by ``textgen``)."""

    @classmethod
    def parse_conjunctive_query(cls, expr: str) -> Rule:
        return copy.deepcopy(_parsed_query(expr))


def install() -> None:
    """Memoizes the grammar parsers of TextWorld's PDDL text generator (idempotent)."""
    textgen._parse_and_convert = _parse_and_convert
    textgen.Rule = _MemoRule


def uninstall() -> None:
    """Restores TextWorld's own parsers."""
    textgen._parse_and_convert = _ORIGINAL_PARSE
    textgen.Rule = _ORIGINAL_RULE


def installed() -> bool:
    return textgen._parse_and_convert is _parse_and_convert
