r"""Evaluates a trained run on held-out tasks and plots its learning curve.

    python -m launch.eval --workdir=runs/tiny_textworld --env=textworld --split=valid \
        --levels=simple,medium --num_tasks=50
    python -m launch.eval --workdir=runs/alf --env=alfworld --split=valid_unseen --levels=all

Restores the run's newest checkpoint (its config is ``WORKDIR/config.json``, written by
launch.train), plays one greedy episode per task, and writes, under ``WORKDIR/eval``: a JSON and
a markdown report per level (success overall and per task type, mean steps) and
``learning_curve.png`` from the run's TensorBoard scalars.
"""

import json
import os
import sys

import jax
import ml_collections
from absl import app, flags

from agentrl_jax.training import evaluate as evaluation
from agentrl_jax.training.config import ConfigError, from_config_dict

_WORKDIR = flags.DEFINE_string("workdir", None, "The run's workdir (from launch.train).")
_ENV = flags.DEFINE_string("env", None, "Env family; must match the run's (default: the run's).")
_SPLIT = flags.DEFINE_string("split", None, "Held-out split (default: the env's eval split).")
_LEVELS = flags.DEFINE_list("levels", None, "Levels to evaluate (default: the run's eval levels).")
_NUM_TASKS = flags.DEFINE_integer("num_tasks", None, "Tasks per level (default: the run's).")


def main(argv):
    del argv
    workdir = _WORKDIR.value
    if not workdir:
        raise app.UsageError("--workdir=DIR (a launch.train workdir) is required")
    config_path = os.path.join(workdir, "config.json")
    if not os.path.isfile(config_path):
        print(
            f"eval: {config_path} not found; is {workdir!r} a launch.train workdir?",
            file=sys.stderr,
        )
        sys.exit(2)
    with open(config_path) as f:
        cd = ml_collections.ConfigDict(json.load(f))
    if _ENV.value and _ENV.value != cd.env.name:
        print(f"eval: --env={_ENV.value} but the run trained on {cd.env.name!r}", file=sys.stderr)
        sys.exit(2)
    levels = _LEVELS.value or list(cd.env.eval_levels)
    if _SPLIT.value:
        levels = [f"{level.partition('@')[0]}@{_SPLIT.value}" for level in levels]
    cd.env.eval_levels = tuple(levels)
    if _NUM_TASKS.value:
        cd.env.num_eval_tasks = _NUM_TASKS.value
    try:
        config = from_config_dict(cd, num_devices=jax.device_count())
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        sys.exit(2)

    from agentrl_jax.training.trainer import Trainer

    trainer = Trainer(config, workdir)
    try:
        if not trainer.restore():
            print(f"eval: no checkpoint under {workdir}/checkpoints", file=sys.stderr)
            sys.exit(2)
        name = f"eval_{_SPLIT.value or 'heldout'}"
        metrics = trainer.evaluate(name)
    finally:
        trainer.close()
    out = os.path.join(workdir, "eval")
    tags = evaluation.plot_learning_curve(
        os.path.join(workdir, "tensorboard"), os.path.join(out, "learning_curve.png")
    )
    for key, value in sorted(metrics.items()):
        print(f"{key}: {value:.3f}")
    print(f"reports: {out}/{name}_*.json and .md")
    print(f"learning curve: {out}/learning_curve.png ({', '.join(tags)})")


if __name__ == "__main__":
    app.run(main)
