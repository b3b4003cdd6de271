"""A workdir holds one run: its ``config.json`` is that run's config, and a rerun must match it.

Rerunning ``launch.train`` with an existing workdir resumes from its last checkpoint, so a config
that differs from the saved one in anything that changes what the run computes would continue a
run under settings it did not start with. :func:`check_and_record` compares the two resolved
configs (``RunConfig``, so a default spelled out or left out, a list or a tuple, compare equal):

- no ``config.json`` yet: it is written;
- no difference: nothing is written;
- differences only in :data:`FREE_FIELDS` (when checkpoints are written and kept, how often the
  held-out levels are evaluated between the fixed evaluations): allowed, recorded;
- any other difference: a :class:`ConfigError` naming each field with its saved and new value,
  unless the caller allows it on purpose (``launch.train --allow_config_change``), which records
  it.

Recorded means: ``config.json`` becomes the new config, and a line in ``config_changes.jsonl``
keeps the time, the changed fields with both values, and whether the change needed the flag.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from typing import Any

import ml_collections
from etils import epath

from agentrl_jax.run.config import ConfigError, RunConfig, from_config_dict

CONFIG_FILE = "config.json"
CHANGES_FILE = "config_changes.jsonl"
# Fields a rerun may change freely: none of them changes a parameter, a rollout or a logged
# training metric (the evaluations before and after RL, and every RNG, do not depend on them;
# the watchdog only decides when a stuck run gives up; the compilation cache only where compiled
# programs are kept).
FREE_FIELDS = (
    "compile_cache",
    "checkpoint.every",
    "checkpoint.keep_last",
    "checkpoint.keep_best",
    "eval_every",
    "watchdog_s",
    # Where the metrics also go (Weights & Biases): the same run, written to more places.
    "logging.wandb.enabled",
    "logging.wandb.project",
    "logging.wandb.entity",
    "logging.wandb.name",
    "logging.wandb.group",
    "logging.wandb.tags",
    "logging.wandb.mode",
    "logging.wandb.run_id",
)


def flat_fields(run: RunConfig) -> dict[str, Any]:
    """Every leaf of ``run`` by its dotted path (``rl.actor_lr``, ``env.kwargs.max_steps``)."""
    out: dict[str, Any] = {}

    def walk(obj, prefix: str) -> None:
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(value):
                walk(value, f"{prefix}{f.name}.")
            elif f.metadata.get("mapping"):
                for key, item in value:
                    out[f"{prefix}{f.name}.{key}"] = item
                if not value:
                    out[f"{prefix}{f.name}"] = {}
            else:
                out[f"{prefix}{f.name}"] = value

    walk(run, "")
    return out


def config_changes(saved: RunConfig, now: RunConfig) -> dict[str, tuple[Any, Any]]:
    """``{field: (saved value, new value)}`` of every field that differs (absent: ``None``)."""
    old, new = flat_fields(saved), flat_fields(now)
    return {
        key: (old.get(key), new.get(key))
        for key in sorted(set(old) | set(new))
        if old.get(key) != new.get(key) or (key in old) != (key in new)
    }


def _describe(changes: dict[str, tuple[Any, Any]]) -> str:
    return ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changes.items())


def load_saved(workdir: str) -> RunConfig | None:
    """The resolved config of ``workdir/config.json``, or None when there is none.

    Raises:
      ConfigError: the file cannot be read or no longer validates (names the path).
    """
    path = epath.Path(workdir, CONFIG_FILE)
    if not path.exists():
        return None
    try:
        return from_config_dict(ml_collections.ConfigDict(json.loads(path.read_text())))
    except (OSError, ValueError) as e:  # ConfigError and JSONDecodeError are ValueErrors.
        raise ConfigError(
            f"cannot compare with the run's saved config {path}: {type(e).__name__}: {e}; "
            "use a new --workdir, or pass --allow_config_change to replace it"
        ) from e


def check_and_record(
    workdir: str,
    config_dict: ml_collections.ConfigDict,
    run: RunConfig,
    *,
    allow_change: bool = False,
    write: bool = True,
) -> dict[str, tuple[Any, Any]]:
    """Checks ``run`` against the workdir's saved config and records it (see the module doc).

    Args:
      workdir: the run's directory (it exists).
      config_dict: the ConfigDict ``run`` was validated from (what ``config.json`` holds).
      run: the validated config of this (re)run.
      allow_change: accept differences in fields that change the run (they are recorded).
      write: write the files (False on every process but the first of a multi-host run; each
        process still checks).

    Returns:
      The changed fields, ``{field: (saved, new)}`` (empty for a fresh or identical config).

    Raises:
      ConfigError: a field outside :data:`FREE_FIELDS` differs and ``allow_change`` is False,
        or the saved config cannot be read (unless ``allow_change``); ``config.json`` is left as
        it was.
    """
    path = epath.Path(workdir, CONFIG_FILE)  # local, or a URL such as gs://
    existed = path.exists()
    try:
        saved = load_saved(workdir)
    except ConfigError:
        if not allow_change:
            raise
        saved = None
    changes = {} if saved is None else config_changes(saved, run)
    binding = {k: v for k, v in changes.items() if k not in FREE_FIELDS}
    if binding and not allow_change:
        raise ConfigError(
            f"{path} (the run being resumed) differs in fields that change the run: "
            f"{_describe(binding)}; rerun with the saved values, use a new --workdir, or pass "
            "--allow_config_change to change them on purpose"
        )
    if not write or (existed and saved is not None and not changes):
        return changes
    if existed:
        record = {
            "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "changes": {k: [a, b] for k, (a, b) in changes.items()},
            "allowed_by_flag": bool(binding) or saved is None,
            "saved_was_unreadable": saved is None,
        }
        log = epath.Path(workdir, CHANGES_FILE)
        previous = log.read_text() if log.exists() else ""  # object stores cannot append
        log.write_text(previous + json.dumps(record, default=repr) + "\n")
    tmp = epath.Path(f"{path}.tmp")
    tmp.write_text(config_dict.to_json_best_effort(indent=2) + "\n")  # launch.eval reads it
    tmp.replace(path)
    return changes
