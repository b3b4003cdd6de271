r"""Runs ``launch.train`` on every worker of a TPU pod slice: the same command on each host.

    python -m launch.tpu_pod --tpu=my-v4-32 --zone=us-central2-b --dry_run -- \
        --config=configs/textworld_qwen2_5_1_5b_ppo.py --workdir=/mnt/shared/runs/ppo

Everything after ``--`` goes to ``launch.train``. The command runs through
``gcloud compute tpus tpu-vm ssh NAME --worker=all``; each worker's ``jax.distributed`` finds the
slice by itself (``AGENTRL_DISTRIBUTED=1``). The repository (``--repo_dir``) and its Python
environment must already be on every worker, and the workdir on a filesystem all workers share.
``--dry_run`` prints the gcloud line and the command each worker runs, and runs nothing.
"""

import subprocess
import sys

from absl import app, flags

from launch import launchers

_TPU = flags.DEFINE_string("tpu", None, "The TPU VM (pod slice) name.")
_ZONE = flags.DEFINE_string("zone", None, "Its zone, e.g. us-central2-b.")
_PROJECT = flags.DEFINE_string("project", None, "The GCP project (default: gcloud's).")
_REPO_DIR = flags.DEFINE_string("repo_dir", "~/agentrl_jax", "The repository on the workers.")
_PYTHON = flags.DEFINE_string("python", "python3", "The Python on the workers.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print the commands; run nothing.")


def main(argv):
    try:
        cmd = launchers.tpu_pod_command(
            _TPU.value or "",
            argv[1:],
            zone=_ZONE.value or "",
            project=_PROJECT.value,
            repo_dir=_REPO_DIR.value,
            python=_PYTHON.value,
        )
    except ValueError as e:
        raise app.UsageError(str(e)) from e
    if _DRY_RUN.value:
        print(f"# runs on every worker of TPU {_TPU.value} (--worker=all):")
        print(cmd[-1].removeprefix("--command="))
        print("# the gcloud command:")
        print(launchers.format_argv(cmd))
        return
    sys.exit(subprocess.call(cmd))


if __name__ == "__main__":
    app.run(main)
