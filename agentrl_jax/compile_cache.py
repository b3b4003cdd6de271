"""JAX's persistent compilation cache: a program compiled by one process is loaded by the next.

A resumed run, a study's next cell or a second evaluation would otherwise compile every program
again: tens of seconds each on a GPU, seconds on a CPU. The launchers (``launch.train``,
``launch.eval``, ``launch.bench``) call ``enable(config.compile_cache)`` before anything
compiles; from Python, call ``enable()`` first thing (JAX decides at the first compilation of a
process whether it uses a cache, and never again).

Where: ``config.compile_cache`` when set, else ``$AGENTRL_CACHE/jax`` (default
``~/.cache/agentrl_jax/jax``); ``"off"`` disables it. Every program is cached, however quickly
it compiled (JAX's default skips those under a second, which on a CPU are most of a run's), and
the folder is an LRU cache bounded at ``MAX_BYTES``. Entries are keyed by the program, the
compile options, the devices and the jax/jaxlib versions, so a changed program or a new JAX
compiles afresh and is never given a stale executable.
"""

from __future__ import annotations

import os

import jax

from agentrl_jax.envs.textworld.games import cache_dir

OFF = "off"
MAX_BYTES = 4 * 2**30  # the folder's bound; least recently used entries go first


def default_dir() -> str:
    """``$AGENTRL_CACHE/jax``, default ``~/.cache/agentrl_jax/jax``."""
    return str(cache_dir() / "jax")


def enable(path: str = "") -> str | None:
    """Turns the persistent compilation cache on in ``path`` (``""``: ``default_dir()``).

    Returns the folder, or None when ``path`` is ``"off"``. Call it before the process compiles
    anything: JAX fixes whether it uses a cache at its first compilation.
    """
    if path == OFF:
        return None
    folder = os.path.abspath(os.path.expanduser(path or default_dir()))
    os.makedirs(folder, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", folder)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
    return folder
