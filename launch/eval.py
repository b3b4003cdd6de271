r"""Evaluates a trained run on held-out tasks and plots its learning curve.

    python -m launch.eval --workdir=runs/tiny_textworld --split=test --num_tasks=200
    python -m launch.eval --workdir=runs/tiny_textworld --split=test --decoding=free
    python -m launch.eval --workdir=runs/alf --env=alfworld --split=valid_unseen --levels=all

Builds the run's parts (``agentrl_jax/run/build.py``: tasks, actor pool, tokenizer, policy,
sampler; no trainer) from its config (``WORKDIR/config.json``, written by launch.train), reads
the policy of the run's newest checkpoint into them, plays one greedy episode per task, and
writes, under ``WORKDIR/eval``: a JSON and a markdown report per level (success overall and per
task type with 95% Wilson intervals, mean steps; the split, number of games, decoding mode,
temperature and seed) and ``learning_curve.png`` from the run's TensorBoard scalars (SFT against
its steps, RL against its episodes, evaluations marked).

``--split``: a held-out split of the env family, as it registered them (TextWorld: ``valid``,
the tuning split, or ``test``, the reporting one; default: the run's evaluation split).
``--decoding``: ``constrained`` (the policy writes one of the env's admissible commands; the env
must list them) or ``free`` (default: the run's). Reports are named
``eval_<split>[_<decoding>]_<level>_<split>``; beside each, its first ``--transcripts`` episodes
as text (``..._transcripts.md``: what the model read and wrote each turn; default: the run's
``env.num_transcripts``, 3). ``--failures``: also why the lost episodes were lost, every level's
in one breakdown by category and task type, with every episode's outcome by walkthrough shape
and where the lost ones left the walkthrough (``eval/<name>_failures.{md,json}``, beside the
reports; against the run's after-SFT evaluations of the same games where it has them:
``agentrl_jax/experiments/failures.py``, docs/evaluation.md). Library logs (orbax, JAX) go to
``WORKDIR/logs/eval.log``, not the console (``--alsologtostderr``: both).

    python -m launch.eval --workdir=runs/tiny_textworld --split=valid --failures
"""

import functools
import os

import jax
from absl import app, flags, logging

from agentrl_jax import compile_cache
from agentrl_jax.envs import registry
from agentrl_jax.experiments import failures
from agentrl_jax.experiments.evaluate import plot_learning_curve
from agentrl_jax.run import eval_report, evaluation, logs, multihost, paths
from agentrl_jax.run.config import ConfigError, from_config_dict, import_plugins
from launch import cli

_WORKDIR = flags.DEFINE_string("workdir", None, "The run's workdir (from launch.train).")
_ENV = flags.DEFINE_string("env", None, "Env family; must match the run's (default: the run's).")
_SPLIT = flags.DEFINE_string(
    "split",
    None,
    "A held-out split of the env family (TextWorld: valid|test; default: its eval split).",
)
_DECODING = flags.DEFINE_enum(
    "decoding",
    None,
    evaluation.DECODING_MODES,
    "free, or constrained to the env's admissible commands (default: the run's).",
)
_LEVELS = flags.DEFINE_list("levels", None, "Levels to evaluate (default: the run's eval levels).")
_NUM_TASKS = flags.DEFINE_integer("num_tasks", None, "Tasks per level (default: the run's).")
_TRANSCRIPTS = flags.DEFINE_integer(
    "transcripts",
    None,
    "Episodes per level written out as text, eval/<name>_<level>_transcripts.md (default: the "
    "run's env.num_transcripts).",
)
_FAILURES = flags.DEFINE_bool(
    "failures",
    False,
    "Also break the lost episodes down by why they were lost, and every episode by walkthrough "
    "shape: eval/<name>_failures.{md,json}.",
)


def _evaluate(
    parts, policy, graphdef, name: str
) -> tuple[dict[str, float], dict[str, evaluation.EvalResult]]:
    """``policy`` (a state of ``graphdef``, the RL learner's graph) played greedily on every
    held-out level of ``parts``, as the trainer's evaluations play them: a report per level under
    WORKDIR/eval (with ``--failures``, the lost episodes' breakdown too), the metrics and results
    back.
    """
    from agentrl_jax.run import build
    from agentrl_jax.run.watchdog import Watchdog

    sync = functools.partial(
        build.sync_sampler,
        parts.sampler,
        policy,
        parts.policy.cfg.dtype,
        parts.local_mesh,
        graphdef=graphdef,
        rollout=parts.rollout_mesh,
    )
    with (
        Watchdog(parts.config.watchdog_s).guard(f"evaluation {name}"),
        build.policy_in_sampler(parts.sampler, sync),
    ):
        metrics, results = eval_report.evaluate_policy(
            parts.worker,
            parts.config,
            parts.eval_tasks,
            name=name,
            workdir=parts.workdir,
            keep_episodes=_FAILURES.value,
        )
    if _FAILURES.value and multihost.is_primary():
        out = os.path.join(parts.workdir, "eval")
        failures.write_failures(
            results,
            parts.worker.tokenizer,
            cap=failures.step_cap(parts.config),
            max_turns=parts.config.rollout.max_turns,
            out_dir=out,
            name=name,
            after_sft=failures.after_sft_results(out),
        )
    return metrics, results


def _evaluate_latest(config, workdir: str, name: str):
    """The policy of the run's newest checkpoint, evaluated (``_evaluate``) in the run's parts."""
    from agentrl_jax.run import build
    from agentrl_jax.run.state import restore_to_play

    checkpointer = build.checkpointer(config, workdir)
    try:
        if checkpointer.latest_step() is None:
            cli.fail(f"eval: no checkpoint under {workdir}/checkpoints")
        parts = build.build(config, paths.absolute(workdir))
        try:
            restored, learner = restore_to_play(
                checkpointer, config, policy=parts.policy, mesh=parts.mesh
            )
            logging.info(
                "evaluating checkpoint %d (phase %s, after %d RL iterations)",
                restored.step,
                restored.meta.run.phase,
                restored.meta.run.rl_iteration,
            )
            return _evaluate(parts, restored.train.policy, learner.policy_graphdef, name)
        finally:
            parts.close()
    finally:
        checkpointer.close()


def main(argv):
    del argv
    logs.setup()  # library logs (orbax's restore, JAX) go to WORKDIR/logs/eval.log
    workdir = _WORKDIR.value
    if not workdir:
        cli.fail("eval: --workdir=DIR (a launch.train workdir) is required")
    cd = cli.run_config_dict(workdir, "eval")
    if _ENV.value and _ENV.value != cd.env.name:
        cli.fail(f"eval: --env={_ENV.value} but the run trained on {cd.env.name!r}")
    try:  # The run's plugins register its env family (and its losses) before anything asks.
        import_plugins(tuple(cd.get("plugins", ()) or ()))
    except ConfigError as e:
        cli.fail(f"config error: {e}")
    try:
        family = registry.family(cd.env.name)
    except ValueError as e:
        cli.fail(f"config error: config.env.name: {e}")
    split = _SPLIT.value
    valid_splits = family.held_out_splits
    if split and split not in valid_splits:
        cli.fail(
            f"eval: --split={split!r} is not a held-out split of {cd.env.name!r}; expected one "
            f"of {', '.join(valid_splits)}"
        )
    levels = _LEVELS.value or list(cd.env.eval_levels)
    if split:
        levels = [f"{level.partition('@')[0]}@{split}" for level in levels]
    cd.env.eval_levels = tuple(levels)
    if _NUM_TASKS.value:
        cd.env.num_eval_tasks = _NUM_TASKS.value
    if _DECODING.value:
        cd.rollout.constrain_actions = _DECODING.value == "constrained"
    if _TRANSCRIPTS.value is not None:
        cd.env.num_transcripts = _TRANSCRIPTS.value
    try:
        config = from_config_dict(cd, num_devices=jax.device_count())
    except ConfigError as e:
        cli.fail(f"config error: {e}")
    compile_cache.enable(config.compile_cache)  # before anything compiles

    name = f"eval_{split or 'heldout'}" + (f"_{_DECODING.value}" if _DECODING.value else "")
    metrics, results = _evaluate_latest(config, workdir, name)
    out = os.path.join(workdir, "eval")
    tags = plot_learning_curve(
        os.path.join(workdir, "tensorboard"), os.path.join(out, "learning_curve.png")
    )
    for level, result in results.items():
        print(f"## {level}\n\n{eval_report.markdown_table(result)}\n")
    for key, value in sorted(metrics.items()):
        print(f"{key}: {value:.3f}")
    print(f"reports: {out}/{name}_*.json and .md (transcripts: {name}_*_transcripts.md)")
    if _FAILURES.value:
        print(f"failures: {out}/{name}_failures.md and .json")
    print(f"learning curve: {out}/learning_curve.png ({', '.join(tags)})")


if __name__ == "__main__":
    app.run(main, flags_parser=cli.parse_flags)
