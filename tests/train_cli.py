"""``python -m launch.train`` in a subprocess, as the tests run it (the README's command).

Output goes to a file, never a pipe: a run that is polled rather than read must never block on a
full pipe buffer.
"""

from __future__ import annotations

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny_config(arg: str | None = None, **sections):
    """``configs/tiny_textworld.py`` (with ``arg``) with ``section=dict(key=value)`` overrides, or
    ``key=value`` for a top-level key."""
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    from configs import tiny_textworld

    cfg = tiny_textworld.get_config(arg)
    for section, values in sections.items():
        if isinstance(values, dict):
            for k, v in values.items():
                cfg[section][k] = v
        else:
            cfg[section] = values
    return cfg


def train_cmd(workdir, *extra, config: str = "configs/tiny_textworld.py:test") -> list[str]:
    return [
        sys.executable,
        "-m",
        "launch.train",
        f"--config={config}",
        f"--workdir={workdir}",
        *extra,
    ]


def start(cmd, cache, log_path, *, devices: int | None = None, **env) -> subprocess.Popen:
    """Starts ``cmd`` on the CPU with the games cache ``cache``; ``devices`` fake CPU devices."""
    env = dict(
        os.environ,
        AGENTRL_CACHE=str(cache),
        JAX_PLATFORMS="cpu",
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}" if devices else "",
        **env,
    )
    log = open(log_path, "w+b")  # noqa: SIM115 (closed by finish, or by the caller)
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    proc.log = log
    return proc


def wait_all(*procs: subprocess.Popen, timeout: float = 600) -> list[tuple[int, str]]:
    """Waits for every process (killing those past ``timeout``).

    Returns each process's (exit status, output), in order.
    """
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    out = []
    for proc in procs:
        proc.log.seek(0)
        out.append((proc.returncode, proc.log.read().decode(errors="replace")))
        proc.log.close()
    return out


def finish(*procs: subprocess.Popen, timeout: float = 600) -> list[str]:
    """Waits for every process (killing those past ``timeout``); asserts each exited with 0.

    Returns each process's output, in order.
    """
    results = wait_all(*procs, timeout=timeout)
    for code, text in results:
        assert code == 0, text[-4000:]
    return [text for _, text in results]
