r"""Runs a study: every (variant, seed) cell trained and evaluated, then the tables and curves.

    python -m launch.study --study=configs/studies/smoke.py --workdir=studies/smoke
    python -m launch.study --study=configs/studies/NAME.py --workdir=studies/NAME --parallel=2

Each cell is a ``launch.train`` subprocess in ``WORKDIR/cells/<variant>/seed-<s>/run``; rerunning
the same command resumes: finished cells (their ``done`` marker) are not run again, an interrupted
cell continues from its last checkpoint. Writes ``WORKDIR/results.json``, ``results.md`` and
``learning_curve.png``.

- ``--parallel=2`` runs two cells at once (each needs the memory of one run: about 4.5 GB for the
  tiny default; on a 2-core machine two CPU-bound cells at once are slower than one after the
  other, docs/evaluation.md).
- ``--reuse=studies/OTHER`` copies the finished cells of another study that ran the same config
  with the same code instead of running them again.
- ``--variants=grpo,ppo`` runs only those variants' cells (the results cover every finished cell,
  so a study can be run a few variants at a time into one workdir).

The study file format: ``agentrl_jax/experiments/study_spec.py``. Each cell's console output is
its ``train.log`` (its library logs: ``run/logs/train.log``); the study's own library logs go to
``WORKDIR/logs/study.log``.
"""

from absl import app, flags

from agentrl_jax.experiments import study as study_lib
from agentrl_jax.run import logs
from launch import cli

_STUDY = flags.DEFINE_string("study", None, "A configs/studies/NAME.py file.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Where the cells and the results go.")
_PARALLEL = flags.DEFINE_integer("parallel", 1, "Cells run at once (2 where memory allows).")
_REUSE = flags.DEFINE_list(
    "reuse",
    [],
    "Other studies' workdirs: their finished cells fill this study's cells that run the same "
    "config with the same code (copied, never rerun), e.g. a baseline two studies share.",
)
_VARIANTS = flags.DEFINE_list(
    "variants", [], "Run only these variants' cells (default: all of the study's)."
)


def main(argv):
    del argv
    if not _STUDY.value or not _WORKDIR.value:
        cli.fail("study: --study=configs/studies/NAME.py and --workdir=DIR are required")
    logs.setup()
    try:
        study = study_lib.load_study(_STUDY.value)
        cli.usable_workdir(_WORKDIR.value)
        logs.to_workdir(_WORKDIR.value, "study")
        study_lib.run_study(
            study,
            _WORKDIR.value,
            parallel=_PARALLEL.value,
            log=lambda m: print(m, flush=True),
            reuse=_REUSE.value,
            variants=_VARIANTS.value,
        )
    except study_lib.StudyError as e:
        cli.fail(f"study error: {e}")


if __name__ == "__main__":
    app.run(main, flags_parser=cli.parse_flags)
