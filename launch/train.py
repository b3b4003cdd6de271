r"""Trains a policy: SFT on expert demonstrations, then RL, evaluating before and after.

    python -m launch.train --config=configs/tiny_textworld.py --workdir=runs/tiny
    python -m launch.train --config=configs/tiny_textworld.py --workdir=runs/tiny \
        --config.rl.algo=gagpo --config.rollout.context_mode=step

The whole configuration is validated before any compute (an unknown algorithm, ``gae`` without a
critic, a mesh that does not divide the devices: a clear error listing the valid choices).
Rerunning the same command with the same workdir resumes from the last checkpoint. A rerun whose
config differs from the workdir's ``config.json`` in anything that changes the run stops with an
error naming the fields (``--allow_config_change`` accepts the change on purpose and records it
in ``config_changes.jsonl``; see ``run/workdir_config.py``). ``--stop_after=sft`` stops once
SFT is done, evaluated and checkpointed: a copy of that workdir is an SFT start that runs with
other RL settings resume from (``launch.study``'s ``shared_sft``). A checkpoint that cannot be
written (disk full, read-only workdir) stops the run with an error naming its path; the previous
checkpoint stays restorable.

The before/after table (``report.md``, printed) is on the report split (TextWorld: ``test``,
``config.env.num_report_tasks`` games per level), with 95% Wilson intervals and RL's gain with its
paired interval; ``report.json`` holds those rows (``before_after``) and every evaluation
(``evals``: per name, per level, the result with its split, decoding, temperature, seed and
per-game outcomes).

Multi-host: the same command on every host, one process each, with ``--coordinator_address``,
``--num_processes`` and ``--process_id`` (or ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES``,
``JAX_PROCESS_ID`` in the environment, or ``AGENTRL_DISTRIBUTED=1`` to let JAX detect a TPU pod or
SLURM job); ``launch/tpu_pod.py`` and ``launch/multinode_gpu.py`` build those commands.
At start the processes all-gather a fingerprint of their resolved config, code, task lists and
tokenizer vocabulary, and stop (every one of them, status 2) with an error naming what differs.
``--init_timeout_s`` and ``--heartbeat_timeout_s`` bound how long processes wait for each other
to start and for a silent one; ``config.watchdog_s`` ends a process whose RL iteration, SFT
epoch, evaluation or checkpoint runs past a limit (``run/watchdog.py``).
Only process 0 writes the config, the reports and info logs; the workdir must be a filesystem
every host sees (checkpoints are written there by all processes through orbax).

The console shows the phases, progress bars with their ETA, one summary line per RL iteration
and the final table; every log record, the libraries' INFO logs included (orbax, JAX), goes to
``WORKDIR/logs/train.log`` (``train.p<i>.log`` for process i > 0). ``--alsologtostderr`` (or an
explicit ``--verbosity``) shows them on the console again (``run/logs.py``).
"""

import json
import sys

import jax
from absl import app, flags, logging
from etils import epath
from ml_collections import config_flags

from agentrl_jax import compile_cache
from agentrl_jax.run import eval_report, logs, paths, workdir_config
from agentrl_jax.run.checkpoint import CheckpointWriteError
from agentrl_jax.run.config import ConfigError, from_config_dict
from agentrl_jax.sharding import maybe_initialize_distributed
from launch import cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "A configs/*.py file.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where checkpoints, logs and reports go.")
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "host:port of process 0, for a multi-host run (jax.distributed)."
)
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in a multi-host run.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index in the run.")
_INIT_TIMEOUT = flags.DEFINE_integer(
    "init_timeout_s",
    None,
    "Multi-host: seconds to wait for every process to join (default: JAX's, 300).",
)
_HEARTBEAT_TIMEOUT = flags.DEFINE_integer(
    "heartbeat_timeout_s",
    None,
    "Multi-host: seconds a process may go silent before the others fail (default: JAX's, 100).",
)
_ALLOW_CONFIG_CHANGE = flags.DEFINE_bool(
    "allow_config_change",
    False,
    "Resume even though the config differs from the workdir's config.json in fields that change "
    "the run (the change is recorded in config_changes.jsonl).",
)
_STOP_AFTER = flags.DEFINE_enum(
    "stop_after",
    None,
    ["sft"],
    "sft: stop once SFT is done, evaluated and checkpointed, before RL begins (an SFT start that "
    "runs with other RL settings resume from: copy the workdir, then --allow_config_change).",
)


def main(argv):
    del argv
    if _CONFIG.value is None or not _WORKDIR.value:
        raise app.UsageError("--config=configs/<name>.py and --workdir=DIR are required")
    logs.setup()  # library logs (orbax, JAX) go to WORKDIR/logs/train.log, not the console
    jax.config.update("jax_threefry_partitionable", True)
    # Multi-host: from the flags, or auto-detected when AGENTRL_DISTRIBUTED=1 (TPU pods, SLURM).
    maybe_initialize_distributed(
        _COORDINATOR.value,
        _NUM_PROCESSES.value,
        _PROCESS_ID.value,
        initialization_timeout_s=_INIT_TIMEOUT.value,
        heartbeat_timeout_s=_HEARTBEAT_TIMEOUT.value,
    )
    primary = jax.process_index() == 0
    if not primary:
        logging.set_verbosity(logging.WARNING)  # info logs (progress, evals) from process 0 only
    try:
        config = from_config_dict(_CONFIG.value, num_devices=jax.device_count())
    except ConfigError as e:
        cli.fail(f"config error: {e}")
    compile_cache.enable(config.compile_cache)  # before anything compiles
    cli.usable_workdir(_WORKDIR.value)
    log_file = logs.to_workdir(_WORKDIR.value, "train", jax.process_index())
    logging.info("logs: %s (--alsologtostderr shows library logs here too)", log_file)
    try:
        changes = workdir_config.check_and_record(
            _WORKDIR.value,
            _CONFIG.value,
            config,
            allow_change=_ALLOW_CONFIG_CHANGE.value,
            write=primary,
        )
    except ConfigError as e:
        cli.fail(f"resume error: {e}")
    if changes:
        logging.warning("config changed since the workdir's last run: %s", changes)

    from agentrl_jax.experiments.evaluate import plot_learning_curve
    from agentrl_jax.run.multihost import DisagreementError
    from agentrl_jax.run.trainer import Trainer

    try:
        # The curve a W&B run shows when RL ends (config.logging.wandb), drawn by experiments/.
        trainer = Trainer(config, _WORKDIR.value, learning_curve=plot_learning_curve)
    except DisagreementError as e:
        cli.fail(f"multi-host error: {e}")
    try:
        evals = trainer.run(stop_after=_STOP_AFTER.value)
        table = trainer.before_after()
        rows = eval_report.before_after_rows(trainer.before_after_results())
    except CheckpointWriteError as e:
        logging.error("%s", e)
        print(f"checkpoint error: {e}", file=sys.stderr)
        sys.exit(1)
    finally:
        trainer.close()
    if not primary:
        return
    workdir = paths.absolute(_WORKDIR.value)  # a gs:// URL stays one
    epath.Path(workdir, "report.md").write_text(table + "\n")
    epath.Path(workdir, "report.json").write_text(
        json.dumps({"before_after": rows, "evals": evals}, indent=2, sort_keys=True)
    )
    print(table)
    logging.info("done")
    print(
        f"\nworkdir: {workdir}\n  tensorboard: {workdir}/tensorboard\n"
        f"  checkpoints: {workdir}/checkpoints\n  report: {workdir}/report.md, report.json"
    )


if __name__ == "__main__":
    app.run(main, flags_parser=cli.parse_flags)
