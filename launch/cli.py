"""What the command lines share: flag parsing and workdir checks that end in one clear line.

Launch code, beside the entry points that use it (``launch/train.py``, ``eval.py``, ``plan.py``,
``study.py``).

A wrong ``--config.<section>.<key>=...`` override or an unusable ``--workdir`` is the user's
mistake, not the program's: the launchers print one line naming the key or path and what was
expected, and exit with status 2 (absl's usage-error code) instead of a traceback.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Sequence

from absl import flags

from agentrl_jax.run import paths
from agentrl_jax.run.config import missing_key

USAGE_ERROR = 2


def fail(message: str) -> None:
    """Prints ``message`` to stderr and exits with the usage-error status."""
    print(message, file=sys.stderr)
    sys.exit(USAGE_ERROR)


def parse_flags(argv: Sequence[str]) -> list[str]:
    """``app.run(main, flags_parser=parse_flags)``: absl's parsing, with a clear error for a
    ``--config.x.y`` override of a key the config does not have."""
    try:
        return flags.FLAGS(list(argv))
    except (flags.Error, AttributeError, KeyError) as e:
        config = _config_file(argv)
        for arg in argv[1:]:
            message = _bad_override(config, arg)
            if message:
                fail(message)
        fail(f"{os.path.basename(argv[0])}: {e}")
    raise AssertionError("unreachable")


def _config_file(argv: Sequence[str]):
    """The ConfigDict that ``--config=FILE[:ARG]`` names, loaded again (None if it cannot be):
    a failed override leaves the flag without a value."""
    arg = next((a for a in argv if a.startswith("--config=")), None)
    if arg is None:
        return None
    path, _, config_arg = arg[len("--config=") :].partition(":")
    try:
        spec = importlib.util.spec_from_file_location("_agentrl_config", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.get_config(config_arg) if config_arg else module.get_config()
    except Exception:  # noqa: BLE001 - the original parse error is reported instead
        return None


def _bad_override(config, arg: str) -> str | None:
    """The error for ``--config.a.b=v`` when ``config`` has no ``a.b``, else None."""
    if config is None or not arg.startswith("--config."):
        return None
    return missing_key(config, arg[len("--config.") :].split("=", 1)[0])


def run_config_dict(workdir: str, tool: str):
    """The saved config of a ``launch.train`` workdir (``WORKDIR/config.json``) as a ConfigDict,
    for the tools that read a run back (``eval``, ``export``); from then on library logs go to
    ``WORKDIR/logs/<tool>.log``. A workdir without one fails in one line naming the path."""
    import json  # noqa: PLC0415

    import ml_collections  # noqa: PLC0415

    from agentrl_jax.run import logs  # noqa: PLC0415

    config_path = os.path.join(workdir, "config.json")
    if not os.path.isfile(config_path):
        fail(f"{tool}: {config_path} not found; is {workdir!r} a launch.train workdir?")
    logs.to_workdir(workdir, tool)
    with open(config_path) as f:
        return ml_collections.ConfigDict(json.load(f))


def usable_workdir(path: str) -> str:
    """Creates ``path`` if needed and checks that files can be written there.

    A URL (``gs://...``) is returned as it is: orbax writes checkpoints there itself, and
    probing it would need the network here.

    Returns:
      The path. On failure: one line naming the path and the reason, exit status 2.
    """
    if paths.is_url(path):
        return path
    probe = os.path.join(path, f".write_test.{os.getpid()}")
    try:
        os.makedirs(path, exist_ok=True)
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        fail(
            f"workdir error: cannot use --workdir={path!r}: {e.strerror or e} "
            f"({type(e).__name__}); expected a directory this process can create and write"
        )
    return path
