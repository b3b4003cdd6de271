"""Learning curves of a run.

    plot_learning_curve(workdir / "tb", workdir / "eval" / "learning_curve.png")

The evaluation itself is the run's, in ``run/evaluation.py``, and its reports in
``run/eval_report.py``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

DEFAULT_CURVE_TAGS = (
    "rollout/success_rate",
    "rollout/return",
    "eval/success_rate",
    "sft/nll",
)


def plot_learning_curve(
    logdir: str | os.PathLike,
    out_png: str | os.PathLike,
    tags: Sequence[str] | None = None,
    *,
    title: str | None = None,
) -> list[str]:
    """Plots a run's TensorBoard scalars into a PNG, each training phase against its own axis.

    SFT scalars (``sft/*``) are drawn against the SFT step; everything else (rollouts, losses,
    evaluations) against the RL episodes played so far (the running sum of
    ``rollout/episodes``; RL iterations when the run did not log it), the after-SFT evaluation
    at 0. Every RL panel marks the points where a held-out evaluation ran (dotted lines), and
    the evaluation panels draw each evaluation as a point.

    Args:
      logdir: a folder of TensorBoard event files (``SummaryWriter``'s logdir).
      out_png: the PNG to write (folders are created).
      tags: the scalars to plot; every one must exist. None plots those of
        ``DEFAULT_CURVE_TAGS`` that exist (at least one must).
      title: the figure title (default: the logdir).

    Returns:
      The tags plotted.
    """
    import matplotlib  # noqa: PLC0415 - only the plotting path needs it.

    matplotlib.use("Agg")  # No display: render to files only.
    import matplotlib.pyplot as plt  # noqa: PLC0415

    from agentrl_jax.run.tensorboard import read_scalars  # noqa: PLC0415

    if not os.path.isdir(logdir):
        raise FileNotFoundError(f"TensorBoard logdir {logdir} does not exist")
    scalars = read_scalars(str(logdir))
    if tags is None:
        chosen = [t for t in DEFAULT_CURVE_TAGS if t in scalars]
        if not chosen:
            raise ValueError(
                f"{logdir} holds none of the default tags {DEFAULT_CURVE_TAGS}; pass tags= "
                f"from the ones it has: {sorted(scalars)}"
            )
    else:
        missing = [t for t in tags if t not in scalars]
        if missing or not tags:
            raise ValueError(
                f"{logdir} has no scalar {missing or 'at all (tags is empty)'}; "
                f"its tags: {sorted(scalars)}"
            )
        chosen = list(tags)
    # SFT panels first, then RL's, each phase in the order given.
    chosen = sorted(chosen, key=lambda t: not t.startswith("sft/"))
    rl_x, rl_label = rl_episode_axis(scalars)
    eval_steps = sorted({s for t, v in scalars.items() if t.startswith("eval/") for s, _ in v})
    fig, axes = plt.subplots(len(chosen), 1, figsize=(7, 2.5 * len(chosen) + 0.6), squeeze=False)
    for ax, tag in zip(axes[:, 0], chosen):
        # A resumed run rewrites the steps after its checkpoint: the last value written wins
        # (event files are read in the order they were written).
        by_step = dict(scalars[tag])
        steps = sorted(by_step)
        values = [by_step[s] for s in steps]
        if tag.startswith("sft/"):
            ax.plot(steps, values, lw=1.5, marker="o" if len(steps) <= 50 else None, ms=3)
            ax.set_xlabel("SFT step", fontsize=8)
        else:
            xs = [rl_x(s) for s in steps]
            evaluation = tag.startswith(("eval/", "test/"))
            ax.plot(
                xs, values, lw=1.5, marker="D" if evaluation else "o", ms=5 if evaluation else 3
            )
            for i, step in enumerate(eval_steps):
                ax.axvline(
                    rl_x(step), color="grey", ls=":", lw=1, label="evaluation" if i == 0 else None
                )
            if eval_steps:
                ax.legend(fontsize=7, loc="best")
            ax.set_xlabel(rl_label, fontsize=8)
        ax.set_ylabel(tag, fontsize=8)
        ax.grid(alpha=0.3)
        if "success" in tag:
            ax.set_ylim(-0.02, 1.02)
    fig.suptitle(title or f"learning curve: {os.path.basename(os.path.normpath(logdir))}")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out_png)), exist_ok=True)
    fig.savefig(out_png, format="png", dpi=100)
    plt.close(fig)
    return chosen


def rl_episode_axis(scalars: dict[str, list[tuple[int, float]]]):
    """(step -> RL episodes played by the end of that iteration, axis label) of a run's scalars.

    The RL phase logs iteration ``i`` at step ``i`` (1-based; the after-SFT evaluation at 0) with
    ``rollout/episodes``, which every RL iteration writes.
    """
    per_step = dict(scalars.get("rollout/episodes", ()))
    if not per_step:
        return (lambda step: step), "RL iteration"
    total, played = 0.0, {0: 0.0}
    for step in sorted(per_step):
        total += per_step[step]
        played[step] = total
    return (lambda step: played.get(step, float(step))), "RL episodes"


__all__ = ["DEFAULT_CURVE_TAGS", "plot_learning_curve", "rl_episode_axis"]
