"""Where the ALFWorld task problems live, and how to list them.

The standard layout (what the official ``alfworld-download`` writes under ``$ALFWORLD_DATA``)::

    <root>/json_2.1.1/{train,valid_seen,valid_unseen}/<task-folder>/<trial>/initial_state.pddl
    <root>/json_2.1.1/{train,valid_seen,valid_unseen}/<task-folder>/<trial>/traj_data.json

A task is named by its split and its id ``"<task-folder>/<trial>"``, e.g.
``("valid_unseen", "pick_and_place_simple-Mug-None-Desk-308/trial_T20190908_125200_737896")``.
The folder name starts with the task type.

``resolve_data_dir`` accepts the root, the ``json_2.1.1`` folder itself, the project's
``alfworld_problems.tar.xz`` pack, or a folder holding that pack; a pack is unpacked once into a
cache folder. This module does not import ``alfworld``: importing that package sets
``ALFWORLD_DATA`` to its own default (~/.cache/alfworld) when the variable is unset.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import tarfile
import tempfile
from typing import Any

from agentrl_jax.envs.base import Task

JSON_DIR = "json_2.1.1"
TARBALL_NAME = "alfworld_problems.tar.xz"
SPLITS = ("train", "valid_seen", "valid_unseen")
# valid_seen holds rooms seen in training (in-distribution); valid_unseen holds new rooms
# (out-of-distribution, the number ALFWorld papers report).
EVAL_SPLITS = {"in_distribution": "valid_seen", "out_of_distribution": "valid_unseen"}
TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
PDDL_PARAMS = ("object_target", "parent_target", "toggle_target", "mrecep_target", "object_sliced")

HOW_TO_GET_DATA = (
    "Get the ALFWorld data with the official downloader (`alfworld-download`, which fills "
    "$ALFWORLD_DATA/json_2.1.1), or point data_dir / the ALFWORLD_DATA environment variable at "
    f"a folder holding {JSON_DIR}/{{train,valid_seen,valid_unseen}}, or at the {TARBALL_NAME} pack "
    "(../shared/data/alfworld in this project's workspace)."
)


class MissingDataError(FileNotFoundError):
    """The ALFWorld data directory is missing or does not have the standard layout."""


class TaskDataError(ValueError):
    """A task's files are missing, unreadable or lack a required field."""


def default_cache_dir() -> pathlib.Path:
    """``$AGENTRL_CACHE/alfworld``, else ``~/.cache/agentrl_jax/alfworld``."""
    base = os.environ.get("AGENTRL_CACHE") or os.path.join("~", ".cache", "agentrl_jax")
    return pathlib.Path(base).expanduser() / "alfworld"


def cache_root(cache_dir: str | os.PathLike | None = None) -> pathlib.Path:
    """The cache folder an env was given (``cache_dir``), else ``default_cache_dir()``."""
    return pathlib.Path(cache_dir) if cache_dir is not None else default_cache_dir()


def resolve_data_dir(
    data_dir: str | os.PathLike | None = None, cache_dir: str | os.PathLike | None = None
) -> pathlib.Path:
    """Finds the folder that holds ``json_2.1.1``, unpacking the pack if given one.

    Args:
      data_dir: the root, the ``json_2.1.1`` folder, a ``.tar.xz``/``.tar.gz`` pack, or a folder
        holding ``alfworld_problems.tar.xz``. None reads ``$ALFWORLD_DATA``.
      cache_dir: where a pack is unpacked (default ``default_cache_dir()``).

    Returns:
      The root folder: ``root / "json_2.1.1" / split`` holds the tasks.

    Raises:
      MissingDataError: nothing usable there; the message says how to get the data.
    """
    source = "data_dir"
    if data_dir is None:
        data_dir = os.environ.get("ALFWORLD_DATA")
        source = "$ALFWORLD_DATA"
        if not data_dir:
            raise MissingDataError(
                f"No ALFWorld data: data_dir is None and {source} is unset. " + HOW_TO_GET_DATA
            )
    path = pathlib.Path(os.path.expandvars(os.fspath(data_dir))).expanduser()
    if path.is_file() and _is_tarball(path):
        return extract_tarball(path, cache_dir)
    if (path / JSON_DIR).is_dir():
        return path
    if path.name == JSON_DIR and path.is_dir():
        return path.parent
    if (path / TARBALL_NAME).is_file():
        return extract_tarball(path / TARBALL_NAME, cache_dir)
    what = (
        "does not exist" if not path.exists() else f"has no {JSON_DIR}/ folder nor {TARBALL_NAME}"
    )
    raise MissingDataError(f"ALFWorld data {source}={str(path)!r} {what}. " + HOW_TO_GET_DATA)


def extract_tarball(
    tarball: str | os.PathLike, cache_dir: str | os.PathLike | None = None
) -> pathlib.Path:
    """Unpacks an ALFWorld problems pack once into the cache; later calls reuse it.

    The folder is named by the pack's content hash, so a changed pack unpacks anew. Unpacking goes
    to a temporary folder that is renamed into place, so concurrent workers never see half a tree.

    Returns:
      The root folder holding ``json_2.1.1``.

    Raises:
      MissingDataError: the pack is unreadable or has no ``json_2.1.1`` folder.
    """
    tarball = pathlib.Path(tarball)
    name = f"{tarball.name.split('.')[0]}-{_file_digest(tarball)[:16]}"
    target = cache_root(cache_dir) / "data" / name
    if (target / JSON_DIR).is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=".unpack-", dir=target.parent))
    try:
        with tarfile.open(tarball) as tar:
            tar.extractall(tmp, filter="data")  # 'data' refuses absolute paths and links out.
    except (tarfile.TarError, OSError, EOFError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise MissingDataError(
            f"cannot unpack ALFWorld pack {str(tarball)!r}: {e}. " + HOW_TO_GET_DATA
        ) from e
    if not (tmp / JSON_DIR).is_dir():
        shutil.rmtree(tmp, ignore_errors=True)
        raise MissingDataError(
            f"ALFWorld pack {str(tarball)!r} has no {JSON_DIR}/ folder at its "
            "top level. " + HOW_TO_GET_DATA
        )
    try:
        os.rename(tmp, target)
    except OSError:  # Another process won the race: its tree is complete, use it.
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def split_dir(root: pathlib.Path, split: str) -> pathlib.Path:
    """``root/json_2.1.1/split`` (ValueError on an unknown split, MissingDataError if absent)."""
    if split not in SPLITS:
        raise ValueError(f"unknown ALFWorld split {split!r}; expected one of {SPLITS}")
    path = root / JSON_DIR / split
    if not path.is_dir():
        raise MissingDataError(
            f"ALFWorld split folder {str(path)!r} is missing. " + HOW_TO_GET_DATA
        )
    return path


def list_task_ids(
    root: pathlib.Path, split: str, task_types: tuple[str, ...] | list[str] | None = None
) -> list[str]:
    """The ids ``"<task-folder>/<trial>"`` of a split, sorted, optionally of some task types.

    Only trials with both ``initial_state.pddl`` and ``traj_data.json`` count.
    """
    if task_types is not None:
        unknown = sorted(set(task_types) - set(TASK_TYPES))
        if unknown:
            raise ValueError(
                f"unknown ALFWorld task types {unknown}; expected some of {TASK_TYPES}"
            )
    base = split_dir(root, split)
    ids = []
    for pddl in base.glob("*/*/initial_state.pddl"):
        trial = pddl.parent
        if not (trial / "traj_data.json").is_file():
            continue
        task_id = f"{trial.parent.name}/{trial.name}"
        if task_types is None or task_type_of(task_id) in task_types:
            ids.append(task_id)
    return sorted(ids)


def task_type_of(task_id: str) -> str:
    """The task type encoded at the start of the task folder name (ValueError if none)."""
    prefix = task_id.split("/", 1)[0].split("-", 1)[0]
    if prefix not in TASK_TYPES:
        raise ValueError(
            f"task id {task_id!r} does not start with a task type; expected one of {TASK_TYPES}"
        )
    return prefix


# The ALFWorld family's task source and hook, registered in envs/registry.py.


def alfworld_tasks(level: str, split: str, count: int, env_kwargs: dict[str, Any]) -> list[Task]:
    """ALFWorld: ``count`` games of task type ``level`` (``all``: every type), in ``spread_order``
    over the split's sorted ids, so that any first ``k`` of them (``count`` here, or the first
    tasks a run takes for its demonstrations) keep the types' shares and the rooms' spread: the
    sorted list runs type by type, and its first games would all be ``look_at_obj_in_light``."""
    root = resolve_data_dir(env_kwargs.get("data_dir"))
    types = None if level == "all" else (level,)
    ids = list_task_ids(root, split, types)
    picked = [ids[i] for i in spread_order(len(ids))[:count]]
    return [Task(env="alfworld", split=split, id=i) for i in picked]


def spread_order(n: int) -> list[int]:
    """``range(n)`` in bit-reversed (van der Corput) order: every prefix of it is spread evenly
    over ``0..n-1`` (0, n/2, n/4, 3n/4, ... for a power of two)."""
    bits = max(n - 1, 0).bit_length()
    order = (int(format(i, f"0{bits}b")[::-1], 2) if bits else 0 for i in range(1 << bits))
    return [i for i in order if i < n]


def alfworld_task_type(task: Task) -> str:
    """The ALFWorld task type encoded in the task id."""
    return task_type_of(task.id)


def task_dir(root: pathlib.Path, split: str, task_id: str) -> pathlib.Path:
    """The trial folder of a task, checked to exist and to stay inside the split folder."""
    base = split_dir(root, split)
    parts = task_id.split("/")
    if len(parts) != 2 or any(p in ("", ".", "..") for p in parts):
        raise TaskDataError(f"ALFWorld task id {task_id!r} must look like '<task-folder>/<trial>'")
    path = base / parts[0] / parts[1]
    for name in ("initial_state.pddl", "traj_data.json"):
        if not (path / name).is_file():
            raise TaskDataError(f"ALFWorld task {split}/{task_id}: {str(path / name)!r} is missing")
    return path


def read_traj_data(path: pathlib.Path) -> dict[str, Any]:
    """Reads and checks ``traj_data.json``: task_type, pddl_params and the goal annotations."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TaskDataError(f"cannot read {str(path)!r} as JSON: {e}") from e
    if not isinstance(data, dict):
        raise TaskDataError(f"{str(path)!r}: expected a JSON object, got {type(data).__name__}")
    if data.get("task_type") not in TASK_TYPES:
        raise TaskDataError(
            f"{str(path)!r}: field task_type={data.get('task_type')!r} is not one of {TASK_TYPES}"
        )
    params = data.get("pddl_params")
    if not isinstance(params, dict) or any(k not in params for k in PDDL_PARAMS):
        raise TaskDataError(
            f"{str(path)!r}: field pddl_params={params!r} must be an object with keys {PDDL_PARAMS}"
        )
    return data


def _is_tarball(path: pathlib.Path) -> bool:
    return path.name.endswith((".tar", ".tar.xz", ".tar.gz", ".tgz", ".tar.bz2"))


def _file_digest(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
