"""Held-out evaluation: success rates per task type, reports, before/after tables, learning curves.

    result = evaluate(worker, tasks, jax.random.key(0))          # greedy by default
    write_report(result, workdir / "eval", "simple_after_rl")   # .json + .md
    print(before_after_table([("simple (training complexity)", sft_simple, rl_simple),
                              ("medium (next harder)", sft_medium, rl_medium)]))
    plot_learning_curve(workdir / "tb", workdir / "eval" / "learning_curve.png")

Task type: what success is broken down by. The env's own report wins (a ``task_type`` in the
trajectory's step info, as ALFWorld's env sends it); then the task's ``task_type`` param; then
the hook the task's env family registered (``registry.EnvFamily.task_type``: TextWorld names a
game by its spec's preset when it is one, simple, medium, hard, else the spec's name such as
custom-r6-o10-q5 or tw-cooking-...; ALFWorld reads the type encoded in the task id); else the
first part of the task id.

Episodes lost to the actor pool (``infra_failure``) say nothing about the policy: they are left
out of every rate and mean, and counted.

Every result says how it was measured: the split its tasks came from, the number of games, the
decoding mode (``free``, or ``constrained`` to the env's admissible commands), the sampling
temperature (0: greedy), the run's seed, and a 95% Wilson interval for each success rate
(``experiments/stats.py``). Sampled evaluation plays each game several times, and a game's episodes
are not independent: its intervals are clustered by game (Wilson's at the effective sample size,
``stats.clustered_wilson_interval``); greedy evaluation, one episode per game, gets the plain
Wilson interval. It keeps each counted episode's outcome by (split, task id), so two results on
the same games (after SFT, after RL) get a paired interval for their difference
(:func:`paired_gain`, Newcombe's method for paired data).

What the agent did: ``evaluate(..., transcripts=N)`` keeps the first N episodes as text (each
turn's observation as the model read it and the command it wrote, with the reward and the
outcome), and ``write_report`` puts them beside the report in ``<name>_transcripts.md``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Sequence
from typing import Any

import jax

from agentrl_jax.experiments import stats as stats_lib
from agentrl_jax.rollout.rollout import RolloutWorker, decode_text
from agentrl_jax.rollout.trajectory import Trajectory
from agentrl_jax.sampling import SamplingParams

DEFAULT_CURVE_TAGS = (
    "rollout/success_rate",
    "rollout/return",
    "eval/success_rate",
    "sft/nll",
)


@dataclasses.dataclass(frozen=True)
class Stats:
    """Outcomes of a set of episodes (infrastructure failures excluded from all but their count).

    Attributes:
      episodes: episodes counted (infrastructure failures excluded).
      wins: episodes won.
      success_rate: wins / episodes (nan when no episode counted).
      mean_steps: actions per counted episode.
      mean_return: summed reward per counted episode.
      invalid_action_rate: share of counted steps the env flagged as invalid actions.
      truncated: counted episodes the rollout cut (max_turns or the context length), unwon.
      infra_failures: episodes lost to the actor pool, left out of the above.
      games: distinct games, (split, task id), of the counted episodes (0: not recorded, a
        report written before it was kept).
      design_effect: of the success rate, the counted episodes clustered by game
        (``stats.design_effect``): 1 with one episode per game.
    """

    episodes: int
    wins: int
    success_rate: float
    mean_steps: float
    mean_return: float
    invalid_action_rate: float
    truncated: int
    infra_failures: int
    games: int = 0
    design_effect: float = 1.0

    @property
    def interval(self) -> tuple[float, float]:
        """The 95% Wilson interval of ``success_rate`` (NaN without episodes), at the effective
        sample size of episodes clustered by game (the plain one with one episode per game)."""
        return stats_lib.wilson_interval(self.wins, self.episodes, design_effect=self.design_effect)

    @classmethod
    def of(cls, trajs: Sequence[Trajectory]) -> Stats:
        counted = [t for t in trajs if not t.infra_failure]
        n = len(counted)
        steps = sum(len(t.steps) for t in counted)
        invalid = sum(bool(s.info.get("invalid_action", False)) for t in counted for s in t.steps)
        wins = sum(t.won for t in counted)
        per_game: dict[tuple[str, str], list[int]] = {}  # (split, task id) -> [wins, episodes]
        for t in counted:
            game = per_game.setdefault((t.task.split, t.task.id), [0, 0])
            game[0] += bool(t.won)
            game[1] += 1
        nan = float("nan")
        return cls(
            episodes=n,
            wins=wins,
            success_rate=wins / n if n else nan,
            mean_steps=steps / n if n else nan,
            mean_return=sum(t.episode_return for t in counted) / n if n else nan,
            invalid_action_rate=invalid / steps if steps else nan,
            truncated=sum(t.truncated and not t.won for t in counted),
            infra_failures=len(trajs) - n,
            games=len(per_game),
            design_effect=stats_lib.design_effect(
                [w for w, _ in per_game.values()], [m for _, m in per_game.values()]
            ),
        )


DECODING_MODES = ("free", "constrained")


@dataclasses.dataclass(frozen=True)
class EvalResult:
    """Attributes:
    overall: Stats of every episode.
    per_type: Stats per task type, sorted by type.
    greedy: whether actions were greedy.
    num_tasks: tasks evaluated (each played group_size times when sampling).
    split: the split the tasks came from ("test", "valid", ...; "a+b" if mixed; "" unknown).
    decoding: "free" or "constrained" (to the env's admissible commands); "" unknown.
    temperature: the sampling temperature (0.0: greedy).
    seed: the run's seed (the policy's), when known.
    outcomes: (split, task id, won) of every counted episode, in play order: what pairs two
      results (two splits may name a game alike).
    transcripts: the first episodes as markdown (``transcript``), when asked for; written beside
      the report, not part of its JSON.
    """

    overall: Stats
    per_type: dict[str, Stats]
    greedy: bool
    num_tasks: int
    split: str = ""
    decoding: str = ""
    temperature: float = 0.0
    seed: int | None = None
    outcomes: tuple[tuple[str, str, bool], ...] = ()
    transcripts: tuple[str, ...] = ()

    @property
    def success_rate(self) -> float:
        return self.overall.success_rate

    @property
    def protocol(self) -> str:
        """How it was measured: ``200 test games, constrained decoding, greedy, seed 0``."""
        mode = "greedy" if self.greedy else f"sampled at T={self.temperature:g}"
        parts = [f"{self.num_tasks} {self.split or 'held-out'} games"]
        if self.decoding:
            parts.append(f"{self.decoding} decoding")
        parts.append(mode)
        if self.seed is not None:
            parts.append(f"seed {self.seed}")
        return ", ".join(parts)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EvalResult:
        """Inverts ``to_json`` (reports kept in checkpoint metadata come back as results; those
        written before the protocol fields existed get their defaults, and outcomes written as
        [task id, won], before the split was kept, the report's split)."""
        names = {f.name for f in dataclasses.fields(Stats)}

        def stats(d: dict[str, Any]) -> Stats:
            return Stats(
                **{k: float("nan") if v is None else v for k, v in d.items() if k in names}
            )

        return cls(
            overall=stats(data["overall"]),
            per_type={k: stats(v) for k, v in data["per_type"].items()},
            greedy=bool(data["greedy"]),
            num_tasks=int(data["num_tasks"]),
            split=str(data.get("split", "")),
            decoding=str(data.get("decoding", "")),
            temperature=float(data.get("temperature", 0.0)),
            seed=data.get("seed"),
            outcomes=tuple(
                _outcome(item, str(data.get("split", ""))) for item in data.get("outcomes", ())
            ),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "split": self.split,
            "num_tasks": self.num_tasks,
            "decoding": self.decoding,
            "greedy": self.greedy,
            "temperature": self.temperature,
            "seed": self.seed,
            "confidence": stats_lib.CONFIDENCE,
            "overall": _json_stats(self.overall),
            "per_type": {k: _json_stats(v) for k, v in self.per_type.items()},
            "outcomes": [[split, t, int(w)] for split, t, w in self.outcomes],
        }


def _outcome(item: Sequence[Any], split: str) -> tuple[str, str, bool]:
    """One JSON outcome: [split, task id, won], or [task id, won] (older reports: ``split``)."""
    if len(item) == 2:
        task, won = item
        return split, str(task), bool(won)
    game_split, task, won = item
    return str(game_split), str(task), bool(won)


def paired_gain(before: EvalResult, after: EvalResult) -> stats_lib.PairedDifference:
    """``after - before`` success on the games both results counted, with its paired interval.

    Episodes are matched by game, (split, task id) (the i-th episode of a game in one with the
    i-th in the other); games only one result counted (an infrastructure failure in the other)
    are left out.
    """
    played: dict[tuple[str, str], list[bool]] = {}
    for split, task, won in before.outcomes:
        played.setdefault((split, task), []).append(won)
    seen: dict[tuple[str, str], int] = {}
    pairs = []
    for split, task, won in after.outcomes:
        game = (split, task)
        i = seen.get(game, 0)
        seen[game] = i + 1
        if i < len(played.get(game, ())):
            pairs.append((played[game][i], won))
    return stats_lib.paired_difference([b for b, _ in pairs], [a for _, a in pairs])


def task_type(traj: Trajectory) -> str:
    """The category a trajectory's success is reported under (see the module docstring)."""
    for step in traj.steps:
        if step.info.get("task_type"):
            return str(step.info["task_type"])
    task = traj.task
    if task.param("task_type"):
        return str(task.param("task_type"))
    hook = _family_task_type(task.env)
    kind = hook(task) if hook else ""
    return str(kind) if kind else task.id.split("/", 1)[0]


def _family_task_type(env: str):
    """The ``task_type`` hook the env family registered (None: none, or not registered)."""
    from agentrl_jax.envs import registry  # noqa: PLC0415

    try:
        return registry.family(env).hook("task_type")
    except ValueError:
        return None


def summarize(
    trajs: Sequence[Trajectory],
    *,
    greedy: bool,
    num_tasks: int,
    decoding: str = "",
    temperature: float = 0.0,
    seed: int | None = None,
) -> EvalResult:
    """Aggregates played episodes into an EvalResult (the split is read off their tasks)."""
    by_type: dict[str, list[Trajectory]] = {}
    for traj in trajs:
        by_type.setdefault(task_type(traj), []).append(traj)
    return EvalResult(
        overall=Stats.of(trajs),
        per_type={k: Stats.of(v) for k, v in sorted(by_type.items())},
        greedy=greedy,
        num_tasks=num_tasks,
        split="+".join(sorted({t.task.split for t in trajs})),
        decoding=decoding,
        temperature=0.0 if greedy else temperature,
        seed=seed,
        outcomes=tuple(
            (t.task.split, t.task.id, bool(t.won)) for t in trajs if not t.infra_failure
        ),
    )


def evaluate(
    worker: RolloutWorker,
    tasks: Sequence[Any],
    rng: jax.Array,
    *,
    greedy: bool = True,
    sampling: SamplingParams | None = None,
    batch_size: int | None = None,
    seed: int | None = None,
    transcripts: int = 0,
) -> EvalResult:
    """Plays every task with the policy and reports success overall and per task type.

    Args:
      worker: a RolloutWorker (its pool, sampler and context settings are used as they are).
      tasks: held-out tasks.
      rng: the sampling key (unused by greedy decoding, kept for sampled evaluation).
      greedy: argmax decoding, one episode per task (a greedy group would repeat it G times);
        False samples ``worker.config.group_size`` episodes per task with ``sampling``.
      sampling: the distribution when not greedy (default: the sampler's own).
      batch_size: episodes played at once at most (default: the worker's waves, which fill
        its actor pool; a multi-host worker splits them over the processes).
      seed: the run's seed, recorded in the result (the policy's; greedy play needs no key).
      transcripts: keep the first this many episodes, in task order, as text (``transcript``).

    Returns:
      EvalResult, with the decoding mode of ``worker.config.constrain_actions``.
    """
    if not tasks:
        raise ValueError("evaluate() got no tasks; expected at least one held-out task")
    if greedy:
        sampling = SamplingParams(temperature=0.0)
        cfg = dataclasses.replace(worker.config, group_size=1)
        worker = worker.with_config(cfg)
    # The worker cuts the tasks into waves of its pool (a multi-host worker: each process its
    # share); ``batch_size`` only caps the episodes of one call. Every episode is keyed by its
    # task's place in ``tasks`` (task_offset), so the calls' sizes do not change what it plays.
    group = worker.config.group_size
    per_call = max(1, batch_size // group) if batch_size else len(tasks)
    trajs: list[Trajectory] = []
    for start in range(0, len(tasks), per_call):
        chunk = list(tasks[start : start + per_call])
        trajs += worker.run(chunk, rng, sampling=sampling, task_offset=start)
    result = summarize(
        trajs,
        greedy=greedy,
        num_tasks=len(tasks),
        decoding="constrained" if worker.config.constrain_actions else "free",
        temperature=(sampling or SamplingParams()).temperature,
        seed=seed,
    )
    texts = tuple(transcript(t, worker.tokenizer) for t in trajs[:transcripts])
    return dataclasses.replace(result, transcripts=texts)


def transcript(traj: Trajectory, tokenizer) -> str:
    """One episode as markdown: its task and outcome, then per turn the observation as the model
    read it (the newest turn; in step-wise contexts after the header with the goal, shown once)
    and the command it wrote, with its reward and whether the environment rejected it; then the
    observation after the last command."""

    def block(ids) -> list[str]:
        body = decode_text(tokenizer, ids)
        fence = "```"
        while fence in body:  # a fence the text cannot close
            fence += "`"
        return [fence, body, fence, ""]

    if traj.infra_failure:
        outcome = "infrastructure failure"
    else:
        outcome = "won" if traj.won else ("truncated" if traj.truncated else "lost")
    lines = [
        f"### {traj.task.split}:{traj.task.id}: {outcome}, {len(traj.steps)} steps, "
        f"return {traj.episode_return:g}",
        "",
    ]
    if traj.header_ids:
        lines += ["context header:", *block(traj.header_ids)]
    for t, step in enumerate(traj.steps):
        notes = [f"reward {step.reward:g}"] if step.reward else []
        if step.info.get("invalid_action"):
            notes.append("invalid")
        lines += [f"observation {t}:", *block(step.obs_ids)]
        lines += [f"action {t}" + (f" ({', '.join(notes)})" if notes else "") + ":"]
        lines += block(step.action_ids)
    if traj.final_obs_ids:
        lines += ["final observation:", *block(traj.final_obs_ids)]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ reports


def write_report(result: EvalResult, out_dir: str | os.PathLike, name: str) -> tuple[str, str]:
    """Writes ``<out_dir>/<name>.json`` and ``<out_dir>/<name>.md`` (and, when the result kept
    transcripts, ``<out_dir>/<name>_transcripts.md``); returns the report's two paths."""
    if not name or os.sep in name or name.startswith("."):
        raise ValueError(f"report name {name!r}: expected a plain file stem such as 'eval_simple'")
    os.makedirs(out_dir, exist_ok=True)
    json_path = os.path.join(out_dir, f"{name}.json")
    md_path = os.path.join(out_dir, f"{name}.md")
    with open(json_path, "w") as f:
        json.dump({"name": name, **result.to_json()}, f, indent=2, allow_nan=False)
        f.write("\n")
    with open(md_path, "w") as f:
        f.write(f"# Evaluation: {name}\n\n{markdown_table(result)}\n")
    if result.transcripts:
        with open(os.path.join(out_dir, f"{name}_transcripts.md"), "w") as f:
            n = len(result.transcripts)
            first = f"first {n} episodes" if n > 1 else "first episode"
            f.write(
                f"# Transcripts: {name}\n\nThe {first} ({result.protocol}).\n\n"
                + "\n".join(result.transcripts)
            )
    return json_path, md_path


def markdown_table(result: EvalResult) -> str:
    """One row per task type, then the overall row."""
    lines = [
        "| task type | episodes | success | 95% CI | mean steps | mean return | invalid actions "
        "| infra failures |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    rows = [*result.per_type.items(), ("**all**", result.overall)]
    for label, s in rows:
        lines.append(
            f"| {label} | {s.episodes} | {_pct(s.success_rate)} "
            f"| {stats_lib.fmt_interval(*s.interval)} | {_num(s.mean_steps)} "
            f"| {_num(s.mean_return, 3)} | {_pct(s.invalid_action_rate)} | {s.infra_failures} |"
        )
    lines.append(f"\n{result.protocol}; {_interval_note([result])}.")
    return "\n".join(lines)


def _interval_note(results: Sequence[EvalResult]) -> str:
    """What the intervals are: Wilson's, clustered by game where a game has several episodes."""
    clustered = [r.overall for r in results if r.overall.design_effect != 1.0]
    if not clustered:
        return "95% Wilson intervals"
    counts = sorted({f"{s.episodes} episodes of {s.games} games" for s in clustered})
    return f"95% Wilson intervals, clustered by game ({'; '.join(counts)})"


def _gain(sft: EvalResult, rl: EvalResult) -> stats_lib.PairedDifference:
    """``paired_gain``; for reports written before outcomes were kept, the plain difference of
    the rates without an interval."""
    gain = paired_gain(sft, rl)
    if sft.outcomes and rl.outcomes:
        return gain
    diff = rl.success_rate - sft.success_rate
    return dataclasses.replace(gain, diff=diff, low=float("nan"), high=float("nan"))


def _rate_json(s: Stats) -> dict[str, Any]:
    """``stats.rate_json`` of a Stats, with its interval clustered by game."""
    return stats_lib.rate_json(s.wins, s.episodes, design_effect=s.design_effect)


def before_after_rows(rows: Sequence[tuple[str, EvalResult, EvalResult]]) -> list[dict[str, Any]]:
    """The before/after comparison as JSON rows: each result's rate with its Wilson interval,
    RL's gain on the games both counted with its paired (Newcombe) interval, and each result's
    episodes lost to infrastructure failures (``infra_failures``: after_sft, after_rl)."""
    out = []
    for label, sft, rl in rows:
        gain = _gain(sft, rl)
        out.append(
            {
                "set": label,
                "split": rl.split,
                "num_tasks": rl.num_tasks,
                "decoding": rl.decoding,
                "greedy": rl.greedy,
                "temperature": rl.temperature,
                "seed": rl.seed,
                "after_sft": _rate_json(sft.overall),
                "after_rl": _rate_json(rl.overall),
                "gain": gain.to_json(),
                # Episodes lost to the actor pool, left out of every rate above.
                "infra_failures": {
                    "after_sft": sft.overall.infra_failures,
                    "after_rl": rl.overall.infra_failures,
                },
            }
        )
    return out


def before_after_table(rows: Sequence[tuple[str, EvalResult, EvalResult]]) -> str:
    """The main job's table: held-out success after SFT alone and after RL, per evaluation set.

    Args:
      rows: (label, result after SFT, result after RL), e.g. the training complexity, then the
        next harder one, both on the same games.

    Returns:
      A markdown table with 95% Wilson intervals; then RL's gain in percentage points on the
      games both results counted and its paired interval (Newcombe); the last column counts the
      episodes lost to infrastructure failures (after SFT / after RL), left out of the rates;
      then a line per protocol (split, games, decoding, temperature, seed).
    """
    if not rows:
        raise ValueError("before_after_table got no rows; expected (label, sft, rl) tuples")
    lines = [
        "| held-out set | episodes | after SFT | 95% CI | after RL | 95% CI | RL gain "
        "| 95% CI (paired) | infra failures |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, sft, rl in rows:
        gain = _gain(sft, rl)
        episodes = (
            str(sft.overall.episodes)
            if sft.overall.episodes == rl.overall.episodes
            else f"{sft.overall.episodes} / {rl.overall.episodes}"
        )
        lines.append(
            f"| {label} | {episodes} | {_pct(sft.success_rate)} "
            f"| {stats_lib.fmt_interval(*sft.overall.interval)} | {_pct(rl.success_rate)} "
            f"| {stats_lib.fmt_interval(*rl.overall.interval)} "
            f"| {'n/a' if math.isnan(gain.diff) else f'{100 * gain.diff:+.1f} pts'} "
            f"| {stats_lib.fmt_interval(gain.low, gain.high)} "
            f"| {sft.overall.infra_failures} / {rl.overall.infra_failures} |"
        )
    protocols = sorted({r.protocol for _, sft, rl in rows for r in (sft, rl)})
    results = [r for _, sft, rl in rows for r in (sft, rl)]
    lines.append(
        f"\n{'; '.join(protocols)}. {_interval_note(results)}; the gain's interval is "
        "Newcombe's for paired outcomes on the same games."
    )
    return "\n".join(lines)


def _json_stats(s: Stats) -> dict[str, Any]:
    # JSON has no NaN: an empty set's rates are null.
    low, high = s.interval
    out = {**vars(s), "success_low": low, "success_high": high}
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in out.items()}


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{100.0 * x:.1f}%"


def _num(x: float, digits: int = 2) -> str:
    return "n/a" if math.isnan(x) else f"{x:.{digits}f}"


# ------------------------------------------------------------------------------------ plots


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


__all__ = [
    "DECODING_MODES",
    "DEFAULT_CURVE_TAGS",
    "EvalResult",
    "Stats",
    "before_after_rows",
    "before_after_table",
    "evaluate",
    "markdown_table",
    "paired_gain",
    "plot_learning_curve",
    "rl_episode_axis",
    "summarize",
    "task_type",
    "write_report",
]
