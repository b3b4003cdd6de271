"""Evaluation: per-task-type success against hand-computed numbers, reports, tables, plots."""

import dataclasses
import json
import math
import os
import pathlib

import jax
import pytest
from multihost_worker import tiny_sampler

from agentrl_jax import stats as stats_lib
from agentrl_jax.envs.actors import StepResult
from agentrl_jax.envs.base import Observation, Task
from agentrl_jax.experiments.evaluate import plot_learning_curve, rl_episode_axis
from agentrl_jax.rollout.rollout import RolloutConfig, RolloutWorker
from agentrl_jax.rollout.trajectory import Step, Trajectory
from agentrl_jax.run.eval_report import (
    before_after_rows,
    before_after_table,
    markdown_table,
    write_report,
)
from agentrl_jax.run.evaluation import (
    EvalResult,
    evaluate,
    paired_gain,
    summarize,
    task_type,
    transcript,
)
from agentrl_jax.run.tensorboard import SummaryWriter, read_scalars

ALF_ID = "pick_two_obj_and_place-Pen-None-Desk-310/trial_T20190908_174617_548640"


def _task(name, env="scripted", **params):
    return Task(env, "valid", name, tuple(sorted(params.items())))


# outcome: win / lose after `length` steps, or never (max_turns ends it); crash at step `crash`
# (0: at reset).
TASKS = [
    _task("simple/0", spec="simple", outcome="win", length=2),
    _task("simple/1", spec="simple", outcome="lose", length=3),
    _task("medium/0", spec="medium", outcome="win", length=1),
    _task("medium/1", spec="medium", outcome="win", length=2, crash=0),
    _task("medium/2", spec="medium", outcome="win", length=3, crash=2),
    _task(ALF_ID, env="alfworld", outcome="win", length=1),
    _task("simple/2", spec="simple", outcome="never", length=99),
]


class OutcomePool:
    """An in-process stand-in for ActorPool whose episodes end as their task says, whatever the
    policy does. Every odd-numbered step is flagged invalid; the first step pays 0.25 unless it
    ends the episode; a win pays 1."""

    capacity = 2

    def __init__(self):
        self.reset_sizes = []
        self.resets = []

    def _obs(self):
        return Observation(objective="win", text="a room", admissible_commands=("look",))

    def reset(self, tasks):
        self.tasks, self.t = list(tasks), [0] * len(tasks)
        self.reset_sizes.append(len(tasks))
        self.resets += [t.id for t in tasks]
        return [
            StepResult(None, done=True, infra_failure=True)
            if t.param("crash") == 0
            else StepResult(self._obs(), info={"state_key": 0})
            for t in tasks
        ]

    def step(self, actions):
        out = []
        for i, a in enumerate(actions):
            if a is None:
                out.append(None)
                continue
            task = self.tasks[i]
            self.t[i] += 1
            t = self.t[i]
            if task.param("crash") == t:
                out.append(StepResult(None, done=True, infra_failure=True))
                continue
            done = task.param("outcome") != "never" and t >= task.param("length")
            won = done and task.param("outcome") == "win"
            reward = (1.0 if won else 0.0) + (0.25 if t == 1 and not done else 0.0)
            info = {"won": won, "state_key": t, "invalid_action": t % 2 == 1}
            out.append(StepResult(self._obs(), reward=reward, done=done, info=info))
        return out


class RecordingSampler:
    """The real sampler, with a record of the sampling parameters each turn asked for."""

    def __init__(self, inner):
        self.inner, self.asked = inner, []
        self.sampling = inner.sampling  # the default, as the real sampler has it

    def start(self, *args, **kwargs):
        return self.inner.start(*args, **kwargs)

    def step_turn(self, cache, feed, max_new, rng, sampling=None, **kwargs):
        self.asked.append(sampling)
        return self.inner.step_turn(cache, feed, max_new, rng, sampling=sampling, **kwargs)


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    sampler, tok, template = tiny_sampler(
        ["a room | look | Goal: win | Commands: look"], tmp_path_factory.mktemp("tok")
    )
    config = RolloutConfig(group_size=2, max_turns=4, max_new_tokens=4, max_seq_len=256)
    return RolloutWorker(OutcomePool(), RecordingSampler(sampler), tok, template, config)


@pytest.fixture(scope="module")
def greedy(worker):
    pool, sampler = worker.pool, worker.sampler
    pool.reset_sizes, pool.resets, sampler.asked = [], [], []
    result = evaluate(worker, TASKS, jax.random.key(0))
    return result, list(pool.reset_sizes), list(pool.resets), list(sampler.asked)


def test_greedy_evaluation_matches_hand_computed_numbers(greedy):
    result, reset_sizes, resets, sampling = greedy
    # Greedy: one episode per task even though the worker samples groups of 2, played in
    # batches no larger than the pool's capacity, every action argmax.
    assert sorted(resets) == sorted(t.id for t in TASKS)
    assert reset_sizes == [2, 2, 2, 1]
    assert sampling and all(s.temperature == 0.0 for s in sampling)
    o = result.overall
    # Counted: simple/0 (won, 2 steps, 1.25), simple/1 (lost, 3, 0.25), medium/0 (won, 1, 1),
    # the ALFWorld task (won, 1, 1), simple/2 (cut at 4 turns, 0.25); medium/1 and medium/2
    # were lost to the pool. Invalid: steps 1 and 3 of each episode -> 1+2+1+1+2 of 11 steps.
    assert (o.episodes, o.wins, o.infra_failures, o.truncated) == (5, 3, 2, 1)
    assert o.success_rate == pytest.approx(3 / 5, abs=1e-12)
    assert o.mean_steps == pytest.approx(11 / 5, abs=1e-12)
    assert o.mean_return == pytest.approx(3.75 / 5, abs=1e-12)
    assert o.invalid_action_rate == pytest.approx(7 / 11, abs=1e-12)
    assert list(result.per_type) == ["medium", "pick_two_obj_and_place", "simple"]
    simple, medium = result.per_type["simple"], result.per_type["medium"]
    assert (simple.episodes, simple.wins, simple.truncated) == (3, 1, 1)
    assert simple.mean_steps == pytest.approx(3.0, abs=1e-12)
    assert simple.mean_return == pytest.approx(1.75 / 3, abs=1e-12)
    assert (medium.episodes, medium.wins, medium.infra_failures) == (1, 1, 2)
    assert result.per_type["pick_two_obj_and_place"].success_rate == 1.0
    assert result.greedy and result.num_tasks == 7


def test_sampled_evaluation_plays_the_group(worker):
    worker.pool.reset_sizes = []
    result = evaluate(worker, TASKS, jax.random.key(1), greedy=False)
    assert result.overall.episodes == 10 and result.overall.infra_failures == 4
    assert result.overall.wins == 6 and not result.greedy
    assert worker.pool.reset_sizes == [2] * 7  # one task (a group of 2) per call at capacity 2


def test_task_type_prefers_the_envs_report():
    step = Step([1], [2], [0.0], info={"task_type": "pick_heat_then_place_in_recep"})
    traj = Trajectory(_task(ALF_ID, env="alfworld"), 0, steps=[step])
    assert task_type(traj) == "pick_heat_then_place_in_recep"
    assert task_type(Trajectory(_task(ALF_ID, env="alfworld"), 0)) == "pick_two_obj_and_place"
    # TextWorld tasks as games.make_tasks names them: presets by level, other specs by name.
    tw = Task("textworld", "valid", "custom-r2-o3-q2/4", (("spec", "custom-r2-o3-q2"),))
    assert task_type(Trajectory(tw, 0)) == "simple"
    tw = Task("textworld", "valid", "custom-r6-o10-q5/0", (("spec", "custom-r6-o10-q5"),))
    assert task_type(Trajectory(tw, 0)) == "custom-r6-o10-q5"
    assert task_type(Trajectory(_task("swe/x", task_type="bugfix"), 0)) == "bugfix"
    assert task_type(Trajectory(Task("swe", "test", "django/1"), 0)) == "django"


def _result(wins, episodes, spec="simple"):
    trajs = [
        Trajectory(
            _task(f"{spec}/{i}", spec=spec), i, steps=[Step([1], [2], [0.0], 1.0)], won=i < wins
        )  # fmt: skip
        for i in range(episodes)
    ]
    return summarize(trajs, greedy=True, num_tasks=episodes)


def _played(split, task_id, won, group=0):
    step = Step([1], [2], [0.0], float(won))
    return Trajectory(Task("scripted", split, task_id), group, steps=[step], won=won)


def test_loop_rate_counts_steps_that_repeat_a_state_and_action():
    """``go to drawer 1, open, close`` twice over from the same state: the second round's three
    steps are loop steps; the same action from another state is not."""

    def episode(*pairs):
        steps = [Step([1], list(action), [0.0], state_key=key) for key, action in pairs]
        return Trajectory(_task("g/0"), 0, steps=steps)

    go, open_, close, other = (5,), (6,), (7,), (8,)
    looping = episode((1, go), (2, open_), (3, close), (1, go), (2, open_), (3, close), (1, other))
    fresh = episode((1, go), (2, go), (3, go))  # the same command from three states
    result = summarize([looping, fresh], greedy=True, num_tasks=2)
    assert result.overall.loop_rate == pytest.approx(3 / 10)
    assert EvalResult.from_json(json.loads(json.dumps(result.to_json()))) == result
    assert "| loop steps |" in markdown_table(result) and "| 30.0% |" in markdown_table(result)


def test_outcomes_are_keyed_by_split_and_task_id():
    """Two splits may name a game alike (``g0`` of valid and of test): a result keeps each
    outcome's split, and two results pair the same game of the same split."""
    before = summarize(
        [_played("valid", "g0", True), _played("test", "g0", False)], greedy=True, num_tasks=2
    )
    after = summarize(
        [_played("test", "g0", False), _played("valid", "g0", True)], greedy=True, num_tasks=2
    )
    assert before.outcomes == (("valid", "g0", True), ("test", "g0", False))
    gain = paired_gain(before, after)  # valid won both times, test lost both times
    assert (gain.n, gain.both, gain.neither, gain.only_after, gain.only_before) == (2, 1, 1, 0, 0)
    data = json.loads(json.dumps(before.to_json()))
    assert data["outcomes"] == [["valid", "g0", 1], ["test", "g0", 0]]
    assert EvalResult.from_json(data) == before
    # A report written before the split was kept ([task id, won]) reads with its own split.
    old = {**data, "split": "test", "outcomes": [["g0", 0]]}
    assert EvalResult.from_json(old).outcomes == (("test", "g0", False),)


def test_sampled_evaluation_intervals_are_clustered_by_game():
    """Several sampled episodes of one game are not independent: the interval is Wilson's at
    the effective number of episodes (``stats.clustered_wilson_interval`` over the games), and
    a greedy result (one episode per game) keeps the plain Wilson interval."""
    # 4 games x 3 episodes; game a won in all, b in two, c in one, d in none.
    wins = {"a": 3, "b": 2, "c": 1, "d": 0}
    trajs = [
        _played("test", game, k < w, group=i)
        for i, (game, w) in enumerate(wins.items())
        for k in range(3)
    ]
    result = summarize(trajs, greedy=False, num_tasks=4, temperature=1.0)
    o = result.overall
    assert (o.episodes, o.wins, o.games) == (12, 6, 4)
    want = stats_lib.clustered_wilson_interval([3, 2, 1, 0], [3, 3, 3, 3])
    assert o.interval == pytest.approx(want, abs=1e-12)
    naive = stats_lib.wilson_interval(6, 12)
    assert o.interval[0] < naive[0] and o.interval[1] > naive[1]
    assert o.design_effect == pytest.approx(stats_lib.design_effect([3, 2, 1, 0], [3] * 4))
    # The report, its JSON and the before/after rows carry the clustered interval.
    data = json.loads(json.dumps(result.to_json()))
    assert (data["overall"]["success_low"], data["overall"]["success_high"]) == pytest.approx(want)
    assert EvalResult.from_json(data) == result
    md = markdown_table(result)
    assert f"| **all** | 12 | 50.0% | {stats_lib.fmt_interval(*want)} |" in md
    assert "95% Wilson intervals, clustered by game (12 episodes of 4 games)" in md
    row = before_after_rows([("test", result, result)])[0]
    assert (row["after_rl"]["low"], row["after_rl"]["high"]) == pytest.approx(want)
    # Greedy: one episode per game, exactly the Wilson interval of the episodes.
    greedy = _result(31, 50)
    assert greedy.overall.interval == stats_lib.wilson_interval(31, 50)
    assert greedy.overall.design_effect == 1.0 and greedy.overall.games == 50


def test_reports_json_and_markdown(tmp_path, greedy):
    result = greedy[0]
    json_path, md_path = write_report(result, tmp_path / "eval", "valid_simple")
    data = json.loads(pathlib.Path(json_path).read_text())
    assert data["name"] == "valid_simple" and data["num_tasks"] == 7
    assert data["overall"]["success_rate"] == pytest.approx(0.6)
    assert data["per_type"]["medium"]["infra_failures"] == 2
    md = pathlib.Path(md_path).read_text()
    assert md.startswith("# Evaluation: valid_simple\n")
    # Loop steps 0.0%: every step of the pool's episodes comes from a state of its own.
    assert "| simple | 3 | 33.3% | [6.1, 79.2] | 3.00 | 0.583 | 55.6% | 0.0% | 0 |" in md
    assert "| **all** | 5 | 60.0% | [23.1, 88.2] | 2.20 | 0.750 | 63.6% | 0.0% | 2 |" in md
    # How it was measured: split, games, decoding, temperature, seed; and each interval.
    assert "7 valid games, free decoding, greedy; 95% Wilson intervals." in md
    assert (data["split"], data["decoding"], data["temperature"], data["seed"]) == (
        "valid",
        "free",
        0.0,
        None,
    )
    assert data["overall"]["success_low"] == pytest.approx(0.230724, abs=1e-6)
    assert [(split, t) for split, t, _ in data["outcomes"]] == [
        (split, t) for split, t, w in result.outcomes
    ]  # the 5 counted episodes, in play order
    assert EvalResult.from_json(data) == result
    # An empty set has no rates: null in JSON, n/a in the table (never a fake 0%).
    empty = summarize([Trajectory(_task("x/0"), 0, infra_failure=True)], greedy=True, num_tasks=1)
    assert math.isnan(empty.success_rate)
    write_report(empty, tmp_path, "empty")
    assert json.loads((tmp_path / "empty.json").read_text())["overall"]["success_rate"] is None
    assert "| **all** | 0 | n/a | n/a | n/a | n/a | n/a | n/a | 1 |" in markdown_table(empty)
    with pytest.raises(ValueError, match="plain file stem"):
        write_report(result, tmp_path, "a/b")


def test_transcripts_show_what_the_agent_read_and_wrote(tmp_path, worker):
    result = evaluate(worker, TASKS, jax.random.key(0), transcripts=2)
    assert len(result.transcripts) == 2
    first, second = result.transcripts
    # simple/0: won at step 2; step 1 (odd) is flagged invalid and pays 0.25 without ending it.
    assert first.startswith("### valid:simple/0: won, 2 steps, return 1.25\n")
    assert "action 0 (reward 0.25, invalid):" in first and "action 1 (reward 1):" in first
    assert first.count("a room") == 3  # two observations and the one after the last action
    assert second.startswith("### valid:simple/1: lost, 3 steps, return 0.25\n")
    _, md_path = write_report(result, tmp_path, "valid_simple")
    text = (tmp_path / "valid_simple_transcripts.md").read_text()
    assert text.startswith("# Transcripts: valid_simple\n\nThe first 2 episodes (7 valid games")
    assert first in text and second in text
    assert EvalResult.from_json(json.loads(pathlib.Path(md_path[:-3] + ".json").read_text())) == (
        dataclasses.replace(result, transcripts=())
    )  # the report's JSON holds no transcript
    assert evaluate(worker, TASKS[:1], jax.random.key(0)).transcripts == ()  # off by default


def test_a_transcript_keeps_what_the_model_wrote_verbatim():
    class Tok:
        def decode(self, ids, skip_special_tokens):
            return {1: "header", 2: "obs", 3: "say ```x``` then\nmore", 4: "end"}[ids[0]]

    step = Step([2], [3], [0.0], obs_ids=[2])
    traj = Trajectory(_task("simple/9"), 0, steps=[step], truncated=True, header_ids=[1],
                      final_obs_ids=[4])  # fmt: skip
    text = transcript(traj, Tok())
    assert text.startswith("### valid:simple/9: truncated, 1 steps, return 0\n")
    assert "context header:\n```\nheader\n```" in text
    # A fence longer than any the text holds, so the action reads as written.
    assert "action 0:\n````\nsay ```x``` then\nmore\n````" in text
    assert text.endswith("final observation:\n```\nend\n```\n")


def test_before_after_table():
    table = before_after_table(
        [
            ("simple (training complexity)", _result(31, 50), _result(45, 50)),
            ("medium (next harder)", _result(10, 50, "medium"), _result(8, 40, "medium")),
        ]
    )
    assert table.splitlines() == [
        "| held-out set | episodes | after SFT | 95% CI | after RL | 95% CI | RL gain "
        "| 95% CI (paired) | infra failures |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        # Paired on the same 50 games: 31 won by both, 14 only after RL, 5 by neither.
        "| simple (training complexity) | 50 | 62.0% | [48.2, 74.1] | 90.0% | [78.6, 95.7] "
        "| +28.0 pts | [14.7, 41.0] | 0 / 0 |",
        # RL's result counted 40 of the games: the gain is on those 40 (8 vs 10 wins).
        "| medium (next harder) | 50 / 40 | 20.0% | [11.2, 33.0] | 20.0% | [10.5, 34.8] "
        "| -5.0 pts | [-14.6, 4.0] | 0 / 0 |",
        "",
        "40 valid games, greedy; 50 valid games, greedy. 95% Wilson intervals; the gain's "
        "interval is Newcombe's for paired outcomes on the same games.",
    ]
    rows = before_after_rows([("simple", _result(31, 50), _result(45, 50))])
    assert rows[0]["after_sft"] == {
        "wins": 31,
        "n": 50,
        "rate": 0.62,
        "low": pytest.approx(0.481504, abs=1e-6),
        "high": pytest.approx(0.741372, abs=1e-6),
    }
    gain = rows[0]["gain"]
    assert (gain["n"], gain["both"], gain["only_after"], gain["only_before"]) == (50, 31, 14, 0)
    assert gain["diff"] == pytest.approx(0.28) and gain["low"] == pytest.approx(0.146624, abs=1e-6)
    # Reports written before outcomes were kept: the difference, without an interval.
    old = [dataclasses.replace(r, outcomes=()) for r in (_result(31, 50), _result(45, 50))]
    assert "| +28.0 pts | n/a | 0 / 0 |" in before_after_table([("simple", *old)])
    with pytest.raises(ValueError, match="no rows"):
        before_after_table([])


def test_learning_curve_png(tmp_path):
    logdir = str(tmp_path / "tb")
    writer = SummaryWriter(logdir)
    for step in range(20):
        writer.scalars(
            {"rollout/success_rate": min(1.0, step / 15), "rollout/return": step / 10}, step
        )
    writer.close()
    out = tmp_path / "plots" / "curve.png"
    assert plot_learning_curve(logdir, out) == ["rollout/success_rate", "rollout/return"]
    png = out.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert (width, height) == (700, 560)  # figsize (7, 2.5 * 2 + 0.6) inches at 100 dpi
    assert os.path.getsize(out) > 5000  # drawn lines and text, not a blank canvas
    assert plot_learning_curve(logdir, out, tags=["rollout/return"]) == ["rollout/return"]
    with pytest.raises(ValueError, match=r"no scalar \['eval/x'\]; its tags: \['rollout/return'"):
        plot_learning_curve(logdir, out, tags=["eval/x"])
    with pytest.raises(FileNotFoundError):
        plot_learning_curve(tmp_path / "nope", out)


def test_learning_curve_phases_get_their_own_axes(tmp_path, monkeypatch):
    # A run as the trainer logs it: 250 SFT steps, the after-SFT evaluation at step 0, then 3
    # RL iterations of 64 episodes at steps 1..3, evaluated after the last.
    logdir = str(tmp_path / "tb")
    writer = SummaryWriter(logdir)
    for step in range(1, 251):
        writer.scalars({"sft/nll": 2.0 / step}, step)
    writer.scalars({"eval/success_rate": 0.5}, 0)
    for it in (1, 2, 3):
        writer.scalars({"rollout/success_rate": 0.5 + it / 10, "rollout/episodes": 64.0}, it)
    writer.scalars({"eval/success_rate": 0.8}, 3)
    writer.close()
    scalars = read_scalars(logdir)
    to_episodes, label = rl_episode_axis(scalars)
    assert label == "RL episodes" and [to_episodes(s) for s in (0, 1, 2, 3)] == [0, 64, 128, 192]
    assert rl_episode_axis({})[1] == "RL iteration"

    import matplotlib.axes  # noqa: PLC0415

    drawn = []
    real_plot = matplotlib.axes.Axes.plot

    def plot(ax, xs, ys, *args, **kwargs):
        drawn.append((list(xs), list(ys)))
        return real_plot(ax, xs, ys, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", plot)
    out = tmp_path / "curve.png"
    tags = ["rollout/success_rate", "eval/success_rate", "sft/nll"]
    assert plot_learning_curve(logdir, out, tags=tags) == [
        "sft/nll",  # SFT first, against its steps
        "rollout/success_rate",
        "eval/success_rate",
    ]
    assert drawn[0][0] == list(range(1, 251))
    assert drawn[1] == ([64, 128, 192], [pytest.approx(v) for v in (0.6, 0.7, 0.8)])
    assert drawn[2] == ([0, 192], [0.5, pytest.approx(0.8)])  # evaluations at 0 and 192
