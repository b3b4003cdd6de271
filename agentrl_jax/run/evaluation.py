"""Held-out evaluation of a run: episodes played, success rates per task type, their JSON.

    result = evaluate(worker, tasks, jax.random.key(0))          # greedy by default
    result.success_rate, result.overall.interval                   # with its 95% interval
    paired_gain(after_sft, after_rl)                              # on the same games, paired

The reports and the before/after table of these results: ``run/eval_report.py``; learning
curves and the studies' tables: ``experiments/``.

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
(``agentrl_jax/stats.py``). Sampled evaluation plays each game several times, and a game's
episodes are not independent: its intervals are clustered by game (Wilson's at the effective
sample size, ``stats.clustered_wilson_interval``); greedy evaluation, one episode per game, gets
the plain Wilson interval. It keeps each counted episode's outcome by (split, task id), so two
results on the same games (after SFT, after RL) get a paired interval for their difference
(:func:`paired_gain`, Newcombe's method for paired data).

What the agent did: ``evaluate(..., transcripts=N)`` keeps the first N episodes as text (each
turn's observation as the model read it and the command it wrote, with the reward and the
outcome), and ``eval_report.write_report`` puts them beside the report in
``<name>_transcripts.md``. Why it lost: ``evaluate(..., keep_episodes=True)`` keeps the played
episodes themselves (``EvalResult.episodes``), which the failure breakdown reads
(``experiments/failures.py``, ``launch.eval --failures``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax

from agentrl_jax import stats as stats_lib
from agentrl_jax.rollout.rollout import RolloutWorker, decode_text
from agentrl_jax.rollout.trajectory import Trajectory
from agentrl_jax.sampling import SamplingParams


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
      loop_rate: share of counted steps that repeat an earlier step of their episode, the same
        action from the same state (``state_key``; the same action alone where an env keys no
        state): the steps an agent spends going round in circles.
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
    loop_rate: float = float("nan")

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
        loops = sum(_repeated_steps(t) for t in counted)
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
            loop_rate=loops / steps if steps else nan,
        )


def _repeated_steps(traj: Trajectory) -> int:
    """Steps of ``traj`` whose (state, action) an earlier step of it already took."""
    seen: set[tuple[int, tuple[int, ...]]] = set()
    repeats = 0
    for step in traj.steps:
        key = (step.state_key, tuple(step.action_ids))
        repeats += key in seen
        seen.add(key)
    return repeats


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
    episodes: every episode played, in task order, when asked for (``keep_episodes``); not part
      of the JSON.
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
    episodes: tuple[Trajectory, ...] = ()

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
    keep_episodes: bool = False,
    progress: Callable[[int], object] | None = None,
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
      keep_episodes: keep every played episode in the result (``EvalResult.episodes``).
      progress: called with the number of episodes that just ended (a progress bar's update).

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
        trajs += worker.run(chunk, rng, sampling=sampling, task_offset=start, progress=progress)
    result = summarize(
        trajs,
        greedy=greedy,
        num_tasks=len(tasks),
        decoding="constrained" if worker.config.constrain_actions else "free",
        temperature=(sampling or SamplingParams()).temperature,
        seed=seed,
    )
    texts = tuple(transcript(t, worker.tokenizer) for t in trajs[:transcripts])
    kept = tuple(trajs) if keep_episodes else ()
    return dataclasses.replace(result, transcripts=texts, episodes=kept)


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


def _json_stats(s: Stats) -> dict[str, Any]:
    # JSON has no NaN: an empty set's rates are null.
    low, high = s.interval
    out = {**vars(s), "success_low": low, "success_high": high}
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in out.items()}


__all__ = [
    "DECODING_MODES",
    "EvalResult",
    "Stats",
    "evaluate",
    "paired_gain",
    "summarize",
    "task_type",
    "transcript",
]
