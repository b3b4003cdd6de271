"""Memoized pure functions inside TextWorld's PDDL engine: the same games, much faster.

Profiling real ALFWorld games (textworld 1.7.0, fast-downward-textworld 20.6.4) shows that most of
the engine's time goes to re-doing the same pure work:

- Steps: every step renders the command of each admissible action, and the feedback, through the
  grammar (``textworld.envs.pddl.textgen``), which re-parses the same few hundred template strings
  with a tatsu PEG parser: ``_parse_and_convert`` for symbols and ``Rule.parse_conjunctive_query``
  for rule conditions. About 60% of a step.
- Resets: ``PddlState`` translates the PDDL problem to SAS with ``fast_downward.pddl2sas`` twice
  (plain, and optimized for replanning) on every load and again on every reset, although the
  translation depends only on (domain, problem, options). Nearly all of a reset.

``install()`` memoizes these functions. Each is a pure function of its arguments (``pddl2sas``
sets every translator option it reads on each call and builds its task afresh; the engine only
reads the task it returns). Parsed grammar symbols and queries are handed out as deep copies
because the engine mutates them; the translated task is shared read-only. Caches are bounded (the
translations of the 16 most recent problems). The textgen patches are confined to that module's
own names; the translation patch replaces ``fast_downward.pddl2sas``, which only TextWorld's PDDL
state calls. ``install`` is idempotent and ``uninstall()`` restores the originals.
tests/test_alfworld.py checks that whole episodes (every feedback, command list and state key)
are identical with and without it.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import fast_downward
from textworld.envs.pddl import textgen
from textworld.logic import Rule

_ORIGINAL_PARSE = textgen._parse_and_convert
_ORIGINAL_RULE = textgen.Rule
_ORIGINAL_PDDL2SAS = fast_downward.pddl2sas


@functools.lru_cache(maxsize=8192)
def _parsed_symbols(text: str, kwargs: tuple[tuple[str, Any], ...]) -> Any:
    return _ORIGINAL_PARSE(text, **dict(kwargs))


@functools.lru_cache(maxsize=8192)
def _parsed_query(expr: str) -> Rule:
    return _ORIGINAL_RULE.parse_conjunctive_query(expr)


@functools.lru_cache(maxsize=16)
def _translated(domain: str, problem: str, verbose: bool, optimize: bool) -> tuple[Any, str]:
    return _ORIGINAL_PDDL2SAS(domain, problem, verbose=verbose, optimize=optimize)


def _parse_and_convert(*args: Any, **kwargs: Any) -> Any:
    if len(args) != 1 or not isinstance(args[0], str):
        return _ORIGINAL_PARSE(*args, **kwargs)
    return copy.deepcopy(_parsed_symbols(args[0], tuple(sorted(kwargs.items()))))


class _MemoRule(Rule):
    """``Rule`` whose conjunctive-query parser is memoized (seen only by ``textgen``)."""

    @classmethod
    def parse_conjunctive_query(cls, expr: str) -> Rule:
        return copy.deepcopy(_parsed_query(expr))


def _pddl2sas(domain: str, problem: str, verbose: bool = False, optimize: bool = False):
    return _translated(domain, problem, bool(verbose), bool(optimize))


def install() -> None:
    """Memoizes the engine's grammar parsers and PDDL translation (idempotent)."""
    textgen._parse_and_convert = _parse_and_convert
    textgen.Rule = _MemoRule
    fast_downward.pddl2sas = _pddl2sas


def uninstall() -> None:
    """Restores TextWorld's and fast-downward's own functions (the caches are kept)."""
    textgen._parse_and_convert = _ORIGINAL_PARSE
    textgen.Rule = _ORIGINAL_RULE
    fast_downward.pddl2sas = _ORIGINAL_PDDL2SAS


def clear_translation_cache() -> None:
    """Forgets the memoized PDDL translations (benchmarks use it to time cold loads)."""
    _translated.cache_clear()


def installed() -> bool:
    return textgen._parse_and_convert is _parse_and_convert
