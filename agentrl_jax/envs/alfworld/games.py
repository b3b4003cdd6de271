"""Rebuilds an ALFWorld game file (``game.tw-pddl``) from a task's problem, and caches it.

A game file is a JSON object ``{pddl_domain, grammar, pddl_problem, solvable, walkthrough}`` that
TextWorld's PDDL engine loads. It is built exactly as alfworld's own generator
(``alfworld-generate``, alfworld 0.4.2) builds it:

- ``pddl_domain``: ``alfworld/data/alfred.pddl`` as the installed package ships it;
- ``grammar``: ``alfworld/data/alfred.twl2`` with its ``UNKNOWN GOAL`` placeholder replaced by the
  task description (``alfworld.agents.utils.misc.add_task_to_grammar``: a templated description
  from the task type and ``pddl_params``, or with probability ``goal_desc_human_anns_prob`` one of
  the human annotations);
- ``pddl_problem``: the task's ``initial_state.pddl`` unchanged.

alfworld draws the template with the process-global ``random`` module, so two builds could phrase
the goal differently; here the draw is seeded by the task's split and id, so a task always gets the
same description. alfworld's generator also plays each game with its expert to mark it solvable;
the json_2.1.1 pack only holds tasks the release marks solvable, so that costly check is skipped
(``solvable`` is left None: not checked here).

Cache: ``<cache>/games/alfworld-<version>/<split>/<task-folder>/<trial>/game.tw-pddl`` plus a copy
of ``traj_data.json`` beside it (alfworld's handcoded expert reads the task parameters from the
game file's folder). Each file records a digest of everything it was built from; a stale, corrupt
or half-written file is rebuilt. Files are written to a temporary name and renamed, so concurrent
workers never read a partial file.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import os
import pathlib
import random
import tempfile
from typing import Any

from agentrl_jax.envs.alfworld import data as alfworld_data
from agentrl_jax.envs.base import stable_key

GAME_FILE = "game.tw-pddl"
# Bump when the way games are built here changes, so caches rebuild.
_BUILD_FORMAT = 1


def alfworld_version() -> str:
    """The installed alfworld package version (part of the cache key)."""
    return importlib.metadata.version("alfworld")


@functools.lru_cache(maxsize=1)
def shipped_logic() -> tuple[str, str]:
    """``(pddl_domain, grammar)`` text as the installed alfworld package ships them."""
    from alfworld.info import ALFRED_PDDL_PATH, ALFRED_TWL2_PATH

    with open(ALFRED_PDDL_PATH, encoding="utf-8") as f:
        domain = f.read()
    with open(ALFRED_TWL2_PATH, encoding="utf-8") as f:
        grammar = f.read()
    return domain, grammar


def translations_dir(cache_dir: str | os.PathLike | None) -> pathlib.Path:
    """Where the fast engine keeps the games' PDDL-to-SAS translations (``alfworld_speedups``)."""
    return alfworld_data.cache_root(cache_dir) / "translations"


def game_dir(cache_dir: str | os.PathLike | None, split: str, task_id: str) -> pathlib.Path:
    """Where the game of ``split/task_id`` is cached."""
    games = alfworld_data.cache_root(cache_dir) / "games" / f"alfworld-{alfworld_version()}"
    return games / split / task_id


def build_game(
    root: pathlib.Path,
    split: str,
    task_id: str,
    *,
    cache_dir: str | os.PathLike | None = None,
    goal_desc_human_anns_prob: float = 0.0,
) -> pathlib.Path:
    """Returns the path of the task's game file, building it unless a fresh copy is cached.

    Args:
      root: the data root (see ``alfworld_data.resolve_data_dir``).
      split: train, valid_seen or valid_unseen.
      task_id: ``"<task-folder>/<trial>"``.
      cache_dir: the cache root (default ``alfworld_data.default_cache_dir()``).
      goal_desc_human_anns_prob: probability of a human-written goal instead of the template
        (alfworld's default and the benchmark's setting: 0).

    Raises:
      TaskDataError: the task's files are missing or malformed (the message names the file).
    """
    src = alfworld_data.task_dir(root, split, task_id)
    traj_data = alfworld_data.read_traj_data(src / "traj_data.json")
    try:
        problem = (src / "initial_state.pddl").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise alfworld_data.TaskDataError(
            f"cannot read {str(src / 'initial_state.pddl')!r}: {e}"
        ) from e
    if "(:init" not in problem or "(:goal" not in problem:
        raise alfworld_data.TaskDataError(
            f"{str(src / 'initial_state.pddl')!r} is not a PDDL problem: it lacks (:init or (:goal"
        )
    domain, grammar = shipped_logic()
    digest = _digest(domain, grammar, problem, traj_data, goal_desc_human_anns_prob)

    out = game_dir(cache_dir, split, task_id)
    game_file = out / GAME_FILE
    if _cached_digest(game_file) == digest and (out / "traj_data.json").is_file():
        return game_file

    seed = stable_key("alfworld-goal", split, task_id, goal_desc_human_anns_prob)
    gamedata = {
        "pddl_domain": domain,
        "grammar": _grammar_with_goal(grammar, traj_data, goal_desc_human_anns_prob, seed),
        "pddl_problem": problem,
        "solvable": None,
        "walkthrough": None,
        "agentrl_digest": digest,
        "agentrl_task": f"{split}/{task_id}",
    }
    out.mkdir(parents=True, exist_ok=True)
    _write_atomic(out / "traj_data.json", json.dumps(traj_data))
    _write_atomic(game_file, json.dumps(gamedata))  # Last: its digest marks the pair complete.
    return game_file


def _grammar_with_goal(grammar: str, traj_data: dict, prob: float, seed: int) -> str:
    from alfworld.agents.utils.misc import add_task_to_grammar

    # get_templated_task_desc draws from the global `random`; seed it for this call only.
    with _global_random_seeded(seed):
        return add_task_to_grammar(
            grammar, traj_data, goal_desc_human_anns_prob=prob, rng=random.Random(seed)
        )


@contextlib.contextmanager
def _global_random_seeded(seed: int):
    saved = random.getstate()
    random.seed(seed)
    try:
        yield
    finally:
        random.setstate(saved)


def _digest(domain: str, grammar: str, problem: str, traj_data: dict, prob: float) -> str:
    h = hashlib.sha256()
    parts: list[Any] = [
        _BUILD_FORMAT,
        alfworld_version(),
        domain,
        grammar,
        problem,
        json.dumps(traj_data, sort_keys=True),
        repr(float(prob)),
    ]
    for part in parts:
        h.update(str(part).encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()


def _cached_digest(game_file: pathlib.Path) -> str | None:
    try:
        with open(game_file, encoding="utf-8") as f:
            return json.load(f).get("agentrl_digest")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return None  # Missing, corrupt or not an object: rebuild.


def _write_atomic(path: pathlib.Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
