"""SWE task records: the SWE-Gym / SWE-bench schema, loaded from and written to JSONL.

One JSON object per line::

    {"instance_id": "tinydb-4.8.0__mut3", "repo": "local/tinydb", "base_commit": "<sha>",
     "problem_statement": "...", "patch": "<gold diff>", "test_patch": "<diff adding tests>",
     "FAIL_TO_PASS": ["tests/test_x.py::test_a"], "PASS_TO_PASS": [...],
     "test_cmd": "python -m pytest -rA ...", "log_parser": "pytest", "source": "swe-smith-local",
     "repo_path": "repos/tinydb"}

SWE-bench stores FAIL_TO_PASS / PASS_TO_PASS as JSON-encoded strings, SWE-Gym as lists: both are
accepted. ``test_cmd``, ``log_parser``, ``source`` and ``repo_path`` are optional (real SWE-Gym
records have none; the Docker runtime derives the test command from ``test_patch``); a relative
``repo_path`` is resolved against the JSONL file's directory.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable
from typing import Any

from agentrl_jax.envs.base import Task, stable_key

REQUIRED = (
    "instance_id",
    "repo",
    "base_commit",
    "problem_statement",
    "patch",
    "test_patch",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
)


class TaskFormatError(ValueError):
    """A task record is malformed; the message names the file, line, field and value."""


@dataclasses.dataclass(frozen=True)
class SweTask:
    """One bug-fix task.

    Attributes:
      instance_id: unique id.
      repo: 'owner/name' for SWE-Gym, 'local/<package>' for tasks built here.
      base_commit: the commit the agent starts from (the bug present, failing tests hidden).
      problem_statement: the issue text shown to the agent.
      patch: the gold fix (never shown to the agent).
      test_patch: the diff that restores/adds the tests that check the fix.
      fail_to_pass: test ids that fail before the fix and must pass after.
      pass_to_pass: test ids that pass before and must still pass.
      test_cmd: shell command that runs the tests (None: the runtime derives it).
      log_parser: name of the log parser in ``grading.LOG_PARSERS``.
      source: where the task came from ('swe-gym', 'swe-bench', 'swe-smith-local').
      repo_path: local git repository holding ``base_commit`` (local runtime only).
      image: Docker image name (Docker runtime only; None: derived from instance_id).
    """

    instance_id: str
    repo: str
    base_commit: str
    problem_statement: str
    patch: str
    test_patch: str
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    test_cmd: str | None = None
    log_parser: str = "pytest"
    source: str = "swe-gym"
    repo_path: str | None = None
    image: str | None = None

    def to_record(self) -> dict[str, Any]:
        """The JSONL record (lists, not JSON strings; None fields omitted)."""
        rec = {
            "instance_id": self.instance_id,
            "repo": self.repo,
            "base_commit": self.base_commit,
            "problem_statement": self.problem_statement,
            "patch": self.patch,
            "test_patch": self.test_patch,
            "FAIL_TO_PASS": list(self.fail_to_pass),
            "PASS_TO_PASS": list(self.pass_to_pass),
            "test_cmd": self.test_cmd,
            "log_parser": self.log_parser,
            "source": self.source,
            "repo_path": self.repo_path,
            "image": self.image,
        }
        return {k: v for k, v in rec.items() if v is not None}


def _test_ids(value: Any, field: str, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise TaskFormatError(
                f"{where}: field {field!r} is a string but not JSON ({e}); expected a list of "
                f"test ids or its JSON encoding, got {value[:80]!r}"
            ) from None
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise TaskFormatError(
            f"{where}: field {field!r} must be a list of test-id strings, got {value!r:.80}"
        )
    return tuple(value)


def from_record(record: Any, where: str = "<record>", base_dir: str | None = None) -> SweTask:
    """Validates one record (a dict from JSON) and builds a SweTask.

    Raises:
      TaskFormatError: naming ``where``, the field and the bad value.
    """
    if not isinstance(record, dict):
        raise TaskFormatError(f"{where}: expected a JSON object, got {type(record).__name__}")
    missing = [f for f in REQUIRED if f not in record]
    if missing:
        raise TaskFormatError(f"{where}: missing field(s) {missing}; required are {list(REQUIRED)}")
    for f in ("instance_id", "repo", "base_commit", "problem_statement", "patch", "test_patch"):
        if not isinstance(record[f], str):
            raise TaskFormatError(
                f"{where}: field {f!r} must be a string, got {type(record[f]).__name__}"
            )
    if not record["instance_id"]:
        raise TaskFormatError(f"{where}: field 'instance_id' is empty")
    for f in ("test_cmd", "log_parser", "source", "repo_path", "image"):
        if record.get(f) is not None and not isinstance(record[f], str):
            raise TaskFormatError(
                f"{where}: field {f!r} must be a string, got {type(record[f]).__name__}"
            )
    repo_path = record.get("repo_path")
    if repo_path and base_dir and not os.path.isabs(repo_path):
        repo_path = os.path.normpath(os.path.join(base_dir, repo_path))
    from agentrl_jax.envs.swe import grading  # here: grading imports nothing of ours, no cycle

    log_parser = record.get("log_parser") or "pytest"
    if log_parser not in grading.LOG_PARSERS:
        raise TaskFormatError(
            f"{where}: field 'log_parser' is {log_parser!r}; known: {sorted(grading.LOG_PARSERS)}"
        )
    return SweTask(
        instance_id=record["instance_id"],
        repo=record["repo"],
        base_commit=record["base_commit"],
        problem_statement=record["problem_statement"],
        patch=record["patch"],
        test_patch=record["test_patch"],
        fail_to_pass=_test_ids(record["FAIL_TO_PASS"], "FAIL_TO_PASS", where),
        pass_to_pass=_test_ids(record["PASS_TO_PASS"], "PASS_TO_PASS", where),
        test_cmd=record.get("test_cmd"),
        log_parser=log_parser,
        source=record.get("source") or "swe-gym",
        repo_path=repo_path,
        image=record.get("image"),
    )


def load_jsonl(path: str) -> list[SweTask]:
    """Reads every task of a JSONL file (blank lines skipped).

    Raises:
      FileNotFoundError: no such file.
      TaskFormatError: a line is not JSON or not a valid record ('FILE:LINE: ...'), or two
        records share an instance_id.
    """
    tasks, seen = [], {}
    base_dir = os.path.dirname(os.path.abspath(path))
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise TaskFormatError(
                    f"{where}: not valid JSON ({e.msg} at column {e.colno})"
                ) from None
            task = from_record(record, where, base_dir)
            if task.instance_id in seen:
                raise TaskFormatError(
                    f"{where}: duplicate instance_id {task.instance_id!r} "
                    f"(first at line {seen[task.instance_id]})"
                )
            seen[task.instance_id] = lineno
            tasks.append(task)
    return tasks


def write_jsonl(path: str, tasks: Iterable[SweTask], base_dir: str | None = None) -> None:
    """Writes tasks atomically; ``repo_path`` is stored relative to ``base_dir`` when given."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for t in tasks:
            rec = t.to_record()
            if base_dir and t.repo_path:
                rec["repo_path"] = os.path.relpath(t.repo_path, base_dir)
            f.write(json.dumps(rec, sort_keys=True) + "\n")
    os.replace(tmp, path)


def swe_tasks(level: str, split: str, count: int, env_kwargs: dict[str, Any]) -> list[Task]:
    """The SWE family's task source (registered in envs/registry.py): a fixed fifth of the
    JSONL's instances (by a hash of the instance id) is ``eval``, the rest ``train``; ``level``
    is ``all`` or a repository name."""
    path = env_kwargs.get("path")
    if not path:
        raise ValueError(
            "config.env.kwargs.path is missing: the SWE env needs the tasks.jsonl written "
            "by `python -m launch.make_swe_tasks` (or a SWE-Gym JSONL)"
        )
    records = [t for t in load_jsonl(path) if level in ("all", t.repo)]
    chosen = [t for t in records if (stable_key(t.instance_id) % 5 == 0) == (split == "eval")]
    return [Task(env="swe", split=split, id=t.instance_id) for t in chosen[:count]]
