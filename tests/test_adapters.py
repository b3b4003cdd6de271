"""Other people's environments as env families (agentrl_jax/envs/adapters/): a Gymnasium text
env, an OpenEnv server on 127.0.0.1, a TextArena game and a verifiers taskset, each played through
its real package (no mock), refused with the reason where it cannot be translated, and trained,
evaluated and reported on through ``launch.train`` (tests/adapter_config.py)."""

import json
import os

import pytest
import train_cli

from agentrl_jax.envs import registry
from agentrl_jax.envs.adapters import openenv_env, textarena_env
from agentrl_jax.experiments import study_spec
from agentrl_jax.rollout.tasks import make_tasks
from agentrl_jax.run import budget as budget_lib
from agentrl_jax.run.config import ConfigError, from_config_dict, load_config_file

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
CONFIG = os.path.join("tests", "adapter_config.py")
LAKE_CONFIG = os.path.join("configs", "textarena_frozenlake.py")
LAKE_STUDY = os.path.join(REPO, "configs", "studies", "textarena_frozenlake.py")


@pytest.fixture
def on_path(monkeypatch):
    """tests/ on sys.path and PYTHONPATH (the actor pool's workers import adapter_envs too)."""
    monkeypatch.syspath_prepend(TESTS)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))


@pytest.fixture
def openenv_server(on_path):
    """The corridor's OpenEnv server (tests/adapter_envs.py:app), started by uvicorn on
    127.0.0.1 for the test and stopped after it."""
    url, proc = openenv_env.serve("adapter_envs:app", env=dict(os.environ))
    yield url
    proc.terminate()
    proc.wait(timeout=30)


def _play(env, task, actions):
    first = env.reset(task)
    return first, env.reset_info(), [env.step(a) for a in actions]


def _doors(seed):
    import adapter_envs

    return adapter_envs.Corridor(seed).doors


# ---------------------------------------------------------------------------- gymnasium


def test_gymnasium_text_env_plays_and_refuses_what_is_not_text(on_path):
    (task,) = make_tasks("gymnasium", "TextCorridor-v0", "valid", 1, {"module": "adapter_envs"})
    assert task.param("seed") == 1_000_000 and task.split == "valid"
    env = registry.make_env("gymnasium", module="adapter_envs", max_steps=5)
    doors = _doors(task.param("seed"))
    first, info0, steps = _play(env, task, ["go é", "look", f"go {doors[0]}", f"go {doors[1]}"])
    assert first.objective == "cross 2 rooms to the exit" and "room 0" in first.text
    assert first.admissible_commands == ("go north", "go east", "go south", "go west", "look")
    (obs, r, done, info), look, moved, won = steps
    assert info["invalid_action"] and "action space Text(1, 40" in obs.feedback and not done
    assert not look[3]["invalid_action"] and look[1] == 0.0
    assert "room 1" in moved[0].text and not moved[2]
    assert won[1:3] == (1.0, True) and won[3]["won"] and not won[3]["truncated"]
    assert len({info0["state_key"], moved[3]["state_key"], won[3]["state_key"]}) == 3
    # The same seed replays the same episode, state keys included.
    again = _play(env, task, ["go é", "look", f"go {doors[0]}"])
    assert [s[3]["state_key"] for s in again[2]] == [s[3]["state_key"] for s in steps[:3]]
    env.close()
    with pytest.raises(ValueError, match=r"'CartPole-v1' has observation_space=Box\(.*needs text"):
        make_tasks("gymnasium", "CartPole-v1", "train", 1, {})
    with pytest.raises(ValueError, match=r"'NoSuchEnv-v0' is not registered"):
        make_tasks("gymnasium", "NoSuchEnv-v0", "train", 1, {})


def test_gymnasium_truncates_at_max_steps(on_path):
    (task,) = make_tasks("gymnasium", "TextCorridor-v0", "train", 1, {"module": "adapter_envs"})
    env = registry.make_env("gymnasium", module="adapter_envs", max_steps=2)
    _, _, steps = _play(env, task, ["look", "look"])
    assert not steps[0][2] and steps[1][2] and steps[1][3]["truncated"]


# ---------------------------------------------------------------------------- openenv


def test_openenv_client_plays_a_server_over_http(openenv_server):
    (task,) = make_tasks("openenv", "default", "test", 1, {})
    env = registry.make_env("openenv", url=openenv_server, max_steps=6)
    doors = _doors(task.param("seed"))
    first, info0, steps = _play(env, task, ["", "dance", f"go {doors[0]}", f"go {doors[1]}"])
    assert "room 0" in first.text and first.admissible_commands[-1] == "look"
    (rejected, r, done, info), dance, moved, won = steps
    # The server's own validation error (min_length=1) comes back as the feedback.
    assert info["invalid_action"] and "rejected" in rejected.feedback and not done
    assert dance[3]["invalid_action"] and not dance[2]  # not among the listed actions
    assert "room 1" in moved[0].feedback and moved[3]["state_key"] != info0["state_key"]
    assert won[1:3] == (1.0, True) and won[3]["won"]
    env.close()


def test_openenv_env_serves_its_own_app_locally(on_path):
    """``app=`` instead of ``url=``: the env starts the app with uvicorn on 127.0.0.1 and stops
    it when it closes."""
    (task,) = make_tasks("openenv", "default", "train", 1, {})
    env = registry.make_env("openenv", app="adapter_envs:app")
    first = env.reset(task)
    assert env.url.startswith("http://127.0.0.1:") and "room 0" in first.text
    server = env._server
    assert env.step("look")[3]["invalid_action"] is False and server.poll() is None
    env.close()
    assert server.poll() is not None
    with pytest.raises(ValueError, match=r"env.kwargs.app='no_such_module:app': expected"):
        openenv_env.serve("no_such_module:app")


def test_openenv_refuses_a_server_without_text_fields():
    schemas = {
        "action": {"title": "Move", "properties": {"x": {"type": "number"}}, "required": ["x"]},
        "observation": {"title": "Obs", "properties": {"board": {"type": "array"}}},
    }
    with pytest.raises(ValueError, match=r"action schema 'Move' has 0 required string fields"):
        openenv_env.text_fields(schemas, "http://h", "", "", "")
    schemas["action"]["properties"]["cmd"] = {"type": "string"}
    with pytest.raises(ValueError, match=r"observation schema 'Obs' has no string field"):
        openenv_env.text_fields(schemas, "http://h", "cmd", "", "")
    with pytest.raises(ValueError, match=r"action_field='y' is not a string field"):
        openenv_env.text_fields(schemas, "http://h", "y", "", "")
    with pytest.raises(ValueError, match="exactly one of env.kwargs.url"):
        registry.make_env("openenv")


# ---------------------------------------------------------------------------- textarena


def test_textarena_single_player_game_and_refusal():
    (task,) = make_tasks("textarena", "GuessTheNumber-v0", "train", 1, {})
    env = registry.make_env("textarena", max_steps=12)
    first = env.reset(task)
    assert "Guess The Number" in first.objective and "[5]" in first.text
    _, r, done, info = env.step("hello")
    assert info["invalid_action"] and not done and r == 0.0
    low, high, steps = 1, 20, 0
    while True:  # bisection wins within the game's 10 turns
        guess = (low + high) // 2
        obs, r, done, info = env.step(str(guess))  # the game's wrapper adds the brackets
        steps += 1
        if done:
            break
        assert not info["invalid_action"]
        low, high = (guess + 1, high) if "higher" in obs.feedback else (low, guess - 1)
    assert info["won"] and r == 1.0 and steps <= 5 and "Congratulations" in obs.feedback
    with pytest.raises(ValueError, match=r"'TicTacToe-v0' is not single-player"):
        make_tasks("textarena", "TicTacToe-v0", "train", 1, {})
    with pytest.raises(ValueError, match=r"'GuessTheNumbr-v0' is not registered"):
        make_tasks("textarena", "GuessTheNumbr-v0", "train", 1, {})


def _lake(env):
    """The FrozenLake engine's state: (grid, player position)."""
    state = env.game.state.game_state
    return state["grid"], tuple(state["player_pos"])


def test_textarena_frozenlake_lists_moves_and_its_expert_solves_every_board():
    tasks = make_tasks("textarena", "FrozenLake-v0", "test", 40, {"admissible_commands": True})
    env = registry.make_env("textarena", max_steps=8, admissible_commands=True)
    for task in tasks:
        obs, info = env.reset(task), env.reset_info()
        assert obs.admissible_commands == ("down", "right")  # the top-left corner
        grid, path = _lake(env)[0], [_lake(env)[1]]
        done = False
        while not done:
            move = info["expert_action"]
            assert move in obs.admissible_commands
            obs, reward, done, info = env.step(move)
            path.append(_lake(env)[1])
            assert not info["invalid_action"]
        # The engine's own outcome: the goal reached in 6 moves, over no hole.
        assert info["won"] and reward == 1.0 and len(path) == 7 and path[-1] == (3, 3)
        assert all(grid[r][c] != "H" for r, c in path) and info["expert_action"] is None
    # Moves come from the engine's state: at the right edge, "right" is not listed; a move into
    # a hole is (it is legal, and loses with TextArena's completion score).
    env.reset(tasks[0])
    env.game.state.game_state["player_pos"] = (1, 3)
    assert textarena_env.rules(env.game).valid_moves(env.game) == ("down", "up", "left")
    grid, _ = _lake(env)
    hole = next((r, c) for r in range(4) for c in range(4) if grid[r][c] == "H")
    env.game.state.game_state["player_pos"] = (hole[0] - 1, hole[1]) if hole[0] else (1, hole[1])
    move = "down" if hole[0] else "up"
    _, reward, done, info = env.step(move)
    assert done and not info["won"] and 0.0 < reward < 1.0 and not info["invalid_action"]
    # reward="sparse" pays for winning only; the game's own reward stays in info["score"].
    sparse = registry.make_env("textarena", max_steps=8, admissible_commands=True, reward="sparse")
    sparse.reset(tasks[0])
    sparse.game.state.game_state["player_pos"] = (hole[0] - 1, hole[1]) if hole[0] else (1, hole[1])
    _, reward, done, info = sparse.step(move)
    assert done and not info["won"] and reward == 0.0 and 0.0 < info["score"] < 1.0
    _, info, done = sparse.reset(tasks[1]), sparse.reset_info(), False
    while not done:
        _, reward, done, info = sparse.step(info["expert_action"])
    assert info["won"] and reward == 1.0 == info["score"]
    with pytest.raises(ValueError, match=r"textarena env.kwargs.reward: expected one of"):
        registry.make_env("textarena", reward="dense")
    with pytest.raises(ValueError, match=r"'GuessTheNumber-v0' \(GuessTheNumberEnv\) has no known"):
        make_tasks("textarena", "GuessTheNumber-v0", "train", 1, {"admissible_commands": True})


def test_frozenlake_recipe_and_study_resolve():
    for arg in ("", ":smoke", ":test"):
        config = from_config_dict(load_config_file(LAKE_CONFIG + arg))
        assert config.rollout.constrain_actions and dict(config.env.kwargs)["admissible_commands"]
    study = study_spec.load_study(LAKE_STUDY)
    assert study.seeds == (0, 1, 2) and set(study.variants) == {"sft_rl", "sft_only", "rl_only"}
    for variant, demos, reward in (
        ("sft_rl", 40, "sparse"),
        ("sft_only", 168, "sparse"),
        ("rl_only", 0, "game"),
    ):
        config = from_config_dict(study_spec.cell_config(study, variant, 0))
        assert budget_lib.from_config(config.budget).num_demos == demos
        assert dict(config.env.kwargs)["reward"] == reward
        assert config.env.report_levels == ("FrozenLake-v0@test",)
    rl_only = from_config_dict(study_spec.cell_config(study, "rl_only", 0))
    assert budget_lib.from_config(rl_only.budget).rl_iterations(64) == 26


# ---------------------------------------------------------------------------- verifiers


def test_verifiers_taskset_reply_scored_by_its_reward(on_path):
    kwargs = {"taskset": "vf_arith"}
    train = make_tasks("verifiers", "all", "train", 50, kwargs)
    valid = make_tasks("verifiers", "all", "valid", 50, kwargs)
    test = make_tasks("verifiers", "all", "test", 50, kwargs)
    # The taskset's 100 tasks, split by a hash of their keys: disjoint, all of them.
    ids = [{t.id for t in ts} for ts in (train, valid, test)]
    assert not (ids[0] & ids[1] or ids[0] & ids[2] or ids[1] & ids[2])
    assert len(train) == 50 and 0 < len(valid) < 20 and 0 < len(test) < 20
    env = registry.make_env("verifiers", **kwargs)
    first = env.reset(valid[0])
    a, b = (int(x) for x in first.text.split("What is ")[1].split("?")[0].split(" + "))
    obs, reward, done, info = env.step(str(a + b))
    assert (reward, done, info["won"]) == (1.0, True, True) and obs.feedback == "Scored: correct 1."
    env.reset(valid[0])
    _, reward, done, info = env.step(str(a + b + 1))
    assert (reward, done, info["won"]) == (0.0, True, False)
    with pytest.raises(ValueError, match=r"verifiers taskset 'no_such_taskset' cannot be loaded"):
        make_tasks("verifiers", "all", "train", 1, {"taskset": "no_such_taskset"})
    with pytest.raises(ValueError, match=r"has one level, 'all'"):
        make_tasks("verifiers", "easy", "train", 1, kwargs)


def test_adapter_families_refuse_settings_they_cannot_honour():
    cd = load_config_file(f"{CONFIG}:textarena")
    cd.rollout.constrain_actions = True
    with pytest.raises(ConfigError, match="constrain_actions=True .* lists none"):
        from_config_dict(cd)
    with pytest.raises(ValueError, match="has no split 'eval'"):
        make_tasks("openenv", "default", "eval", 1, {})


# ---------------------------------------------------------------------------- launch.train


def _train(tmp_path, arg, *extra, config=CONFIG):
    workdir = tmp_path / "run"
    env = dict(
        JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax_cache"),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1",
    )
    cmd = train_cli.train_cmd(workdir, *extra, config=f"{config}:{arg}")
    (text,) = train_cli.finish(train_cli.start(cmd, tmp_path / "cache", tmp_path / "log", **env))
    report = json.loads((workdir / "report.json").read_text())
    (row,) = report["before_after"]
    return workdir, text, report, row


@pytest.mark.slow
def test_launch_train_on_a_gymnasium_env(on_path, tmp_path):
    workdir, text, report, row = _train(tmp_path, "gymnasium")
    assert "| TextCorridor-v0@test | 1 |" in text
    assert (row["split"], row["num_tasks"], row["decoding"]) == ("test", 1, "constrained")
    assert report["evals"]["after_rl"]["TextCorridor-v0"]["split"] == "valid"


@pytest.mark.slow
def test_launch_train_on_an_openenv_server(openenv_server, tmp_path):
    workdir, text, report, row = _train(
        tmp_path, "openenv", f"--config.env.kwargs.url={openenv_server}"
    )
    assert "| default@test | 1 |" in text and row["split"] == "test"
    assert json.loads((workdir / "config.json").read_text())["env"]["kwargs"]["url"] == (
        openenv_server
    )


@pytest.mark.slow
def test_launch_train_on_a_textarena_game(tmp_path):
    workdir, text, report, row = _train(tmp_path, "textarena")
    assert "| GuessTheNumber-v0@test | 1 |" in text
    assert (row["split"], row["decoding"]) == ("test", "free")


@pytest.mark.slow
def test_launch_train_on_a_verifiers_taskset(on_path, tmp_path):
    workdir, text, report, row = _train(tmp_path, "verifiers")
    assert "| all@test | 1 |" in text and row["split"] == "test"


@pytest.mark.slow
def test_launch_train_on_textarena_frozenlake_with_demonstrations(tmp_path):
    """The FrozenLake recipe (configs/textarena_frozenlake.py) at the test size: SFT on the
    expert's demonstrations, then GRPO with constrained decoding, evaluated and reported."""
    workdir, text, report, row = _train(tmp_path, "test", config=LAKE_CONFIG)
    assert "| FrozenLake-v0@test | 2 |" in text
    assert (row["split"], row["decoding"]) == ("test", "constrained")
    assert set(report["evals"]) >= {"after_sft", "after_rl"}
