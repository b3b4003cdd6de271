"""Why a policy loses: every lost episode of an evaluation in one failure category.

    result = evaluate(worker, tasks, rng, keep_episodes=True)        # run/evaluation.py
    records = episode_records(result.episodes, worker.tokenizer, max_turns=6)
    breakdown = failure_breakdown(records, cap=6)   # walkthroughs: the env family's hook
    print(breakdown.markdown())
    start = sft_start(breakdown, [after_sft])       # which of them SFT had already lost

``python -m launch.eval --workdir=W --split=valid --failures`` plays a run's policy and writes
this beside the reports (``eval/<name>_failures.{md,json}``; docs/evaluation.md).

What an episode record holds (:class:`EpisodeRecord`, from a ``Trajectory``): the commands as
the env read them, the state each was played from (``state_key``), whether the env rejected it,
the room the player was in after it and the expert's plan length left after it (TextWorld's
``room`` and ``expert_steps`` step info; ``None`` where an env reports none), and how the episode
ended: ``won``; ``lost`` (the env ended it without a win: TextWorld's defeat, such as eating the
wrong thing); ``step_cap`` (cut by the rollout's ``max_turns`` or the env's own step limit);
``context`` (cut before the step cap because the next turn no longer fit ``max_seq_len``: an
episode cut with fewer than ``max_turns`` steps and no env step limit reached). The env's
walkthrough (``registry`` hook ``walkthrough``: its winning commands, the rooms they pass
through, the game's entities) is the reference for rooms and objects.

Categories of a lost episode, the first that applies (the precedence: what the game and the cap
decide first, then how the episode ended, then where its steps went, most specific first):

1. ``unwinnable``: the walkthrough is longer than the step cap (``min(rollout.max_turns, env
   max_steps)``): no policy wins this game at this cap.
2. ``lost``: the env ended the episode in defeat.
3. ``context``: the context filled before the step cap.
4. ``loop``: the episode went round in a circle, back to a state it had left (``state_key``,
   which TextWorld keys by the world's facts and the quests done, so no score was gained in
   between), or at least ``min_repeats`` (2) steps repeat an earlier step of the episode, the
   same command from the same state (the report's ``loop steps``).
5. ``wrong_room``: the player entered a room the walkthrough never passes through.
6. ``wrong_object``: a command named a thing of the game that no walkthrough command names.
7. ``invalid``: the env rejected a command (not admissible and nothing changed).
8. ``cap``: out of steps with none of the above: on the walkthrough's rooms and objects,
   without repeats or rejected commands, but too slow.
9. ``other``: an ending the record does not explain.

Without a walkthrough (a family that registers no hook) ``unwinnable``, ``wrong_room`` and
``wrong_object`` cannot apply; without ``room`` info, ``wrong_room`` cannot.

Secondary flags, counted over the lost episodes whatever their category: each of 4-7 above, the
same command played twice or more (from any state), a step-wise context that dropped older turns
(``context_truncated``), and ``progressed``: the expert's plan left after the last command is
shorter than the walkthrough (TextWorld's plan at the start is the walkthrough,
tests/test_failures.py). Each lost episode's row also says when it became hopeless
(``hopeless_after``: the commands played when the expert's own plan first outgrew the steps left
to the cap; 0 for a walkthrough longer than the cap): a ``cap`` episode that became hopeless
early wasted its first steps, one that became hopeless only at the cap was still on its way.

Outcomes by walkthrough shape, every episode won or lost: a game's ``shape`` is its
walkthrough's commands' first words joined by " ; " (``take ; eat``, ``go ; take``), and the
breakdown counts the episodes, wins, losses and success rate per task type and shape (no
walkthrough: no shape). Where each lost episode left its walkthrough (:class:`Divergence`): the
first step whose command differs from the walkthrough's at that step, with the verb expected and
the verb played, counted per shape (after ``take``, expected ``eat``, played ``drop``). This reads
the walkthrough as a plan from the start: TextWorld's is the expert's plan from the initial state,
so the first divergence is well defined; the steps after it are not compared (the policy may
still win by another way, or the expert's plan from the new state differs).

:func:`sft_start` pairs the lost episodes with the same games' outcomes after SFT (the run's
``eval/after_sft_*.json``): how many RL's policy lost that SFT's had lost already, and how many
SFT's had won.
"""

from __future__ import annotations

import dataclasses
import glob
import inspect
import json
import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentrl_jax.envs.base import Task, Walkthrough
from agentrl_jax.experiments.sft_start import SftStart
from agentrl_jax.experiments.walkthrough_shapes import (
    Divergence,
    _verb,
    command_verb,
    divergence,
    walkthrough_shape,
)
from agentrl_jax.rollout.rollout import decode_text
from agentrl_jax.rollout.trajectory import Trajectory
from agentrl_jax.run.evaluation import EvalResult, task_type

CATEGORIES = (
    "unwinnable",
    "lost",
    "context",
    "loop",
    "wrong_room",
    "wrong_object",
    "invalid",
    "cap",
    "other",
)
ENDINGS = ("won", "lost", "step_cap", "context", "unknown")
FLAGS = (
    "loop",
    "same_command",
    "wrong_room",
    "wrong_object",
    "invalid",
    "history_cut",
    "progressed",
)
FLAG_TEXT = {
    "loop": "went round in a circle, or repeated a step (same command, same state)",
    "same_command": "played one command twice or more",
    "wrong_room": "entered a room off the walkthrough",
    "wrong_object": "named a thing off the walkthrough",
    "invalid": "had a command rejected",
    "history_cut": "step-wise context dropped older turns",
    "progressed": "ended nearer the goal than it started",
}


@dataclasses.dataclass(frozen=True)
class EpisodeRecord:
    """One played episode, as the failure breakdown reads it (see the module docstring).

    Attributes:
      task: the episode's task.
      task_type: its report category (``run/evaluation.task_type``).
      commands: the commands, as the env read them.
      states: the state each command was played from (``state_key``).
      final_state: the state the last command led to (None: unknown, or no command).
      invalid: per command, whether the env rejected it.
      rooms: per command, the player's room after it ("" where the env reports none).
      plan_left: per command, the expert's plan length after it (None where not reported).
      ending: ``won``, ``lost``, ``step_cap``, ``context`` or ``unknown``.
      history_cut: a step-wise context dropped older turns to fit.
      score: the env's score after the last command (None: not reported or no command).
    """

    task: Task
    task_type: str
    commands: tuple[str, ...]
    states: tuple[int, ...]
    invalid: tuple[bool, ...]
    rooms: tuple[str, ...]
    plan_left: tuple[int | None, ...]
    ending: str
    final_state: int | None = None
    history_cut: bool = False
    score: int | None = None

    def __post_init__(self):
        n = len(self.commands)
        for name in ("states", "invalid", "rooms", "plan_left"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"EpisodeRecord.{name}: {len(getattr(self, name))} for {n} steps")
        if self.ending not in ENDINGS:
            raise ValueError(f"EpisodeRecord.ending={self.ending!r}: expected one of {ENDINGS}")

    @property
    def won(self) -> bool:
        return self.ending == "won"

    @classmethod
    def of(cls, traj: Trajectory, tokenizer, *, max_turns: int) -> EpisodeRecord:
        """The record of a played (not infrastructure-failed) episode; ``max_turns`` is the
        rollout's, which tells a cut at the step cap from one by the context."""
        if traj.infra_failure:
            raise ValueError(f"{traj.task.name}: an infrastructure failure has no record")
        steps = traj.steps
        last = steps[-1] if steps else None
        if traj.won:
            ending = "won"
        elif last is not None and (last.info.get("lost") or (last.done and not traj.truncated)):
            ending = "lost"
        elif traj.truncated and ((last is not None and last.done) or len(steps) >= max_turns):
            ending = "step_cap"  # the env's step limit ends a step; max_turns leaves it open
        elif traj.truncated:
            ending = "context"
        else:
            ending = "unknown"
        score = last.info.get("score") if last is not None else None
        final = last.info.get("state_key") if last is not None else None
        return cls(
            task=traj.task,
            task_type=task_type(traj),
            commands=tuple(decode_text(tokenizer, s.action_ids) for s in steps),
            states=tuple(int(s.state_key) for s in steps),
            invalid=tuple(bool(s.info.get("invalid_action", False)) for s in steps),
            rooms=tuple(str(s.info.get("room", "")) for s in steps),
            plan_left=tuple(_int_or_none(s.info.get("expert_steps")) for s in steps),
            ending=ending,
            final_state=_int_or_none(final),
            history_cut=any(s.info.get("context_truncated") for s in steps),
            score=None if score is None else int(score),
        )


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def episode_records(
    trajs: Sequence[Trajectory], tokenizer, *, max_turns: int
) -> list[EpisodeRecord]:
    """The records of the counted episodes (infrastructure failures left out, as every rate)."""
    counted = [t for t in trajs if not t.infra_failure]
    return [EpisodeRecord.of(t, tokenizer, max_turns=max_turns) for t in counted]


@dataclasses.dataclass(frozen=True)
class Failure:
    """A lost episode, classified.

    Attributes:
      record: the episode.
      category: its primary category (``CATEGORIES``).
      flags: which secondary flags it shows (``FLAGS``; all that apply, the primary's included).
      walkthrough: the walkthrough's commands (empty: none known).
      repeats: steps that repeat an earlier step's command from the same state.
      circles: times the episode came back to a state it had left.
      most_played: the command played most often, and how often.
      wrong_rooms: rooms entered that the walkthrough never passes through, in order.
      wrong_objects: things named that no walkthrough command names, in order.
      hopeless_after: commands played when the expert's plan first outgrew the steps left (0:
        from the start; None: never, or not known).
      episode: the record's place among its game's episodes (0: the first), for pairing.
      shape: the walkthrough's shape (:func:`walkthrough_shape`; "": no walkthrough).
      divergence: where the episode left the walkthrough (None: it never did, or none known).
    """

    record: EpisodeRecord
    category: str
    flags: frozenset[str]
    walkthrough: tuple[str, ...]
    repeats: int
    circles: int
    most_played: tuple[str, int]
    wrong_rooms: tuple[str, ...]
    wrong_objects: tuple[str, ...]
    hopeless_after: int | None
    episode: int = 0
    shape: str = ""
    divergence: Divergence | None = None

    def to_json(self) -> dict[str, Any]:
        r = self.record
        return {
            "split": r.task.split,
            "task": r.task.id,
            "task_type": r.task_type,
            "category": self.category,
            "flags": sorted(self.flags),
            "ending": r.ending,
            "steps": len(r.commands),
            "walkthrough_steps": len(self.walkthrough) if self.walkthrough else None,
            "plan_left": r.plan_left[-1] if r.plan_left else None,
            "hopeless_after": self.hopeless_after,
            "repeats": self.repeats,
            "circles": self.circles,
            "most_played": list(self.most_played),
            "wrong_rooms": list(self.wrong_rooms),
            "wrong_objects": list(self.wrong_objects),
            "invalid": sum(r.invalid),
            "score": r.score,
            "commands": list(r.commands),
            "walkthrough": list(self.walkthrough),
            "episode": self.episode,
            "shape": self.shape or None,
            "divergence": self.divergence.to_json() if self.divergence else None,
        }


def classify(
    record: EpisodeRecord,
    walkthrough: Walkthrough | None,
    *,
    cap: int,
    min_repeats: int = 2,
    episode: int = 0,
) -> Failure:
    """A lost episode's primary category and flags (the module docstring's precedence).

    Args:
      record: the episode (not won).
      walkthrough: the task's walkthrough (None: the env family gives none).
      cap: the step cap the episode was played under (``min(rollout.max_turns, env max_steps)``).
      min_repeats: repeated steps (same command, same state) that make a ``loop``.
      episode: the record's place among its game's episodes.
    """
    if record.won:
        raise ValueError(f"{record.task.name}: a won episode is no failure")
    if cap < 1:
        raise ValueError(f"cap={cap}: expected the step cap, >= 1")
    seen: set[tuple[int, str]] = set()
    repeats = 0
    for state, command in zip(record.states, record.commands):
        repeats += (state, command) in seen
        seen.add((state, command))
    path = [*record.states, *([] if record.final_state is None else [record.final_state])]
    circles = sum(path[i] != path[i - 1] and path[i] in path[: i - 1] for i in range(1, len(path)))
    played = Counter(record.commands).most_common(1)
    most_played = played[0] if played else ("", 0)
    wrong_rooms: list[str] = []
    wrong_objects: list[str] = []
    if walkthrough is not None:
        if walkthrough.rooms:
            for room in record.rooms:
                if room and room not in walkthrough.rooms and room not in wrong_rooms:
                    wrong_rooms.append(room)
        objects = walkthrough.objects
        for command in record.commands:
            for name in walkthrough.named(command):
                if name not in objects and name not in wrong_objects:
                    wrong_objects.append(name)
    hopeless_after = _hopeless_after(record, walkthrough, cap)
    unwinnable = walkthrough is not None and len(walkthrough.commands) > cap
    flags = {
        "loop": circles > 0 or repeats >= min_repeats,
        "same_command": most_played[1] >= 2,
        "wrong_room": bool(wrong_rooms),
        "wrong_object": bool(wrong_objects),
        "invalid": any(record.invalid),
        "history_cut": record.history_cut,
        "progressed": _progressed(record, walkthrough),
    }
    if unwinnable:
        category = "unwinnable"
    elif record.ending == "lost":
        category = "lost"
    elif record.ending == "context":
        category = "context"
    elif record.ending == "step_cap":
        category = next(
            (c for c in ("loop", "wrong_room", "wrong_object", "invalid") if flags[c]), "cap"
        )
    else:
        category = "other"
    return Failure(
        record=record,
        category=category,
        flags=frozenset(f for f, on in flags.items() if on),
        walkthrough=tuple(walkthrough.commands) if walkthrough is not None else (),
        repeats=repeats,
        circles=circles,
        most_played=most_played,
        wrong_rooms=tuple(wrong_rooms),
        wrong_objects=tuple(wrong_objects),
        hopeless_after=hopeless_after,
        episode=episode,
        shape=walkthrough_shape(walkthrough),
        divergence=divergence(record.commands, walkthrough),
    )


def _progressed(record: EpisodeRecord, walkthrough: Walkthrough | None) -> bool:
    """The expert's plan left after the last command is shorter than the walkthrough."""
    if walkthrough is None or not record.plan_left or record.plan_left[-1] is None:
        return False
    return record.plan_left[-1] < len(walkthrough.commands)


def _hopeless_after(record: EpisodeRecord, walkthrough: Walkthrough | None, cap: int) -> int | None:
    """Commands played when the expert's plan left first exceeded the steps left to the cap."""
    if walkthrough is not None and len(walkthrough.commands) > cap:
        return 0
    for played, left in enumerate(record.plan_left, start=1):
        if left is not None and left > cap - played:
            return played
    return None


@dataclasses.dataclass(frozen=True)
class Breakdown:
    """The lost episodes of an evaluation, classified, and every episode's walkthrough shape.

    Attributes:
      episodes: counted episodes per task type (won or lost).
      failures: the lost ones, classified, in play order.
      cap: the step cap they were played under.
      protocol: how they were played (``EvalResult.protocol``), when known.
      shapes: every counted episode (won or lost), in play order: its task type, its
        walkthrough's shape (:func:`walkthrough_shape`; "": no walkthrough) and whether it won.
    """

    episodes: dict[str, int]
    failures: tuple[Failure, ...]
    cap: int
    protocol: str = ""
    shapes: tuple[tuple[str, str, bool], ...] = ()

    @property
    def types(self) -> list[str]:
        return sorted(self.episodes)

    def counts(self) -> dict[str, dict[str, int]]:
        """Lost episodes per task type (and ``all``) and category, every category listed."""
        out = {t: dict.fromkeys(CATEGORIES, 0) for t in [*self.types, "all"]}
        for f in self.failures:
            out[f.record.task_type][f.category] += 1
            out["all"][f.category] += 1
        return out

    def flag_counts(self) -> dict[str, dict[str, int]]:
        """Lost episodes showing each secondary flag, per task type (and ``all``)."""
        out = {t: dict.fromkeys(FLAGS, 0) for t in [*self.types, "all"]}
        for f in self.failures:
            for flag in f.flags:
                out[f.record.task_type][flag] += 1
                out["all"][flag] += 1
        return out

    def lost(self) -> dict[str, int]:
        """Lost episodes per task type (and ``all``)."""
        out = dict.fromkeys([*self.types, "all"], 0)
        for f in self.failures:
            out[f.record.task_type] += 1
            out["all"] += 1
        return out

    def shape_outcomes(self) -> dict[str, list[dict[str, Any]]]:
        """Per task type, one row per walkthrough shape: ``shape``, ``episodes``, ``wins``,
        ``losses``, ``success_rate``; the most played shape first (ties by name). Episodes
        without a walkthrough are left out, and a type with none of them has no entry."""
        counts: dict[str, dict[str, list[int]]] = {}
        for kind, shape, won in self.shapes:
            if shape:
                games = counts.setdefault(kind, {}).setdefault(shape, [0, 0])
                games[0] += 1
                games[1] += won
        return {
            kind: [
                {
                    "shape": shape,
                    "episodes": n,
                    "wins": wins,
                    "losses": n - wins,
                    "success_rate": wins / n,
                }
                for shape, (n, wins) in sorted(per.items(), key=lambda kv: (-kv[1][0], kv[0]))
            ]
            for kind, per in sorted(counts.items())
        }

    def divergences(self) -> dict[str, list[dict[str, Any]]]:
        """Per task type, the lost episodes counted by shape and by where they left the
        walkthrough: rows of ``shape``, ``step``, ``after`` (the walkthrough's verbs before the
        step, joined by " ; "), ``expected``, ``played``, ``lost``; a shape's lost episodes that
        never left it in one row with ``step``, ``after``, ``expected`` and ``played`` None.
        Shapes in :meth:`shape_outcomes`' order; in a shape, by step (never last), then the
        most lost first."""
        order = {
            (kind, row["shape"]): i
            for kind, rows in self.shape_outcomes().items()
            for i, row in enumerate(rows)
        }
        counts: Counter[tuple[str, str, int | None, str, str]] = Counter()
        for f in self.failures:
            if f.shape:
                d = f.divergence
                key = (d.step, d.expected, d.played) if d else (None, "", "")
                counts[(f.record.task_type, f.shape, *key)] += 1

        def rank(item):
            (kind, shape, step, expected, played), n = item
            return (kind, order[(kind, shape)], step is None, step or 0, -n, expected, played)

        out: dict[str, list[dict[str, Any]]] = {}
        for (kind, shape, step, expected, played), n in sorted(counts.items(), key=rank):
            left = step is not None
            out.setdefault(kind, []).append(
                {
                    "shape": shape,
                    "step": step,
                    "after": " ; ".join(shape.split(" ; ")[:step]) if left else None,
                    "expected": expected if left else None,
                    "played": played if left else None,
                    "lost": n,
                }
            )
        return out

    def to_json(self) -> dict[str, Any]:
        lost = self.lost()
        episodes = {**self.episodes, "all": sum(self.episodes.values())}
        counts, flags = self.counts(), self.flag_counts()
        return {
            "protocol": self.protocol,
            "cap": self.cap,
            "precedence": list(CATEGORIES),
            "per_type": {
                t: {
                    "episodes": episodes[t],
                    "lost": lost[t],
                    "categories": {
                        c: {"count": n, "share_of_lost": _json_share(n, lost[t])}
                        for c, n in counts[t].items()
                    },
                    "flags": flags[t],
                }
                for t in [*self.types, "all"]
            },
            "shapes": self.shape_outcomes(),
            "divergences": self.divergences(),
            "episodes": [f.to_json() for f in self.failures],
        }

    def markdown(self, title: str = "") -> str:
        """The category table (lost episodes and their share, per task type), the flags table,
        the outcomes by walkthrough shape and where the lost episodes left it (where there are
        walkthroughs), and one row per lost episode."""
        types = [*self.types, "all"]
        lost = self.lost()
        episodes = {**self.episodes, "all": sum(self.episodes.values())}
        header = "| category | " + " | ".join(types) + " |"
        rule = "|---|" + "---:|" * len(types)
        lines = [f"# Failures: {title}", ""] if title else []
        if self.protocol:
            lines += [f"{self.protocol}; step cap {self.cap}.", ""]
        lines += [
            "Lost episodes by category (share of the lost), the first that applies in this "
            'order (docs/evaluation.md, "Why episodes are lost"):',
            "",
            header,
            rule,
        ]
        counts = self.counts()
        for c in CATEGORIES:
            cells = [f"{counts[t][c]} ({_pct(_share(counts[t][c], lost[t]))})" for t in types]
            lines.append(f"| {c} | " + " | ".join(cells) + " |")
        cells = [f"{lost[t]} of {episodes[t]}" for t in types]
        lines.append("| **lost** | " + " | ".join(cells) + " |")
        flags = self.flag_counts()
        lines += ["", "Lost episodes that ...", "", header.replace("category", "flag"), rule]
        for flag in FLAGS:
            cells = [f"{flags[t][flag]} ({_pct(_share(flags[t][flag], lost[t]))})" for t in types]
            lines.append(f"| {FLAG_TEXT[flag]} | " + " | ".join(cells) + " |")
        lines += self._shape_lines()
        lines += [
            "",
            "| game | type | category | steps | walkthrough | plan left | hopeless after "
            "| shape | left the walkthrough | commands |",
            "|---|---|---|---:|---:|---:|---:|---|---|---|",
        ]
        for f in self.failures:
            r = f.record
            walk = str(len(f.walkthrough)) if f.walkthrough else "n/a"
            left = r.plan_left[-1] if r.plan_left and r.plan_left[-1] is not None else "n/a"
            hopeless = f.hopeless_after
            if hopeless is None:
                hopeless = "never" if any(p is not None for p in r.plan_left) else "n/a"
            commands = "; ".join(c.replace("|", "/") for c in r.commands)
            d = f.divergence
            if d is not None:
                left_at = f"after {d.step}: {_verb(d.expected)} -> {_verb(d.played)}"
            else:
                left_at = "never" if f.shape else "n/a"
            lines.append(
                f"| {r.task.split}:{r.task.id} | {r.task_type} | {f.category} "
                f"| {len(r.commands)} | {walk} | {left} | {hopeless} | {f.shape or 'n/a'} "
                f"| {left_at} | {commands} |"
            )
        return "\n".join(lines)

    def _shape_lines(self) -> list[str]:
        """The markdown of :meth:`shape_outcomes` and :meth:`divergences` (none without
        walkthroughs)."""
        shapes = self.shape_outcomes()
        if not shapes:
            return []
        lines = [
            "",
            "Episodes (won and lost) by walkthrough shape, its commands' first words (docs/"
            'evaluation.md, "Why episodes are lost"):',
            "",
            "| type | shape | episodes | won | lost | success |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for kind, rows in shapes.items():
            for row in rows:
                lines.append(
                    f"| {kind} | {row['shape']} | {row['episodes']} | {row['wins']} "
                    f"| {row['losses']} | {_pct(row['success_rate'])} |"
                )
        lines += [
            "",
            "Where the lost episodes left the walkthrough: the first command that differs from "
            "the walkthrough's at its step, after the walkthrough's commands before it "
            "(later steps are not compared):",
            "",
            "| type | shape | after | expected | played | lost |",
            "|---|---|---|---|---|---:|",
        ]
        for kind, rows in self.divergences().items():
            for row in rows:
                if row["step"] is None:
                    cells = "never left it | - | -"
                else:
                    after = row["after"] or "(start)"
                    cells = f"{after} | {_verb(row['expected'])} | {_verb(row['played'])}"
                lines.append(f"| {kind} | {row['shape']} | {cells} | {row['lost']} |")
        return lines


def failure_breakdown(
    records: Sequence[EpisodeRecord],
    *,
    cap: int,
    walkthrough: Callable[[Task], Walkthrough | None] | None = None,
    min_repeats: int = 2,
    protocol: str = "",
) -> Breakdown:
    """Classifies the lost episodes of ``records`` (:func:`classify`), and gives every episode,
    won or lost, its walkthrough's shape.

    Args:
      records: the counted episodes of an evaluation (won and lost).
      cap: the step cap they were played under.
      walkthrough: a task's walkthrough (default: its env family's ``walkthrough`` hook; None
        for a family without one); asked once per game.
      min_repeats: repeated steps (same command, same state) that make a ``loop``.
      protocol: how they were played, for the markdown's first line.
    """
    find = walkthrough or family_walkthrough
    known: dict[tuple[str, str, str], Walkthrough | None] = {}
    seen: Counter[tuple[str, str]] = Counter()
    episodes: Counter[str] = Counter()
    failures = []
    shapes = []
    for r in records:
        game = (r.task.split, r.task.id)
        episode = seen[game]
        seen[game] += 1
        episodes[r.task_type] += 1
        key = (r.task.env, *game)
        if key not in known:
            known[key] = find(r.task)
        shapes.append((r.task_type, walkthrough_shape(known[key]), r.won))
        if not r.won:
            failures.append(
                classify(r, known[key], cap=cap, min_repeats=min_repeats, episode=episode)
            )
    return Breakdown(dict(episodes), tuple(failures), cap, protocol, tuple(shapes))


def family_walkthrough(task: Task) -> Walkthrough | None:
    """The task's walkthrough from its env family's ``walkthrough`` hook (None without one)."""
    from agentrl_jax.envs import registry  # noqa: PLC0415

    try:
        hook = registry.family(task.env).hook("walkthrough")
    except ValueError:
        return None
    return hook(task) if hook else None


def sft_start(breakdown: Breakdown, after_sft: Sequence[EvalResult]) -> SftStart:
    """How many lost episodes SFT's policy had lost already, on the same games.

    A lost episode is paired with the after-SFT outcome of its game (split, task id), the i-th
    episode of a game with the i-th (as ``evaluation.paired_gain`` pairs them); a game several
    results hold is read from the first that holds it.
    """
    outcomes: dict[tuple[str, str], list[bool]] = {}
    for result in after_sft:
        games: dict[tuple[str, str], list[bool]] = {}
        for split, task, won in result.outcomes:
            games.setdefault((split, task), []).append(won)
        for game, wins in games.items():
            outcomes.setdefault(game, wins)
    keys = ("lost_after_sft", "won_after_sft", "not_evaluated")
    out = {c: dict.fromkeys(keys, 0) for c in [*CATEGORIES, "all"]}
    for f in breakdown.failures:
        wins = outcomes.get((f.record.task.split, f.record.task.id), [])
        if f.episode >= len(wins):
            key = "not_evaluated"
        else:
            key = "won_after_sft" if wins[f.episode] else "lost_after_sft"
        out[f.category][key] += 1
        out["all"][key] += 1
    return SftStart(out)


def step_cap(config) -> int:
    """The step cap of a run's episodes: ``rollout.max_turns``, or the env's own step limit
    where that is lower (its ``max_steps`` argument: ``env.kwargs``', else its factory's
    default; an env without one has none)."""
    from agentrl_jax.envs import registry  # noqa: PLC0415

    kwargs = dict(config.env.kwargs)
    limit = kwargs.get("max_steps")
    if limit is None:
        factory = registry.load_factory(config.env.name)
        param = inspect.signature(factory).parameters.get("max_steps")
        if param is not None and isinstance(param.default, int):
            limit = param.default
    turns = config.rollout.max_turns
    return turns if limit is None else min(turns, int(limit))


def after_sft_results(eval_dir: str | os.PathLike) -> list[EvalResult]:
    """The evaluations ``launch.train`` wrote after SFT (``eval/after_sft_<level>.json``), in
    name order; none when the run has none."""
    results = []
    for path in sorted(glob.glob(os.path.join(eval_dir, "after_sft_*.json"))):
        with open(path) as f:
            data = json.load(f)
        if isinstance(data, dict) and "overall" in data and "outcomes" in data:
            results.append(EvalResult.from_json(data))
    return results


def write_failures(
    results: Mapping[str, EvalResult],
    tokenizer,
    *,
    cap: int,
    max_turns: int,
    out_dir: str | os.PathLike,
    name: str,
    after_sft: Sequence[EvalResult] = (),
) -> tuple[str, str]:
    """The breakdown of every level's episodes (each result with its ``episodes``, from
    ``evaluate(..., keep_episodes=True)``): the lost ones classified, all of them (won or lost)
    by walkthrough shape, with the SFT start when ``after_sft`` holds results of the same games
    (those of other games are left out): ``<out_dir>/<name>_failures.json`` and ``.md``;
    returns their paths."""
    # Two levels of the same games share one result (evaluate_sets plays it once): count it once.
    unique = list({id(r): r for r in results.values()}.values())
    if any(r.overall.episodes and not r.episodes for r in unique):
        raise ValueError(
            "write_failures: a result without its episodes; evaluate with keep_episodes"
        )
    records = [
        rec for r in unique for rec in episode_records(r.episodes, tokenizer, max_turns=max_turns)
    ]
    protocol = "; ".join(dict.fromkeys(r.protocol for r in unique))
    breakdown = failure_breakdown(records, cap=cap, protocol=protocol)
    games = {(r.task.split, r.task.id) for r in records}
    after_sft = [r for r in after_sft if games & {(s, t) for s, t, _ in r.outcomes}]
    start = sft_start(breakdown, after_sft) if after_sft else None
    os.makedirs(out_dir, exist_ok=True)
    json_path = os.path.join(out_dir, f"{name}_failures.json")
    md_path = os.path.join(out_dir, f"{name}_failures.md")
    out = {"name": name, **breakdown.to_json()}
    out["sft_start"] = start.to_json() if start else None
    with open(json_path, "w") as f:
        json.dump(out, f, indent=2, allow_nan=False)
        f.write("\n")
    text = breakdown.markdown(title=name)
    if start:
        sft = "; ".join(dict.fromkeys(r.protocol for r in after_sft))
        text += (
            "\n\n## SFT start\n\nThe lost episodes against the same games after SFT "
            f"({sft}):\n\n{start.markdown()}"
        )
    with open(md_path, "w") as f:
        f.write(text + "\n")
    return json_path, md_path


def _json_share(n: int, total: int) -> float | None:
    return n / total if total else None  # JSON has no NaN


def _share(n: int, total: int) -> float:
    return n / total if total else float("nan")


def _pct(x: float) -> str:
    return "n/a" if x != x else f"{100.0 * x:.1f}%"


__all__ = [
    "CATEGORIES",
    "FLAGS",
    "Breakdown",
    "Divergence",
    "EpisodeRecord",
    "Failure",
    "SftStart",
    "classify",
    "command_verb",
    "divergence",
    "episode_records",
    "failure_breakdown",
    "after_sft_results",
    "family_walkthrough",
    "sft_start",
    "step_cap",
    "walkthrough_shape",
    "write_failures",
]
