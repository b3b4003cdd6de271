r"""Runs ``launch.train`` on several GPU nodes: one process per node under jax.distributed.

Over ssh (node 0 is the coordinator; each node gets its process id):

    python -m launch.multinode_gpu --hosts=gpu0,gpu1 --port=1234 --repo_dir=/shared/agentrl_jax \
        --dry_run -- --config=configs/textworld_qwen2_5_1_5b_ppo.py --workdir=/shared/runs/ppo

Inside a SLURM allocation (JAX reads the layout from SLURM's environment):

    salloc --nodes=2 --gpus-per-node=8
    python -m launch.multinode_gpu --slurm_nodes=2 --gpus_per_node=8 --repo_dir=$PWD -- \
        --config=configs/textworld_qwen2_5_1_5b_ppo.py --workdir=/shared/runs/ppo

Everything after ``--`` goes to ``launch.train``. The workdir must be on a filesystem every node
sees. ``--dry_run`` prints the per-node commands (or the srun line) and runs nothing. The nodes'
commands run together: when one fails, or this launcher is interrupted or killed (SIGTERM), the
others are stopped, and ssh's forced terminal (``-tt``) ends the remote trainers with them.
"""

import os
import sys

from absl import app, flags

from launch import launchers

_HOSTS = flags.DEFINE_list("hosts", None, "Nodes, comma-separated; the first coordinates.")
_PORT = flags.DEFINE_integer("port", 1234, "The coordinator's port on the first node.")
_SLURM_NODES = flags.DEFINE_integer("slurm_nodes", None, "Use srun over this many nodes.")
_GPUS_PER_NODE = flags.DEFINE_integer("gpus_per_node", None, "srun --gpus-per-node.")
_REPO_DIR = flags.DEFINE_string(
    "repo_dir", os.getcwd(), "The repository on the nodes (default: here)."
)
_PYTHON = flags.DEFINE_string("python", "python3", "The Python on the nodes.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print the commands; run nothing.")


def main(argv):
    train_args = argv[1:]
    if (_HOSTS.value is None) == (_SLURM_NODES.value is None):
        raise app.UsageError("give exactly one of --hosts=a,b,... (ssh) or --slurm_nodes=N")
    try:
        if _SLURM_NODES.value is not None:
            cmd = launchers.slurm_command(
                _SLURM_NODES.value,
                train_args,
                repo_dir=_REPO_DIR.value,
                python=_PYTHON.value,
                gpus_per_node=_GPUS_PER_NODE.value,
            )
            commands = [cmd]
        else:
            commands = launchers.gpu_node_commands(
                _HOSTS.value,
                train_args,
                port=_PORT.value,
                repo_dir=_REPO_DIR.value,
                python=_PYTHON.value,
            )
    except ValueError as e:
        raise app.UsageError(str(e)) from e
    if _DRY_RUN.value:
        if _SLURM_NODES.value is not None:
            print(f"# one task on each of {_SLURM_NODES.value} nodes (run inside the allocation):")
            print(launchers.format_argv(commands[0]))
            return
        for i, cmd in enumerate(commands):
            print(f"# node {i} ({cmd[-2]}), process {i} of {len(commands)}:")
            print(launchers.format_argv(cmd))
        return
    sys.exit(launchers.run_all(commands))


if __name__ == "__main__":
    app.run(main)
