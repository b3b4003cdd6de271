"""Deprecated names: the old home of the run's modules, split into folders by job (issue #33).

``agentrl_jax.training.X`` still imports, for one release, as the module at its new path
(``agentrl_jax.training.trainer is agentrl_jax.run.trainer``, so attributes and monkeypatches
are shared); the first import of each old name warns with a DeprecationWarning naming the new
one. Where each module went: ``MOVED`` below, and docs/architecture.md ("Layout history").

The aliases are made by an import hook (``agentrl_jax/_aliases.py``), not by a file per old name.
Nothing in the repository imports these names; they are for users' code only.
"""

from __future__ import annotations

import importlib

from agentrl_jax import _aliases


# Old module name -> its new module (agentrl_jax.training.X -> agentrl_jax.<package>.X, or the
# module it moved to after the split: chaos and stats went down to the parts, cli out to launch/;
# issue #33 follow-ups).
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
    **_into("agentrl_jax.experiments", ("evaluate", "plan", "study")),
    "chaos": "agentrl_jax.chaos",
    "stats": "agentrl_jax.stats",
    "cli": "launch.cli",
}


def new_name(old: str) -> str:
    """``"trainer"`` -> ``"agentrl_jax.run.trainer"``."""
    return MOVED[old]


_aliases.install(
    {f"{__name__}.{old}": new for old, new in MOVED.items()},
    'agentrl_jax.training was split by job; docs/architecture.md, "Layout history"',
    skip=(__file__,),
)


def __getattr__(name: str):
    """``agentrl_jax.training.trainer`` as an attribute imports it (with the warning)."""
    if name in MOVED:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(MOVED))
