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
state calls. ``install`` is idempotent and ``uninstall()`` restores the originals. The caches are
the process's, shared by its envs; the memoized functions call TextWorld's parsers and the
translator, which are not reentrant, so they run only under ``alfworld_engine.ENGINE_LOCK`` (every
engine call and ``install`` do).

The first load of a game still translates its problem twice (1-4 s on a CPU core: nearly all of
a new game's reset). ``install(translations=folder)`` also keeps every translation on disk
(pickled, zlib-compressed, ~50 KB; keyed by a digest of the translator's version and all its
arguments; written to a temporary file renamed into place, so processes racing on one game never
read half a file; one that does not load is translated again and rewritten). Every later load of
that game, in any process or run, reads it back in milliseconds.
tests/test_alfworld.py checks that whole episodes (every feedback, command list and state key)
are identical with and without it.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib.metadata
import os
import pathlib
import pickle
import tempfile
import zlib
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


_TRANSLATOR = f"fast-downward-textworld {importlib.metadata.version('fast-downward-textworld')}"
_translations: pathlib.Path | None = None  # install(translations=...): the on-disk cache


@functools.lru_cache(maxsize=16)
def _translated(domain: str, problem: str, verbose: bool, optimize: bool) -> tuple[Any, str]:
    folder = _translations
    if folder is None:
        return _ORIGINAL_PDDL2SAS(domain, problem, verbose=verbose, optimize=optimize)
    key = hashlib.sha256(repr((_TRANSLATOR, domain, problem, verbose, optimize)).encode())
    path = folder / f"{key.hexdigest()}.pkl.z"
    try:
        return pickle.loads(zlib.decompress(path.read_bytes()))
    except Exception:  # noqa: BLE001 - none yet, or corrupt: translated (again) below
        pass
    result = _ORIGINAL_PDDL2SAS(domain, problem, verbose=verbose, optimize=optimize)
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(zlib.compress(pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL), 1))
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
    return result


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


def install(translations: str | os.PathLike | None = None) -> None:
    """Memoizes the engine's grammar parsers and PDDL translation (idempotent); with
    ``translations``, a folder, also keeps the translations there for every later process."""
    global _translations
    if translations is not None:
        _translations = pathlib.Path(translations)
    textgen._parse_and_convert = _parse_and_convert
    textgen.Rule = _MemoRule
    fast_downward.pddl2sas = _pddl2sas


def uninstall() -> None:
    """Restores TextWorld's and fast-downward's own functions (the caches are kept; the on-disk
    one is no longer read or written)."""
    global _translations
    _translations = None
    textgen._parse_and_convert = _ORIGINAL_PARSE
    textgen.Rule = _ORIGINAL_RULE
    fast_downward.pddl2sas = _ORIGINAL_PDDL2SAS


def clear_translation_cache() -> None:
    """Forgets the memoized PDDL translations (benchmarks use it to time cold loads)."""
    _translated.cache_clear()


def installed() -> bool:
    return textgen._parse_and_convert is _parse_and_convert
