"""The failure breakdown: each lost episode in one category by the documented precedence, the
secondary flags, the tables, the SFT start; records of real TextWorld rollouts and the game's
walkthrough as the env plays it. The launcher's ``--failures``: tests/test_train.py."""

import dataclasses
import json
import pathlib

import jax
import pytest
from flax import nnx

from agentrl_jax.envs.base import Task, Walkthrough
from agentrl_jax.experiments import failures
from agentrl_jax.experiments.failures import EpisodeRecord, classify
from agentrl_jax.models import CausalLM, preset
from agentrl_jax.models.tokenizer import build_tokenizer
from agentrl_jax.rollout.chat import get_template
from agentrl_jax.rollout.rollout import RolloutConfig, RolloutWorker
from agentrl_jax.rollout.trajectory import Step, Trajectory
from agentrl_jax.run.evaluation import EvalResult, Stats
from agentrl_jax.sampling import Sampler, SamplingParams, StopConfig

# A two-room game: take the key in the attic, unlock the red chest with it.
WALK = Walkthrough(
    commands=("go north", "take key from table", "unlock red chest with key"),
    rooms=("kitchen", "attic"),
    entities=("apple", "chest", "key", "red chest", "red key", "table"),
)


def _record(
    commands,
    *,
    ending="step_cap",
    states=None,
    invalid=None,
    rooms=None,
    plan=None,
    task_id="simple/0",
    kind="simple",
    history_cut=False,
    final_state=None,
    env="textworld",
):
    n = len(commands)
    return EpisodeRecord(
        task=Task(env, "valid", task_id),
        task_type=kind,
        commands=tuple(commands),
        states=tuple(range(n) if states is None else states),
        invalid=tuple([False] * n if invalid is None else invalid),
        rooms=tuple(["kitchen"] * n if rooms is None else rooms),
        plan_left=tuple([None] * n if plan is None else plan),
        ending=ending,
        final_state=final_state,
        history_cut=history_cut,
    )


# (name, record, cap): each lost episode shows its own category and every one after it in the
# precedence that the record allows, so the expected category is the first.
CASES = {
    # Walkthrough 3 > cap 2, though the env also ended the game in defeat.
    "unwinnable": (_record(["eat apple"], ending="lost"), 2),
    # Defeat beats a loop.
    "lost": (_record(["go north", "go north", "go north"], states=[0, 0, 0], ending="lost"), 6),
    # The context filled, after a wrong room.
    "context": (_record(["go east"], rooms=["cellar"], ending="context"), 6),
    # Two repeats of (state, command), in a room off the walkthrough.
    "loop": (
        _record(
            ["go north", "go east", "go north", "go east"],
            states=[0, 1, 0, 1],
            rooms=["attic", "cellar", "attic", "cellar"],
        ),
        6,
    ),
    # A room off the walkthrough beats an object off it.
    "wrong_room": (_record(["go east", "take apple"], rooms=["cellar", "cellar"]), 6),
    # The apple is off the walkthrough; a rejected command too.
    "wrong_object": (_record(["take apple", "open red chest"], invalid=[False, True]), 6),
    # Rejected once (one repeat is not a loop at min_repeats=2), every name on the walkthrough.
    "invalid": (
        _record(
            ["unlock red chest with table", "unlock red chest with table"],
            states=[0, 0],
            invalid=[True, True],
        ),
        6,
    ),
    # On the walkthrough's rooms and objects, no repeat, nothing rejected: too slow.
    "cap": (
        _record(
            ["go north", "take key from table", "go south"],
            rooms=["attic", "attic", "kitchen"],
            plan=[2, 1, 2],
        ),
        3,
    ),
    "other": (_record(["go north"], rooms=["attic"], ending="unknown"), 6),
}


def test_every_category_is_reached_by_its_own_record():
    assert set(CASES) == set(failures.CATEGORIES)


@pytest.mark.parametrize("category", list(CASES))
def test_a_lost_episode_gets_the_first_category_that_applies(category):
    record, cap = CASES[category]
    assert classify(record, WALK, cap=cap).category == category


def test_without_a_walkthrough_rooms_objects_and_the_cap_cannot_decide():
    assert classify(CASES["unwinnable"][0], None, cap=2).category == "lost"
    assert classify(CASES["wrong_room"][0], None, cap=6).category == "cap"
    assert classify(CASES["wrong_object"][0], None, cap=6).category == "invalid"
    # A walkthrough without rooms (an env without rooms) leaves only wrong_room out.
    roomless = Walkthrough(WALK.commands, rooms=(), entities=WALK.entities)
    assert classify(CASES["wrong_room"][0], roomless, cap=6).category == "wrong_object"


def test_flags_count_what_each_lost_episode_did_whatever_its_category():
    f = classify(CASES["loop"][0], WALK, cap=6)
    assert f.repeats == 2 and f.most_played == ("go north", 2)
    assert f.wrong_rooms == ("cellar",) and f.wrong_objects == ()
    assert f.flags == {"loop", "same_command", "wrong_room"}
    # The same command from different states is played twice, but it is no loop.
    again = _record(["take key from table", "go north", "take key from table"], states=[0, 1, 2])
    f = classify(again, WALK, cap=6)
    assert f.repeats == 0 and f.flags == {"same_command"} and f.category == "cap"
    # Back to a state it had left (the key taken, dropped, taken again): a circle, a loop.
    undo = ["take key from table", "drop key", "take key"]
    f = classify(_record(undo, states=[0, 1, 2], final_state=1), WALK, cap=6)
    assert (f.circles, f.repeats, f.category) == (1, 0, "loop")
    assert classify(_record(undo, states=[0, 1, 2]), WALK, cap=6).category == "cap"
    # A command that changes nothing leaves the state where it was: no circle.
    f = classify(_record(["look", "go north"], states=[0, 0], final_state=1), WALK, cap=6)
    assert f.circles == 0 and f.category == "cap"
    # A single repeat is a loop at min_repeats=1.
    assert classify(CASES["invalid"][0], WALK, cap=6, min_repeats=1).category == "loop"
    f = classify(_record(["look"], history_cut=True, plan=[3]), WALK, cap=6)
    assert f.flags == {"history_cut"}  # plan left 3 = the walkthrough's 3: no progress
    forward = _record(["go north", "take key from table"], rooms=["attic"] * 2, plan=[2, 1])
    assert classify(forward, WALK, cap=6).flags == {"progressed"}  # 1 left of the 3


def test_hopeless_after_counts_the_commands_played_when_the_experts_plan_outgrew_the_cap():
    # Cap 4: after 1 command 3 steps are left, after 2 commands 2.
    record = _record(["look", "look", "look"], states=[0, 1, 2], plan=[3, 3, 3])
    assert classify(record, WALK, cap=4).hopeless_after == 2
    record = _record(["go north", "take key from table"], states=[0, 1], plan=[2, 1])
    assert classify(record, WALK, cap=4).hopeless_after is None  # 2 <= 3, 1 <= 2: never
    assert classify(CASES["unwinnable"][0], WALK, cap=2).hopeless_after == 0
    assert classify(_record(["look"]), WALK, cap=4).hopeless_after is None  # not reported


def test_walkthrough_names_whole_entities_longest_first():
    assert WALK.named("unlock red chest with red key") == ("red chest", "red key")
    assert WALK.named("Take Key from TABLE") == ("key", "table")
    assert WALK.named("go north") == ()
    assert WALK.named("examine chestnut") == ()
    assert WALK.objects == {"key", "table", "red chest"}


def test_a_won_episode_is_no_failure():
    with pytest.raises(ValueError, match="won episode"):
        classify(_record(["go north"], ending="won"), WALK, cap=6)


def _breakdown():
    records = [
        _record(["look"], ending="won", task_id="simple/0"),
        CASES["loop"][0],  # simple/0 again: its second episode
        _record(["go east", "take apple"], rooms=["cellar"] * 2, task_id="simple/1"),
        _record(["go north"], rooms=["attic"], task_id="medium/0", kind="medium", plan=[2]),
        _record(["look"], ending="won", task_id="medium/1", kind="medium"),
        _record(["look"], ending="won", task_id="medium/2", kind="medium"),
    ]
    return failures.failure_breakdown(
        records, cap=6, walkthrough=lambda task: WALK, protocol="6 valid games"
    )


def test_breakdown_counts_and_shares_lost_episodes_per_task_type():
    b = _breakdown()
    assert b.episodes == {"simple": 3, "medium": 3}
    assert b.lost() == {"simple": 2, "medium": 1, "all": 3}
    counts = b.counts()
    assert counts["simple"]["loop"] == counts["simple"]["wrong_room"] == 1
    assert counts["medium"]["cap"] == 1 and sum(counts["all"].values()) == 3
    assert [f.episode for f in b.failures] == [1, 0, 0]
    flags = b.flag_counts()
    assert flags["all"]["wrong_room"] == 2 and flags["medium"]["progressed"] == 1
    out = b.to_json()
    json.dumps(out, allow_nan=False)
    assert out["precedence"] == list(failures.CATEGORIES)
    assert out["per_type"]["simple"]["categories"]["loop"] == {"count": 1, "share_of_lost": 0.5}
    assert out["per_type"]["all"]["episodes"] == 6
    assert [e["category"] for e in out["episodes"]] == ["loop", "wrong_room", "cap"]
    row = out["episodes"][0]
    assert row["walkthrough_steps"] == 3 and row["commands"][0] == "go north"
    text = b.markdown(title="eval_valid")
    assert "| category | medium | simple | all |" in text
    assert "| loop | 0 (0.0%) | 1 (50.0%) | 1 (33.3%) |" in text
    assert "| **lost** | 1 of 3 | 2 of 3 | 3 of 6 |" in text
    row = (
        "| valid:simple/1 | simple | wrong_room | 2 | 3 | n/a | n/a | go ; take ; unlock "
        "| after 0: go -> go | go east; take apple |"
    )
    assert row in text


# Games of four walkthrough shapes, and one of a family without walkthroughs.
SHAPED = {
    "eat": Walkthrough(("take apple", "eat apple")),
    "put": Walkthrough(("take apple", "put apple on table")),
    "key": Walkthrough(("take key", "unlock box with key")),
    "go": Walkthrough(("go east", "take coin")),
    "long": Walkthrough(("go east", "take coin", "put coin on table")),
}


def _shaped_breakdown():
    def game(task_id, commands, ending, kind="simple", env="textworld"):
        return _record(commands, ending=ending, task_id=task_id, kind=kind, env=env)

    records = [
        game("eat/0", ["take apple", "drop apple"], "step_cap"),
        game("eat/1", ["take apple", "drop apple", "take apple"], "step_cap"),
        game("eat/2", ["take apple", "eat apple"], "won"),
        game("put/0", ["take apple", "drop apple"], "step_cap"),
        game("put/1", ["Take  Apple", "eat apple"], "lost"),  # the same command, other spelling
        game("key/0", ["take key", "unlock box with key"], "won"),
        game("key/1", ["take key", "unlock box with key"], "won"),
        game("go/0", ["go west", "go east"], "step_cap"),  # the same verb, another command
        game("go/1", ["go east"], "context"),  # on the walkthrough when cut
        game("go/2", ["look", "go east", "take coin"], "won"),  # won off the walkthrough
        game("long/0", ["go east", "take coin", "insert coin into box"], "step_cap", "medium"),
        game("none/0", ["look"], "step_cap", env="scripted"),  # no walkthrough: no shape
        game("none/1", ["look"], "won", env="scripted"),
    ]

    def walkthrough(task):
        return SHAPED[task.id.split("/")[0]] if task.env == "textworld" else None

    return failures.failure_breakdown(records, cap=6, walkthrough=walkthrough)


def test_shapes_count_every_episode_won_or_lost_per_type_most_played_first():
    b = _shaped_breakdown()
    assert failures.walkthrough_shape(SHAPED["long"]) == "go ; take ; put"
    assert failures.walkthrough_shape(None) == ""
    assert len(b.shapes) == 13 and b.lost()["all"] == 8  # the categories count the lost only

    def row(shape, episodes, wins):
        return dict(shape=shape, episodes=episodes, wins=wins, losses=episodes - wins,
                    success_rate=wins / episodes)  # fmt: skip

    assert b.shape_outcomes() == {
        "medium": [row("go ; take ; put", 1, 0)],
        "simple": [  # 3, 3, 2, 2 episodes: ties by name
            row("go ; take", 3, 1),
            row("take ; eat", 3, 1),
            row("take ; put", 2, 0),
            row("take ; unlock", 2, 2),
        ],
    }


def test_divergences_count_where_the_lost_episodes_left_the_walkthrough_per_shape():
    b = _shaped_breakdown()
    D = failures.Divergence
    assert [f.divergence for f in b.failures] == [
        D(1, "eat", "drop"), D(1, "eat", "drop"), D(1, "put", "drop"), D(1, "put", "eat"),
        D(0, "go", "go"), None, D(2, "put", "insert"), None,
    ]  # fmt: skip
    assert [f.shape for f in b.failures][-3:] == ["go ; take", "go ; take ; put", ""]

    def row(shape, step, after, expected, played, lost):
        return dict(shape=shape, step=step, after=after, expected=expected, played=played,
                    lost=lost)  # fmt: skip

    assert b.divergences() == {
        "medium": [row("go ; take ; put", 2, "go ; take", "put", "insert", 1)],
        "simple": [
            row("go ; take", 0, "", "go", "go", 1),
            row("go ; take", None, None, None, None, 1),  # cut while still on it
            row("take ; eat", 1, "take", "eat", "drop", 2),
            row("take ; put", 1, "take", "put", "drop", 1),
            row("take ; put", 1, "take", "put", "eat", 1),
        ],
    }
    # Without a walkthrough there is nothing to leave; the commands as far as the walkthrough.
    assert failures.divergence(["look"], None) is None
    assert failures.divergence(["take apple"], SHAPED["eat"]) is None
    assert failures.divergence([" "], SHAPED["eat"]) == D(0, "take", "")


def test_shapes_and_divergences_in_the_json_and_the_markdown():
    b = _shaped_breakdown()
    out = b.to_json()
    json.dumps(out, allow_nan=False)
    assert out["shapes"] == b.shape_outcomes() and out["divergences"] == b.divergences()
    rows = {e["task"]: e for e in out["episodes"]}
    assert rows["eat/0"]["shape"] == "take ; eat"
    assert rows["eat/0"]["divergence"] == {"step": 1, "expected": "eat", "played": "drop"}
    assert rows["go/1"]["divergence"] is None and rows["go/1"]["shape"] == "go ; take"
    assert rows["none/0"]["shape"] is None and rows["none/0"]["divergence"] is None
    text = b.markdown()
    for line in [
        "| type | shape | episodes | won | lost | success |",
        "| medium | go ; take ; put | 1 | 0 | 1 | 0.0% |",
        "| simple | go ; take | 3 | 1 | 2 | 33.3% |",
        "| simple | take ; unlock | 2 | 2 | 0 | 100.0% |",
        "| type | shape | after | expected | played | lost |",
        "| medium | go ; take ; put | go ; take | put | insert | 1 |",
        "| simple | go ; take | (start) | go | go | 1 |",
        "| simple | go ; take | never left it | - | - | 1 |",
        "| simple | take ; eat | take | eat | drop | 2 |",
        "| valid:put/1 | simple | lost | 2 | 2 | n/a | n/a | take ; put | after 1: put -> eat "
        "| Take  Apple; eat apple |",
        "| valid:go/1 | simple | context | 1 | 2 | n/a | n/a | go ; take | never | go east |",
        "| valid:none/0 | simple | cap | 1 | n/a | n/a | n/a | n/a | n/a | look |",
    ]:
        assert line in text, line
    # The shape table comes after the flags, before the rows; none without any walkthrough.
    assert text.index("| flag |") < text.index("| type | shape |") < text.index("| game |")
    assert "walkthrough shape" not in _breakdown_without_walkthroughs().markdown()


def _breakdown_without_walkthroughs():
    records = [_record(["look"], ending="won"), CASES["loop"][0]]
    return failures.failure_breakdown(records, cap=6, walkthrough=lambda task: None)


def _result(outcomes):
    return EvalResult(
        overall=Stats.of([]), per_type={}, greedy=True, num_tasks=len(outcomes), split="valid",
        outcomes=tuple(("valid", task, won) for task, won in outcomes),
    )  # fmt: skip


def test_sft_start_pairs_each_lost_episode_with_its_game_after_sft():
    b = _breakdown()
    # After SFT: simple/0 played twice (won, then lost), simple/1 won, medium/0 not played.
    start = failures.sft_start(b, [_result([("simple/0", True), ("simple/0", False)]),
                                   _result([("simple/1", True), ("simple/0", True)])])  # fmt: skip
    assert start.per_category["loop"] == {
        "lost_after_sft": 1, "won_after_sft": 0, "not_evaluated": 0
    }  # fmt: skip
    assert start.per_category["wrong_room"]["won_after_sft"] == 1
    assert start.per_category["cap"]["not_evaluated"] == 1
    assert start.per_category["all"] == {
        "lost_after_sft": 1, "won_after_sft": 1, "not_evaluated": 1
    }  # fmt: skip
    assert "| **all** | 1 | 1 | 1 |" in start.markdown()


# ------------------------------------------------------------------ records of real episodes

TEXTS = [
    "Goal: open the chest and take the coin. You are in a kitchen. There is a door to the north.",
    "go north | open chest | take coin | look | inventory | examine table | unlock box with key",
    "You open the chest. You take the coin. Nothing happens. That's not a verb I recognise.",
] * 20


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return build_tokenizer(TEXTS, 320, tmp_path_factory.mktemp("tok"))


def _step(tok, command, **info):
    ids = tok.encode(command, add_special_tokens=False)
    return Step(prompt_ids=[3], action_ids=ids, action_logprobs=[0.0] * len(ids), info=info)


@pytest.mark.parametrize(
    "ending, won, truncated, done, steps",
    [
        ("won", True, False, True, 2),
        ("lost", False, False, True, 2),  # the env ended it without a win
        ("step_cap", False, True, True, 2),  # the env's step limit, before max_turns
        ("step_cap", False, True, False, 3),  # the rollout's max_turns
        ("context", False, True, False, 2),  # the context filled before max_turns
        ("context", False, True, False, 0),  # the first observation did not fit
    ],
)
def test_a_records_ending_follows_how_the_rollout_ended_the_episode(
    tok, ending, won, truncated, done, steps
):
    traj = Trajectory(task=Task("textworld", "valid", "simple/0"), group=0, won=won)
    traj.truncated = truncated
    for t in range(steps):  # acted from state t, led to state 10 + t
        info = {"room": "attic", "expert_steps": 2 - t, "invalid_action": t == 0, "score": 0}
        traj.steps.append(_step(tok, "open chest", **info, state_key=10 + t))
        traj.steps[-1].state_key = t
    if steps:
        traj.steps[-1].done = done
    record = EpisodeRecord.of(traj, tok, max_turns=3)
    assert record.ending == ending
    assert record.commands == ("open chest",) * steps
    assert record.invalid == tuple(t == 0 for t in range(steps))
    assert record.plan_left == tuple(2 - t for t in range(steps))
    assert record.states == tuple(range(steps))
    assert record.final_state == (10 + steps - 1 if steps else None)
    infra = Trajectory(task=traj.task, group=0, infra_failure=True)
    assert failures.episode_records([infra, traj], tok, max_turns=3) == [record]


def test_write_failures_writes_the_breakdown_and_the_sft_start_of_the_same_games(tok, tmp_path):
    task = Task("scripted", "valid", "simple/0")  # a family without a walkthrough hook
    won = Trajectory(task=Task("scripted", "valid", "simple/1"), group=1, won=True)
    won.steps.append(_step(tok, "open chest", state_key=1))
    lost = Trajectory(task=task, group=0, truncated=True)
    lost.steps += [_step(tok, "look", state_key=0) for _ in range(3)]
    result = EvalResult(
        overall=Stats.of([won, lost]), per_type={}, greedy=True, num_tasks=2, split="valid",
        episodes=(won, lost),
    )  # fmt: skip
    other = dataclasses.replace(_result([("simple/0", True)]), split="test", num_tasks=7)
    other = dataclasses.replace(other, outcomes=(("test", "simple/0", True),))
    json_path, md_path = failures.write_failures(
        {"simple": result, "simple@valid": result},  # one result under two levels: once
        tok,
        cap=3,
        max_turns=3,
        out_dir=tmp_path,
        name="eval_valid",
        after_sft=[_result([("simple/0", False), ("simple/1", True)]), other],
    )
    out = json.loads(pathlib.Path(json_path).read_text())
    assert out["per_type"]["all"]["episodes"] == 2 and out["per_type"]["all"]["lost"] == 1
    # "look" three times from one state: two repeats.
    assert [e["category"] for e in out["episodes"]] == ["loop"]
    assert out["sft_start"]["all"] == {"lost_after_sft": 1, "won_after_sft": 0, "not_evaluated": 0}
    assert out["shapes"] == {} and out["episodes"][0]["shape"] is None
    text = pathlib.Path(md_path).read_text()
    assert "## SFT start" in text and "2 valid games" in text and "7 test games" not in text
    assert "walkthrough shape" not in text  # the scripted family has no walkthroughs
    with pytest.raises(ValueError, match="keep_episodes"):
        failures.write_failures(
            {"simple": dataclasses.replace(result, episodes=())}, tok, cap=3, max_turns=3,
            out_dir=tmp_path, name="x",
        )  # fmt: skip


def test_textworld_reports_the_room_and_the_plan_left_along_its_walkthrough(textworld_games):
    from agentrl_jax.envs.textworld.env import TextWorldEnv

    env = TextWorldEnv(max_steps=20)
    for task in textworld_games["train"] + textworld_games["valid"]:
        walk = failures.family_walkthrough(task)
        assert walk.commands and walk.rooms and walk.objects <= set(walk.entities)
        env.reset(task)
        info = env.reset_info()
        # The expert's plan at the start is the walkthrough ("progressed" compares with it).
        assert info["expert_steps"] == len(walk.commands) and info["room"] == walk.rooms[0]
        rooms = [info["room"]]
        for i, command in enumerate(walk.commands):
            _, _, done, info = env.step(command)
            assert info["expert_steps"] == len(walk.commands) - i - 1
            rooms.append(info["room"])
        assert done and info["won"]
        assert tuple(dict.fromkeys(rooms)) == walk.rooms
        # The walkthrough played, won: its shape is its commands' first words.
        played = _record(walk.commands, ending="won", task_id=task.id)
        played = dataclasses.replace(played, task=task)
        breakdown = failures.failure_breakdown([played], cap=20)  # the family's hook
        shape = " ; ".join(c.split()[0] for c in walk.commands)
        assert breakdown.shape_outcomes()["simple"] == [
            dict(shape=shape, episodes=1, wins=1, losses=0, success_rate=1.0)
        ]
        assert failures.divergence(played.commands, walk) is None
    env.close()


@pytest.fixture(scope="module")
def sampler(tok):
    cfg = preset(
        "tiny", vocab_size=320, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2,
        num_kv_heads=1, head_dim=16,
    )  # fmt: skip
    template = get_template("plain")
    return Sampler(
        CausalLM(cfg, rngs=nnx.Rngs(0)),
        sampling=SamplingParams(temperature=1.0),
        stop=StopConfig(eos_ids=(template.stop_id(tok),)),
        pad_id=tok.pad_token_id,
    )


def test_real_textworld_rollouts_give_records_the_breakdown_classifies(
    textworld_games, tok, sampler
):
    """A random policy on real games, cut by the env's step limit, by the rollout's turns, and
    by the context: each record says how, and every lost episode gets a category."""
    from agentrl_jax.envs.actors import ActorPool

    tasks = textworld_games["train"] + textworld_games["valid"]
    cfg = RolloutConfig(
        group_size=1, max_turns=4, max_new_tokens=48, max_seq_len=4096, constrain_actions=True
    )
    with ActorPool("textworld", {"max_steps": 2}, num_workers=1, envs_per_worker=4) as pool:
        worker = RolloutWorker(pool, sampler, tok, get_template("plain"), cfg)
        by_env = worker.run(tasks, jax.random.key(0))  # the env's limit (2) before max_turns
        by_turns = worker.with_config(dataclasses.replace(cfg, max_turns=1)).run(
            tasks, jax.random.key(0)
        )
        by_context = worker.with_config(dataclasses.replace(cfg, max_seq_len=64)).run(
            tasks, jax.random.key(0)
        )
    # The walkthroughs take 2 commands: within the env's cap of 2, beyond a cap of 1 turn.
    wasted = {"loop", "wrong_room", "wrong_object", "cap"}  # constrained: nothing rejected
    for trajs, max_turns, steps, ending, categories in [
        (by_env, 4, 2, "step_cap", wasted),
        (by_turns, 1, 1, "step_cap", {"unwinnable"}),
        (by_context, 4, 0, "context", {"context"}),
    ]:
        records = failures.episode_records(trajs, tok, max_turns=max_turns)
        assert len(records) == len(trajs)
        for record in records:
            walk = failures.family_walkthrough(record.task)
            if record.won:  # a random policy may play the two-command walkthrough
                assert len(record.commands) == len(walk.commands)
                continue
            assert record.ending == ending and len(record.commands) == steps
            assert all(record.rooms) and all(p is not None for p in record.plan_left)
            assert (record.final_state is None) == (steps == 0)
            assert record.task_type == "simple"
            # Constrained decoding: every command was one the game listed, none rejected.
            assert not any(record.invalid)
        breakdown = failures.failure_breakdown(records, cap=min(2, max_turns))
        assert len(breakdown.failures) == sum(not r.won for r in records) > 0
        assert {f.category for f in breakdown.failures} <= categories
        # Every episode, won or lost, has its game's shape; a lost one left the walkthrough
        # unless each command it played was the walkthrough's at its step.
        walks = [failures.family_walkthrough(r.task) for r in records]
        assert [s for _, s, _ in breakdown.shapes] == [
            " ; ".join(c.split()[0] for c in w.commands) for w in walks
        ]
        lost_walks = [w for w, r in zip(walks, records) if not r.won]
        for f, walk in zip(breakdown.failures, lost_walks):
            on_it = f.record.commands == walk.commands[: len(f.record.commands)]
            assert (f.divergence is None) == on_it
