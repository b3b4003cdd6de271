"""Deprecated names: the old home of the run's modules, split into folders by job (issue #33).

``agentrl_jax.training.X`` still imports, for one release, as the module at its new path
(``agentrl_jax.training.trainer is agentrl_jax.run.trainer``, so attributes and monkeypatches
are shared); the first import of each old name warns with a DeprecationWarning naming the new
one. Where each module went: ``MOVED`` below, and docs/architecture.md ("Layout history").

The aliases are made by an import hook here, not by a file per old name: a file left at a moved
file's path would stop git from following the move when merging edits made to the old path.
Nothing in the repository imports these names; they are for users' code only.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings


# Old module name -> its new module (agentrl_jax.training.X -> agentrl_jax.<package>.X, or the
# module it moved to after the split: chaos went down to the parts, issue #33 follow-ups).
def _into(package: str, names: tuple[str, ...]) -> dict[str, str]:
    return {name: f"{package}.{name}" for name in names}


MOVED = {
    **_into(
        "agentrl_jax.rl",
        ("envrl_data", "learner", "lm_head", "rl_batch", "rl_update", "rng_streams", "sft_data"),
    ),
    **_into(
        "agentrl_jax.rollout",
        ("chat", "chat_checkpoint", "curriculum", "rollout", "tasks", "trajectory"),
    ),
    **_into(
        "agentrl_jax.run",
        (
            "budget",
            "checkpoint",
            "cli",
            "config",
            "defaults",
            "logs",
            "multihost",
            "paths",
            "tensorboard",
            "trainer",
            "watchdog",
            "workdir_config",
        ),
    ),
    **_into("agentrl_jax.experiments", ("evaluate", "plan", "stats", "study")),
    "chaos": "agentrl_jax.chaos",
}


def new_name(old: str) -> str:
    """``"trainer"`` -> ``"agentrl_jax.run.trainer"``."""
    return MOVED[old]


def _importer() -> types.FrameType | None:
    """The frame of the code that imported an old name (past this file and importlib's)."""
    frame = sys._getframe(1)
    while frame is not None and (
        frame.f_code.co_filename == __file__ or "importlib" in frame.f_code.co_filename
    ):
        frame = frame.f_back
    return frame


class _Aliases(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``agentrl_jax.training.X`` as ``agentrl_jax.<package>.X``, warning once."""

    def find_spec(self, fullname, path=None, target=None):
        parent, _, old = fullname.rpartition(".")
        if parent != __name__ or old not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        old = module.__name__.rpartition(".")[2]
        message = (
            f"{module.__name__} is deprecated and will be removed in the next release: import "
            f"{new_name(old)} (agentrl_jax.training was split by job; docs/architecture.md, "
            f'"Layout history")'
        )
        frame = _importer()
        if frame is None:
            warnings.warn(message, DeprecationWarning, stacklevel=2)
        else:
            warnings.warn_explicit(
                message,
                DeprecationWarning,
                frame.f_code.co_filename,
                frame.f_lineno,
                module=frame.f_globals.get("__name__", "<unknown>"),
                registry=frame.f_globals.setdefault("__warningregistry__", {}),
            )
        # The import system returns what sys.modules holds once this returns: the new module.
        sys.modules[module.__name__] = importlib.import_module(new_name(old))


if not any(isinstance(finder, _Aliases) for finder in sys.meta_path):
    sys.meta_path.append(_Aliases())


def __getattr__(name: str):
    """``agentrl_jax.training.trainer`` as an attribute imports it (with the warning)."""
    if name in MOVED:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(MOVED))
