"""TextWorld env and game generation, checked against the raw TextWorld engine as the reference."""

import itertools
import os
import random
import re
import shutil
import subprocess
import sys

import pytest
import textworld

from agentrl_jax.envs import registry
from agentrl_jax.envs.base import Task
from agentrl_jax.envs.textworld import games
from agentrl_jax.envs.textworld.env import GameFileError, TextWorldEnv, clean_text

# The raw reference envs load TextWorld games in Jericho, which warns it cannot track their score.
pytestmark = pytest.mark.filterwarnings("ignore:.*is not fully supported")


def _raw_env(path):
    """TextWorld's own env with the infos we use as the independent reference."""
    infos = textworld.EnvInfos(
        facts=True, score=True, max_score=True, won=True, admissible_commands=True
    )
    return textworld.start(path, request_infos=infos)


def _play_expert(env, task, max_steps=50):
    obs = env.reset(task)
    _, _, _, info = env.step("look")  # The first step reveals the expert's action.
    actions, rewards, infos = [], [], []
    done = False
    while not done and len(actions) < max_steps:
        action = info["expert_action"]
        assert action is not None, f"{task.name}: no expert action before the game ended"
        obs, reward, done, info = env.step(action)
        actions.append(action)
        rewards.append(reward)
        infos.append(info)
    return obs, actions, rewards, infos


@pytest.mark.parametrize("mode", ["dense", "sparse"])
def test_expert_wins_every_game(textworld_games, mode):
    env = TextWorldEnv(reward=mode, max_steps=60)
    for task in textworld_games["train"] + textworld_games["cooking"]:
        _, actions, rewards, infos = _play_expert(env, task)
        assert infos[-1]["won"] and not infos[-1]["lost"], task.name
        assert infos[-1]["score"] == infos[-1]["max_score"] > 0
        assert infos[-1]["expert_action"] is None
        assert sum(rewards) == pytest.approx(1.0, abs=1e-12)
        if mode == "sparse":
            assert rewards == [0.0] * (len(rewards) - 1) + [1.0]
    env.close()


def test_dense_rewards_are_engine_score_increments(textworld_games):
    """Dense reward = (score_t - score_{t-1}) / max_score, with scores from the raw engine."""
    task = textworld_games["cooking"][0]
    env = TextWorldEnv(reward="dense")
    _, actions, rewards, _ = _play_expert(env, task)
    raw = _raw_env(task.param("path"))
    state = raw.reset()
    raw.step("look")
    scores = [state["score"]]
    for action in actions:
        state, _, _ = raw.step(action)
        scores.append(state["score"])
    expected = [(b - a) / state["max_score"] for a, b in itertools.pairwise(scores)]
    assert state["max_score"] == 3  # recipe=1, take=1: take, prepare meal, eat meal.
    assert rewards == pytest.approx(expected, abs=1e-12)
    assert sum(0 < r < 1 for r in rewards) >= 2  # Really turn-level, not only at the win.
    raw.close()


def test_state_key_equal_exactly_when_engine_facts_equal(textworld_games):
    """Random walks: state keys agree with the engine's own fact sets, pair by pair."""
    rng = random.Random(0)
    for task in textworld_games["train"]:
        env, raw = TextWorldEnv(max_steps=100), _raw_env(task.param("path"))
        seen = {}  # state_key -> frozenset of engine facts
        for _ in range(3):
            obs, state = env.reset(task), raw.reset()
            key = env.step("look")[3]["state_key"]
            state, _, _ = raw.step("look")
            for _ in range(12):
                facts = frozenset(map(str, state["facts"]))
                assert seen.setdefault(key, facts) == facts, f"{task.name}: key merges states"
                action = rng.choice(sorted(state["admissible_commands"]))
                obs, _, done, info = env.step(action)
                state, _, _ = raw.step(action)
                key = info["state_key"]
                if done:
                    break
        by_facts = {}
        for key, facts in seen.items():
            assert by_facts.setdefault(facts, key) == key, f"{task.name}: one state, two keys"
        assert len(seen) >= 3, f"{task.name}: the walks should visit several states"


def test_state_key_same_state_by_different_paths(textworld_games):
    for task in textworld_games["train"]:
        env = TextWorldEnv()
        obs = env.reset(task)
        start = env.step("look")[3]["state_key"]
        assert env.step("inventory")[3]["state_key"] == start  # Text differs, state does not.
        go = next(c for c in obs.admissible_commands if c.startswith("go "))
        back = {"north": "south", "south": "north", "east": "west", "west": "east"}
        obs, _, _, info = env.step(go)
        assert info["state_key"] != start  # Another room.
        _, _, _, info = env.step("go " + back[go.split()[1]])
        assert info["state_key"] == start  # The same state, reached by a detour.
        # And the expert's next state, reached directly or after the detour.
        direct = TextWorldEnv()
        direct.reset(task)
        expert = direct.step("look")[3]["expert_action"]
        key_direct = direct.step(expert)[3]["state_key"]
        key_detour = env.step(expert)[3]["state_key"]
        assert key_direct == key_detour != start


def test_bad_actions_get_feedback_and_the_episode_goes_on(textworld_games):
    task = textworld_games["train"][0]
    env = TextWorldEnv(max_steps=40, max_action_chars=100)
    env.reset(task)
    start = env.step("look")[3]["state_key"]
    bad = [
        "",
        "   ",
        "x" * 101,
        b"\xff\xfe go",
        "go n\udcffrth",
        "pr\u00e9pare the meal",
        "take all. quit",
        "open door then go east",
        "quit",
        "restart",
        "undo",
        "tw-trace-actions",
        "xyzzy",
        "take the moon",
        12,
        None,
    ]
    for action in bad:
        obs, reward, done, info = env.step(action)
        assert not done and reward == 0.0, action
        assert info["invalid_action"], action
        assert info["state_key"] == start, action
        assert obs.feedback, action
    assert env.step("LOOK.")[3]["invalid_action"] is False  # Case and a final period are fine.
    # The game is intact: the expert still wins from here.
    info = env.step("look")[3]
    while not info["won"]:
        _, _, done, info = env.step(info["expert_action"])
    assert info["won"]
    with pytest.raises(RuntimeError, match="reset"):
        env.step("look")


def test_step_limit_truncates(textworld_games):
    env = TextWorldEnv(max_steps=3)
    env.reset(textworld_games["train"][0])
    steps = [env.step("look") for _ in range(3)]
    assert [s[2] for s in steps] == [False, False, True]
    assert steps[-1][3]["truncated"] and not steps[-1][3]["won"]
    assert not steps[0][3]["truncated"]
    env.reset(textworld_games["train"][0])  # A reset starts the count again.
    _, _, done, info = env.step("look")
    assert not done and info["steps"] == 1


def test_observations_are_clean(textworld_games):
    task = textworld_games["train"][1]
    raw = _raw_env(task.param("path"))
    banner = raw.reset()["feedback"]
    raw.close()
    assert "$$" in banner and re.search(r"-= .* =-\d+/\d+", banner)
    objective = TextWorldEnv().reset(task).objective
    cleaned = clean_text(banner)
    assert cleaned.startswith(objective)  # The welcome text is the objective, then the room.
    assert "$$" not in cleaned and not re.search(r"=-\d+/\d+", cleaned)
    env = TextWorldEnv()
    obs = env.reset(task)
    assert obs.text.startswith("-= ") and obs.feedback == "" and obs.inventory
    for action in ("look", "inventory", "xyzzy"):
        obs = env.step(action)[0]
        for text in (obs.text, obs.feedback, obs.inventory):
            assert "$$" not in text and not re.search(r"=-\d+/\d+|^>|>$", text), text
    _, _, _, info = env.step("look")
    while not info["won"]:
        obs, _, _, info = env.step(info["expert_action"])
    assert "*** The End ***" in obs.feedback and "RESTART" not in obs.feedback
    assert TextWorldEnv(admissible_commands=False).reset(task).admissible_commands is None


def test_cache_is_reused(textworld_games, monkeypatch):
    root = textworld_games["root"]
    before = [t.param("path") for t in textworld_games["train"]]
    mtimes = [os.path.getmtime(p) for p in before]

    def no_generation(*args, **kwargs):
        raise AssertionError("a cached game was generated again")

    monkeypatch.setattr(games, "_generate", no_generation)
    again = games.make_tasks("simple", "train", 3, root=root, progress=False)
    assert [t.param("path") for t in again] == before
    assert [os.path.getmtime(p) for p in before] == mtimes
    assert [t.name for t in again] == [f"textworld/train/custom-r2-o3-q2/{i}" for i in range(3)]
    monkeypatch.setenv("AGENTRL_CACHE", str(root))
    assert games.game_path("simple", 0) == before[0]  # The env var picks the default root.


def test_task_with_a_stale_path_finds_its_game_by_spec_and_seed(textworld_games, monkeypatch):
    monkeypatch.setenv("AGENTRL_CACHE", str(textworld_games["root"]))
    task = textworld_games["train"][1]
    moved = Task(task.env, task.split, task.id, (*task.params[:-1], ("path", "/gone/game.z8")))
    assert moved.param("path") == "/gone/game.z8"
    monkeypatch.setattr(games, "_generate", lambda *a: pytest.fail("the game is in the cache"))
    assert games.task_game_path(moved) == task.param("path")


def test_train_and_eval_games_are_disjoint(textworld_games):
    train_seeds = {t.param("seed") for t in textworld_games["train"]}
    valid_seeds = {t.param("seed") for t in textworld_games["valid"]}
    assert not train_seeds & valid_seeds
    last_train = games.seed_for("train", games.MAX_GAMES_PER_SPLIT - 1)
    assert last_train < games.seed_for("valid", 0) < games.seed_for("test", 0)
    with pytest.raises(ValueError, match="out of range"):
        games.seed_for("train", games.MAX_GAMES_PER_SPLIT)

    def content(task):  # What the player meets: the initial world and the solution.
        raw = _raw_env(task.param("path"))
        state = raw.reset()
        fingerprint = (frozenset(map(str, state["facts"])), state["objective"])
        raw.close()
        return fingerprint

    valid = content(textworld_games["valid"][0])
    assert all(content(t) != valid for t in textworld_games["train"])


def test_spec_parsing_and_errors():
    assert games.parse_spec("simple") == games.parse_spec("custom:2,3,2")
    assert games.parse_spec("medium").name == "custom-r4-o8-q4"
    assert games.parse_spec("hard").name == "custom-r8-o12-q6"
    assert games.parse_spec("tw-coin_collector:level=5").name == "tw-coin_collector-level5"
    cooking = games.parse_spec("tw-cooking:recipe=2,take=1,go=6,open,cut")
    assert dict(cooking.settings)["go"] == 6 and dict(cooking.settings)["open"] is True
    for text in ("hard", "custom:5,9,3", "tw-cooking:go=6,open,cut", "tw-treasure_hunter:level=3"):
        spec = games.parse_spec(text)
        assert games.parse_spec(spec.text) == spec, text
    for bad, match in [
        ("enormous", "unknown game spec"),
        ("custom:2,3", "three integers"),
        ("custom:0,3,2", "rooms >= 1"),
        ("tw-coin_collector", "required: --level"),
        ("tw-cooking:go=7", "invalid choice"),
        ("tw-cooking:bogus=1", "unrecognized"),
    ]:
        with pytest.raises(ValueError, match=match):
            games.parse_spec(bad)
    with pytest.raises(ValueError, match="unknown split"):
        games.seed_for("dev", 0)


def test_missing_and_corrupt_game_files(textworld_games, tmp_path):
    env = TextWorldEnv()
    missing = Task("textworld", "train", "x", (("path", str(tmp_path / "none" / "game.z8")),))
    with pytest.raises(GameFileError, match="missing; make the games"):
        env.reset(missing)
    with pytest.raises(ValueError, match="needs params 'path' or both 'spec_text' and 'seed'"):
        env.reset(Task("textworld", "train", "x"))
    source = os.path.dirname(textworld_games["train"][0].param("path"))
    for damage, match in [
        (lambda d: d.__setitem__(slice(0, 8), b"garbage!"), "not a Z-machine story"),
        (lambda d: d.__setitem__(1000, d[1000] ^ 1), "damaged"),
    ]:
        folder = tmp_path / f"game-{match[:3]}"
        shutil.copytree(source, folder)
        data = bytearray((folder / "game.z8").read_bytes())
        damage(data)
        (folder / "game.z8").write_bytes(bytes(data))
        task = Task("textworld", "train", "x", (("path", str(folder / "game.z8")),))
        with pytest.raises(GameFileError, match=match):
            env.reset(task)
    folder = tmp_path / "bad-json"
    shutil.copytree(source, folder)
    (folder / "game.json").write_text("{not json")
    with pytest.raises(GameFileError, match="JSONDecodeError"):
        env.reset(Task("textworld", "train", "x", (("path", str(folder / "game.z8")),)))
    obs = env.reset(textworld_games["train"][0])  # The env still works afterwards.
    assert obs.text


def test_registry_by_name():
    env = registry.make_env("textworld", reward="sparse", max_steps=7)
    assert isinstance(env, TextWorldEnv) and env.max_steps == 7
    assert {"textworld", "alfworld"} <= set(registry.names())
    with pytest.raises(ValueError, match="unknown env 'nope'; valid names: .*textworld"):
        registry.make_env("nope")
    with pytest.raises(ValueError, match="reward='shaped'"):
        registry.make_env("textworld", reward="shaped")


def test_make_games_cli(textworld_games):
    root = str(textworld_games["root"])
    run = lambda *args: subprocess.run(
        [sys.executable, "-m", "launch.make_games", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    ok = run("--spec=simple", "--split=train", "--count=3", f"--cache_dir={root}")
    assert ok.returncode == 0, ok.stderr
    assert "3 custom-r2-o3-q2 games (train) ready" in ok.stdout
    bad = run("--spec=gigantic", f"--cache_dir={root}")
    assert bad.returncode != 0 and "unknown game spec 'gigantic'" in bad.stderr


def test_reset_info_gives_the_initial_key_and_expert(textworld_games):
    env = TextWorldEnv()
    task = textworld_games["train"][0]
    with pytest.raises(RuntimeError, match="before reset"):
        env.reset_info()
    env.reset(task)
    info = env.reset_info()
    assert info["steps"] == 0 and not info["won"] and not info["invalid_action"]
    _, _, _, after_look = env.step("look")
    assert info["state_key"] == after_look["state_key"]
    assert info["expert_action"] == after_look["expert_action"] is not None
