"""ALFWorld without ../shared: data layout, game rebuild, engine play, state keys, bad input.

Runs on the demo room (``alfworld_scenes``): one task of each of the six types written in the
standard layout with the PDDL domain that the alfworld package ships.
"""

import json
import pathlib
import shutil
import tarfile

import pytest

from agentrl_jax.envs.alfworld import data as alfworld_data
from agentrl_jax.envs.alfworld import games as alfworld_games
from agentrl_jax.envs.alfworld import scenes as alfworld_scenes
from agentrl_jax.envs.alfworld.env import ALFWorldEnv, clean_action, success_by_task_type
from agentrl_jax.envs.base import Task

NOTHING = "Nothing happens."


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """(data root, cache dir, env) with the six demo tasks in the train split."""
    root = tmp_path_factory.mktemp("alfworld_data")
    cache = tmp_path_factory.mktemp("alfworld_cache")
    alfworld_scenes.write_demo_tasks(root)
    env = ALFWorldEnv(data_dir=root, cache_dir=cache, max_steps=60)
    yield root, cache, env
    env.close()


def _task(task_type):
    return Task(env="alfworld", split="train", id=alfworld_scenes.demo_task_id(task_type))


def _play_expert(env, task, limit=60):
    obs = env.reset(task)
    info = env.last_info
    transcript = [(obs.feedback, info["state_key"])]
    rewards, done = [], False
    while not done and len(rewards) < limit:
        action = info["expert_action"]
        assert action in obs.admissible_commands, (action, obs.admissible_commands)
        obs, reward, done, info = env.step(action)
        rewards.append(reward)
        transcript.append((action, obs.feedback, info["state_key"]))
    return info, rewards, transcript


def test_missing_data_dir_says_how_to_get_it(tmp_path, monkeypatch):
    with pytest.raises(alfworld_data.MissingDataError, match="alfworld-download") as err:
        ALFWorldEnv(data_dir=tmp_path / "nowhere")
    assert str(tmp_path / "nowhere") in str(err.value) and "does not exist" in str(err.value)
    with pytest.raises(alfworld_data.MissingDataError, match="json_2.1.1"):
        ALFWorldEnv(data_dir=tmp_path)  # Exists, but no json_2.1.1 and no pack.
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    with pytest.raises(alfworld_data.MissingDataError, match="ALFWORLD_DATA is unset"):
        ALFWorldEnv()


def test_alfworld_data_env_var_is_honoured(demo, monkeypatch):
    root, cache, _ = demo
    monkeypatch.setenv("ALFWORLD_DATA", str(root))
    assert alfworld_data.resolve_data_dir(None, cache) == root
    # The json_2.1.1 folder itself is accepted too.
    assert alfworld_data.resolve_data_dir(root / "json_2.1.1", cache) == root


REPO = pathlib.Path(__file__).resolve().parents[1]
ALFWORLD_CONFIGS = ("alfworld_gagpo", "alfworld_gigpo", "alfworld_grpo")


def _parsed_config(name: str, *overrides: str):
    """``configs/<name>.py`` as ``launch.train`` parses it (absl, locked), with ``overrides``."""
    from absl import flags
    from ml_collections import config_flags

    from agentrl_jax.run.config import from_config_dict

    argv = ["train", f"--config={REPO / 'configs' / name}.py", *overrides]
    flag_values = flags.FlagValues()
    config_flags.DEFINE_config_file(
        "config", None, "", flag_values=flag_values, lock_config=True, sys_argv=argv
    )
    flag_values(argv)
    return from_config_dict(flag_values.config, num_devices=1)


@pytest.mark.parametrize("name", ALFWORLD_CONFIGS)
def test_configs_take_the_data_dir_flag_they_document(name, tmp_path, monkeypatch):
    """``--config.env.kwargs.data_dir=DIR`` parses and reaches the env's kwargs; left out, it
    is None (``$ALFWORLD_DATA``)."""
    monkeypatch.syspath_prepend(str(REPO))  # alfworld_gigpo.py imports configs.alfworld_gagpo
    run = _parsed_config(name, f"--config.env.kwargs.data_dir={tmp_path}")
    assert dict(run.env.kwargs)["data_dir"] == str(tmp_path)
    assert dict(_parsed_config(name).env.kwargs)["data_dir"] is None


def test_the_data_dir_flag_is_where_the_tasks_and_the_envs_read(demo, tmp_path, monkeypatch):
    """With ``$ALFWORLD_DATA`` unset, the config's ``data_dir`` finds the tasks (the family's task
    source) and the games (the env the actor pool builds from the same kwargs)."""
    from agentrl_jax.envs import registry

    root, _, _ = demo
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))  # the games rebuilt here
    kwargs = dict(
        _parsed_config("alfworld_gagpo", f"--config.env.kwargs.data_dir={root}").env.kwargs
    )
    tasks = registry.family("alfworld").tasks("all", "train", 10, kwargs)
    assert sorted(t.id for t in tasks) == sorted(
        alfworld_scenes.demo_task_id(t) for t in alfworld_data.TASK_TYPES
    )
    env = registry.make_env("alfworld", **kwargs)
    try:
        assert env.reset(tasks[0]).admissible_commands
    finally:
        env.close()
    monkeypatch.setenv("ALFWORLD_DATA", str(root))  # the default, None, reads it
    kwargs = dict(_parsed_config("alfworld_gagpo").env.kwargs)
    assert len(registry.family("alfworld").tasks("all", "train", 10, kwargs)) == len(tasks)


def test_pack_is_unpacked_once_into_the_cache(demo, tmp_path):
    root, _, _ = demo
    pack = tmp_path / "src" / alfworld_data.TARBALL_NAME
    pack.parent.mkdir()
    with tarfile.open(pack, "w:xz") as tar:
        tar.add(root / "json_2.1.1", arcname="json_2.1.1")
    cache = tmp_path / "cache"
    first = alfworld_data.resolve_data_dir(pack, cache)
    stamp = (first / "json_2.1.1").stat().st_mtime_ns
    assert alfworld_data.resolve_data_dir(pack.parent, cache) == first  # Folder holding the pack.
    assert (first / "json_2.1.1").stat().st_mtime_ns == stamp  # Reused, not unpacked again.
    assert alfworld_data.list_task_ids(first, "train") == alfworld_data.list_task_ids(root, "train")
    broken = tmp_path / "broken.tar.xz"
    broken.write_bytes(b"not a tarball")
    with pytest.raises(alfworld_data.MissingDataError, match="cannot unpack"):
        alfworld_data.resolve_data_dir(broken, cache)


def test_tasks_are_named_and_typed(demo):
    _, _, env = demo
    tasks = env.tasks()
    assert [t.id for t in tasks] == sorted(
        alfworld_scenes.demo_task_id(t) for t in alfworld_data.TASK_TYPES
    )
    assert {t.env for t in tasks} == {"alfworld"} and {t.split for t in tasks} == {"train"}
    assert {alfworld_data.task_type_of(t.id) for t in tasks} == set(alfworld_data.TASK_TYPES)
    heat = env.tasks(task_types=["pick_heat_then_place_in_recep"])
    assert [t.id for t in heat] == [alfworld_scenes.demo_task_id("pick_heat_then_place_in_recep")]
    with pytest.raises(ValueError, match="unknown ALFWorld split"):
        env.tasks("test")
    with pytest.raises(ValueError, match="unknown ALFWorld task types"):
        env.tasks(task_types=["pick_and_eat"])


def test_game_file_is_rebuilt_like_alfworld_and_cached(demo):
    root, cache, _ = demo
    from alfworld.gen import goal_library
    from alfworld.info import ALFRED_PDDL_PATH, ALFRED_TWL2_PATH

    task_type = "pick_two_obj_and_place"
    task_id = alfworld_scenes.demo_task_id(task_type)
    path = alfworld_games.build_game(root, "train", task_id, cache_dir=cache)
    game = json.loads(path.read_text())
    src = root / "json_2.1.1" / "train" / task_id
    assert game["pddl_domain"] == pathlib.Path(ALFRED_PDDL_PATH).read_text()
    assert game["pddl_problem"] == (src / "initial_state.pddl").read_text()
    # The grammar is the shipped one with UNKNOWN GOAL replaced by one of alfworld's templates.
    shipped = pathlib.Path(ALFRED_TWL2_PATH).read_text()
    params = json.loads((src / "traj_data.json").read_text())["pddl_params"]
    goals = [
        t.format(obj="alarmclock", recep="diningtable", toggle="", mrecep="")
        for t in goal_library.gdict[task_type]["templates"]
    ]
    used = [g for g in goals if f"Your task is to: {g}." in game["grammar"]]
    assert params["object_target"] == "AlarmClock" and len(used) == 1
    assert game["grammar"].replace(used[0], "UNKNOWN GOAL") == shipped
    # The expert reads the task parameters from the game's folder.
    assert json.loads((path.parent / "traj_data.json").read_text())["pddl_params"] == params

    stamp = path.stat().st_mtime_ns
    assert alfworld_games.build_game(root, "train", task_id, cache_dir=cache) == path
    assert path.stat().st_mtime_ns == stamp  # Cache hit: not rewritten.
    path.write_text('{"pddl_domain": "trunc')  # A corrupt cached file is rebuilt.
    assert alfworld_games.build_game(root, "train", task_id, cache_dir=cache) == path
    assert json.loads(path.read_text())["grammar"] == game["grammar"]  # Same seeded goal text.


def test_expert_wins_every_demo_task_type(demo):
    _, _, env = demo
    results = []
    for task in env.tasks():
        info, rewards, transcript = _play_expert(env, task)
        assert info["won"] and info["score"] == 1.0 and not info["truncated"], transcript
        assert rewards[-1] == 1.0 and sum(rewards) == 1.0  # Sparse: 1 on the winning step only.
        assert info["task_type"] == alfworld_data.task_type_of(task.id)
        results.append((task.id, info["won"]))
    rates = success_by_task_type(results)
    assert rates == {**{t: 1.0 for t in alfworld_data.TASK_TYPES}, "all": 1.0}


def test_observation_fields_and_determinism(demo):
    _, _, env = demo
    task = _task("pick_heat_then_place_in_recep")
    obs = env.reset(task)
    assert obs.objective in (
        "heat some apple and put it in diningtable.",
        "put a hot apple in diningtable.",
    )
    assert obs.text.startswith("You are in the middle of a room.") and "Welcome" not in obs.text
    assert "you see a cabinet 1" in obs.text and obs.feedback == ""
    assert obs.inventory == "You are not carrying anything."
    assert "go to countertop 1" in obs.admissible_commands and "look" in obs.admissible_commands
    assert env.last_info["expert_action"] == "look"  # alfworld's expert always starts with look.
    assert env.reset_info() == env.last_info and env.reset_info()["steps"] == 0
    _, _, first = _play_expert(env, task)
    _, _, second = _play_expert(env, task)
    assert first == second  # Same actions, texts and state keys: the expert is seeded.
    obs = env.reset(task)
    env.step("go to countertop 1")
    obs, _, _, info = env.step("take apple 1 from countertop 1")
    assert obs.inventory == "You are carrying: a apple 1."
    assert not info["invalid_action"]


def test_state_key_is_exact_where_text_is_not(demo):
    _, _, env = demo
    task = _task("pick_and_place_simple")
    env.reset(task)
    start = env.last_info["state_key"]
    env.reset(task)
    assert env.last_info["state_key"] == start  # Same task, same state: same key.
    obs, _, _, info = env.step("open the pod bay doors")
    assert obs.feedback == NOTHING and info["invalid_action"] and info["state_key"] == start
    _, _, _, at_counter = env.step("go to countertop 1")
    assert at_counter["state_key"] != start and not at_counter["invalid_action"]
    obs, _, _, info = env.step("open the pod bay doors")
    # Same text as at the start, different true state: the key tells them apart.
    assert obs.feedback == NOTHING and info["state_key"] == at_counter["state_key"] != start
    env.step("go to shelf 1")
    _, _, _, back = env.step("go to countertop 1")
    assert back["state_key"] == at_counter["state_key"]  # Going back restores the same state.

    # An independent check on the engine: keys are equal exactly when the sets of true atoms
    # are (the engine also keeps "not_..." negations of deleted atoms: history, not state).
    def atoms():
        return {str(f) for f in env._engine.state["_facts"] if not f.name.startswith("not_")}

    facts_back = atoms()
    env.step("look")
    _, _, _, looked = env.step("go to countertop 1")
    facts_looked = atoms()
    assert (looked["state_key"] == back["state_key"]) == (facts_looked == facts_back)
    assert facts_looked != facts_back  # 'look' marks the location as checked in the domain.


@pytest.mark.parametrize(
    "action, note",
    [
        ("", "empty action"),
        ("   \n\t ", "empty action"),
        ("go to " + "countertop " * 2000, "cut from"),
        (b"go to \xff\xfe countertop 1", "non-UTF-8 bytes replaced"),
        ("take \udcff from countertop 1", "invalid Unicode replaced"),
        (None, "action was None"),
        (12345, "converted to text"),
        ("look\nlook\nlook", ""),
        ("GO TO COUNTERTOP 1", ""),
    ],
)
def test_malformed_actions_get_feedback_and_the_episode_goes_on(demo, action, note):
    _, _, env = demo
    task = _task("pick_cool_then_place_in_recep")
    env.reset(task)
    start = env.last_info["state_key"]
    obs, reward, done, info = env.step(action)
    assert obs.feedback == NOTHING and info["invalid_action"] and reward == 0.0 and not done
    assert info["state_key"] == start and note in info["action_note"]
    assert (info["action_note"] == "") == (note == "")
    obs, reward, done, info = env.step("go to countertop 1")  # The episode goes on.
    assert obs.feedback.startswith("You arrive at countertop 1.") and not done


def test_clean_action_outputs_engine_safe_text():
    text, note = clean_action(b"\xc3\xa9t\xff")
    assert text == "\u00e9t\ufffd" and note == "non-UTF-8 bytes replaced"
    assert clean_action("go to desk 1") == ("go to desk 1", "")
    text, _ = clean_action("x" * 10_000)
    assert len(text) == 512
    text.encode("utf-8")  # Always encodable.


def test_step_limit_and_stepping_after_the_end(demo):
    root, cache, _ = demo
    env = ALFWorldEnv(data_dir=root, cache_dir=cache, max_steps=3, expert=None)
    with pytest.raises(RuntimeError, match="before reset"):
        env.step("look")
    obs = env.reset(_task("look_at_obj_in_light"))
    assert env.last_info["expert_action"] is None  # No expert asked for.
    outcomes = [env.step("look") for _ in range(3)]
    assert [o[2] for o in outcomes] == [False, False, True]
    assert outcomes[-1][3]["truncated"] and not outcomes[-1][3]["won"] and outcomes[-1][1] == 0.0
    obs, reward, done, info = env.step("look")
    assert done and reward == 0.0 and "episode is over" in info["action_note"]
    env.close()
    env.close()  # Safe twice.


def test_bad_task_input_gives_clear_errors_and_the_env_survives(demo, tmp_path):
    _, cache, env = demo
    root = tmp_path / "data"
    good_type, bad_type = "pick_and_place_simple", "pick_heat_then_place_in_recep"
    alfworld_scenes.write_demo_tasks(root, task_types=(good_type, bad_type))
    bad = ALFWorldEnv(data_dir=root, cache_dir=cache)
    bad_dir = root / "json_2.1.1" / "train" / alfworld_scenes.demo_task_id(bad_type)
    pddl = bad_dir / "initial_state.pddl"

    pddl.write_text(pddl.read_text().replace("(:init", "(:init (atLocation agent1"))  # Unbalanced.
    with pytest.raises(Exception, match="initial_state|ALFWorld game") as err:
        bad.reset(_task(bad_type))
    assert "pick_heat_then_place_in_recep" in str(err.value)
    obs = bad.reset(_task(good_type))  # The env goes on with a good task.
    assert obs.objective and bad.step("look")[0].feedback

    pddl.write_bytes(b"\xff\xfe not text")
    with pytest.raises(alfworld_data.TaskDataError, match="initial_state.pddl"):
        bad.reset(_task(bad_type))
    (bad_dir / "traj_data.json").write_text('{"task_type": "pick_heat_then_place_in_recep"}')
    with pytest.raises(alfworld_data.TaskDataError, match="pddl_params"):
        bad.reset(_task(bad_type))
    with pytest.raises(alfworld_data.TaskDataError, match="is missing"):
        bad.reset(Task("alfworld", "train", "pick_and_place_simple-X-None-Y-1/trial_T0"))
    with pytest.raises(alfworld_data.TaskDataError, match="must look like"):
        bad.reset(Task("alfworld", "train", "pick_and_place_simple-X/../../etc"))
    with pytest.raises(ValueError, match="not 'alfworld'"):
        bad.reset(Task("textworld", "train", alfworld_scenes.demo_task_id(good_type)))
    with pytest.raises(ValueError, match="does not start with a task type"):
        bad.reset("make_coffee-Mug/trial_T0")
    bad.close()


def test_fast_engine_gives_identical_episodes(demo):
    """alfworld_speedups against TextWorld's own code: every text, command list and key equal."""
    from agentrl_jax.envs.alfworld import speedups as alfworld_speedups

    _, _, env = demo
    task = _task("pick_clean_then_place_in_recep")

    def episode():
        info, _, transcript = _play_expert(env, task)
        return transcript, env._last[0].admissible_commands, info

    alfworld_speedups.uninstall()
    env.fast_engine = False
    try:
        stock = episode()
    finally:
        env.fast_engine = True
        alfworld_speedups.install()
    assert alfworld_speedups.installed()
    assert episode() == stock and stock[2]["won"]
    assert episode() == stock  # Again, now from the memoized translation and parses.
    # A new process's load: the translations come back from the disk cache, or, corrupt there,
    # are translated again and rewritten; the episode is the same either way.
    folder = alfworld_games.translations_dir(demo[1])
    shutil.rmtree(folder, ignore_errors=True)  # the module's other games wrote theirs too
    alfworld_speedups.clear_translation_cache()
    env._loaded = None
    assert episode() == stock
    files = sorted(folder.glob("*.pkl.z"))
    assert len(files) == 2  # the plain and the optimized translation of the problem
    for corrupt in (False, True):
        if corrupt:
            for f in files:
                f.write_bytes(b"not a translation")
        alfworld_speedups.clear_translation_cache()
        env._loaded = None  # the next reset loads the game again
        assert episode() == stock
    assert all(len(f.read_bytes()) > 1000 for f in files)  # rewritten whole


def test_bench_rows_quick():
    from agentrl_jax.benchmarks.alfworld import bench_rows

    rows = bench_rows(quick=True)
    assert [r.workload for r in rows] == [
        "alfworld reset, pool vs 1 process",
        "alfworld step, pool vs 1 process",
        "alfworld step, fast engine vs stock",
        "alfworld reset of the same task, fast engine vs stock",
    ]
    assert [r.unit for r in rows] == ["resets/s", "steps/s", "steps/s", "resets/s"]
    for row in rows:
        assert row.ours > 0 and row.reference > 0 and row.ratio is not None
    assert rows[0].extra["cores"] >= 1 and rows[0].extra["tasks"].startswith("demo room")


def test_planner_expert_wins_with_a_shortest_plan(demo):
    root, cache, _ = demo
    env = ALFWorldEnv(data_dir=root, cache_dir=cache, expert="planner")
    info, rewards, transcript = _play_expert(env, _task("look_at_obj_in_light"))
    env.close()
    assert info["won"] and rewards == [0.0, 0.0, 0.0, 1.0]
    assert [step[0] for step in transcript[1:]] == [
        "go to shelf 1",
        "take alarmclock 1 from shelf 1",
        "go to sidetable 1",
        "use desklamp 1",
    ]
    with pytest.raises(ValueError, match="unknown ALFWorld expert"):
        ALFWorldEnv(data_dir=root, cache_dir=cache, expert="oracle")
