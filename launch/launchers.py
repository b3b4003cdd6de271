"""Command lines that start ``launch.train`` on every host of a multi-host run.

One process per host runs the same program (``launch.train``); what differs between platforms is
how the processes find each other:

- TPU pod slice: ``gcloud compute tpus tpu-vm ssh NAME --worker=all --command=...`` runs one
  command on every worker; ``jax.distributed.initialize()`` detects the slice by itself
  (``AGENTRL_DISTRIBUTED=1``).
- Multi-node GPU over ssh: one command per node, each with the coordinator's address (node 0),
  the number of processes and its own process id.
- SLURM: one ``srun`` task per node; JAX reads the job's layout from the SLURM environment
  (``AGENTRL_DISTRIBUTED=1``).

The functions here build argument lists (no JAX, nothing runs), so they are cheap to test;
``launch/tpu_pod.py`` and ``launch/multinode_gpu.py`` print them (``--dry_run``) or run them
(``run_all``: together, and stopped together).

Remote processes end with their launcher: ssh runs with a forced pseudo-terminal (``-tt``), so
when the local ssh client ends (Ctrl-C, ``kill``, a failed node), the remote side's terminal
hangs up and its shell and ``launch.train`` get SIGHUP, instead of running on and holding the
node's accelerators and the coordinator's port.
"""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

# Flags the launchers set themselves on each process; a user passing them would conflict.
_DISTRIBUTED_FLAGS = ("--coordinator_address", "--num_processes", "--process_id")


def check_train_args(train_args: Sequence[str]) -> list[str]:
    """The ``launch.train`` flags to pass to every process, checked.

    Raises:
      ValueError: when ``--config`` or ``--workdir`` is missing, or a flag the launcher sets
        per process (coordinator address, process count or id) is given.
    """
    args = list(train_args)
    names = [a.split("=", 1)[0] for a in args]
    for required in ("--config", "--workdir"):
        if required not in names:
            raise ValueError(
                f"the launch.train flags {args} lack {required}=...; pass them after '--', e.g. "
                "-- --config=configs/tiny_textworld.py --workdir=/shared/runs/x"
            )
    for name in names:
        if name in _DISTRIBUTED_FLAGS:
            raise ValueError(
                f"{name} is set by the launcher for each process; remove it from the "
                f"launch.train flags {args}"
            )
    return args


def train_command(
    train_args: Sequence[str],
    *,
    repo_dir: str,
    python: str = "python3",
    env: dict[str, str] | None = None,
    extra: Sequence[str] = (),
) -> str:
    """One shell command: ``cd REPO && [ENV=...] PYTHON -m launch.train ARGS EXTRA``."""
    if not repo_dir:
        raise ValueError("repo_dir is empty; expected the repository's path on the hosts")
    assigns = [f"{k}={shlex.quote(v)}" for k, v in sorted((env or {}).items())]
    train = shlex.join([python, "-m", "launch.train", *check_train_args(train_args), *extra])
    return " ".join([f"cd {_quote_path(repo_dir)} &&", *assigns, train])


def _quote_path(path: str) -> str:
    """Shell-quotes a path but leaves a leading ``~/`` for the remote shell to expand."""
    if path == "~":
        return path
    if path.startswith("~/"):
        return "~/" + shlex.quote(path[2:])
    return shlex.quote(path)


def tpu_pod_command(
    tpu: str,
    train_args: Sequence[str],
    *,
    zone: str,
    project: str | None = None,
    repo_dir: str = "~/agentrl_jax",
    python: str = "python3",
) -> list[str]:
    """The gcloud argv that runs the same ``launch.train`` on every worker of a TPU pod slice.

    ``jax.distributed.initialize()`` finds the slice's coordinator, process count and id from the
    TPU metadata (``AGENTRL_DISTRIBUTED=1``), so every worker runs the identical command.
    """
    if not tpu:
        raise ValueError("tpu is empty; expected the TPU VM's name (gcloud compute tpus list)")
    if not zone:
        raise ValueError(f"zone is empty; expected the zone of TPU {tpu!r}, e.g. us-central2-b")
    command = train_command(
        train_args, repo_dir=repo_dir, python=python, env={"AGENTRL_DISTRIBUTED": "1"}
    )
    argv = ["gcloud", "compute", "tpus", "tpu-vm", "ssh", tpu, f"--zone={zone}"]
    if project:
        argv.append(f"--project={project}")
    # -tt: ending gcloud's ssh clients hangs up the workers' terminals (see the module doc).
    return [*argv, "--worker=all", "--ssh-flag=-tt", f"--command={command}"]


def gpu_node_commands(
    hosts: Sequence[str],
    train_args: Sequence[str],
    *,
    port: int = 1234,
    repo_dir: str,
    python: str = "python3",
    ssh: str = "ssh",
) -> list[list[str]]:
    """One ssh argv per node: node i runs process i of ``len(hosts)``; node 0 coordinates."""
    hosts = [h.strip() for h in hosts]
    if not hosts or any(not h for h in hosts):
        raise ValueError(f"hosts={list(hosts)}: expected one or more non-empty host names")
    if len(set(hosts)) != len(hosts):
        raise ValueError(f"hosts={list(hosts)} lists a host twice; one process per host")
    if not 0 < port < 65536:
        raise ValueError(f"port={port}: expected a TCP port in 1..65535")
    coordinator = f"{hosts[0]}:{port}"
    out = []
    for i, host in enumerate(hosts):
        extra = [
            f"--coordinator_address={coordinator}",
            f"--num_processes={len(hosts)}",
            f"--process_id={i}",
        ]
        command = train_command(train_args, repo_dir=repo_dir, python=python, extra=extra)
        # -tt: killing this ssh client hangs up the remote terminal (see the module doc).
        out.append([ssh, "-tt", host, command])
    return out


def slurm_command(
    num_nodes: int,
    train_args: Sequence[str],
    *,
    repo_dir: str,
    python: str = "python3",
    gpus_per_node: int | None = None,
    srun_args: Sequence[str] = (),
) -> list[str]:
    """The srun argv (inside an allocation of ``num_nodes`` nodes): one task per node.

    JAX reads the coordinator, process count and id from SLURM's environment variables.
    """
    if num_nodes < 1:
        raise ValueError(f"num_nodes={num_nodes}: expected >= 1")
    argv = ["srun", f"--nodes={num_nodes}", f"--ntasks={num_nodes}", "--ntasks-per-node=1"]
    if gpus_per_node is not None:
        if gpus_per_node < 1:
            raise ValueError(f"gpus_per_node={gpus_per_node}: expected >= 1")
        argv.append(f"--gpus-per-node={gpus_per_node}")
    command = train_command(
        train_args, repo_dir=repo_dir, python=python, env={"AGENTRL_DISTRIBUTED": "1"}
    )
    return [*argv, *srun_args, "bash", "-c", command]


def run_all(
    commands: Sequence[Sequence[str]], *, poll_s: float = 1.0, grace_s: float = 10.0
) -> int:
    """Runs every command at once until all succeed or one fails; returns the exit status.

    When one fails, the others are stopped (they would wait for it forever in a collective); when
    this process is interrupted (Ctrl-C, SIGTERM), all of them are. Stopping is SIGTERM, then
    SIGKILL after ``grace_s``: an ssh client that ends hangs up its remote process (``-tt``).

    Returns:
      0, or the first failure's exit status (130 on Ctrl-C, 143 on SIGTERM).
    """
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    procs = []
    try:
        procs = [subprocess.Popen(list(c)) for c in commands]
        while True:
            failed = [c for c in (p.poll() for p in procs) if c not in (None, 0)]
            if failed:
                return failed[0]
            if all(p.returncode == 0 for p in procs):
                return 0
            time.sleep(poll_s)
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
    finally:
        _stop(procs, grace_s)
        signal.signal(signal.SIGTERM, previous)


def _stop(procs: Sequence[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM to the processes still running, SIGKILL to those left after ``grace_s``."""
    running = [p for p in procs if p.poll() is None]
    for p in running:
        p.terminate()
    deadline = time.monotonic() + grace_s
    for p in running:
        try:
            p.wait(timeout=max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def format_argv(argv: Sequence[str]) -> str:
    """A copy-pasteable shell line for an argv."""
    return shlex.join(argv)


__all__ = [
    "check_train_args",
    "format_argv",
    "gpu_node_commands",
    "run_all",
    "slurm_command",
    "tpu_pod_command",
    "train_command",
]
