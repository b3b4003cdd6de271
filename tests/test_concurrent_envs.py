"""Steps on a worker's threads beside resets on its loop thread (``env.concurrent_steps``).

With ``concurrent_envs=True`` an actor worker steps each env on a thread of its own while resets
run on its loop thread, so envs of one process meet in whatever state their engine keeps per
process. These tests play many episodes through one worker with several envs, slot by slot as
the rollout's continuous batching does (a finished slot is reset with the next episode, a new
game, while the others step), and compare every answer (observation, admissible commands,
reward, done, info with its state key and expert action) with the same episodes, the same
actions, played one after another by one env.

The worker switches threads every 10 us instead of CPython's 5 ms, so that threads interleave
inside short critical sections and a race shows within a few episodes. Before ALFWorld's engine
lock (``alfworld_engine.ENGINE_LOCK``) these tests failed: steps died in the grammar parser
(``IndexError: pop from empty list``: tatsu parsers are module-level and keep their state on the
parser object) and the handcoded expert proposed another command than in sequential play (its
seeded draws swap the process-global ``random`` state).
"""

import sys
import zlib

import pytest

from agentrl_jax.envs import registry
from agentrl_jax.envs.actors import ActorPool
from agentrl_jax.envs.alfworld import data as alfworld_data
from agentrl_jax.envs.alfworld import scenes as alfworld_scenes
from agentrl_jax.envs.base import Task

pytestmark = pytest.mark.filterwarnings("ignore:.*is not fully supported")

SWITCH_INTERVAL_S = 1e-5


def switching_env(family: str, **kwargs):
    """The env ``family`` built in a worker that switches threads every 10 us (the pool's
    factory: ``ActorPool("test_concurrent_envs:switching_env", {"family": ..., ...})``)."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    return registry.make_env(family, **kwargs)


def _choose(episode: int, step: int, obs, info) -> str:
    """A deterministic action: mostly the expert's, else an admissible command or nonsense."""
    h = zlib.crc32(f"{episode}:{step}".encode())
    if h % 7 == 0:
        return "xyzzy"
    if h % 3 and info.get("expert_action"):
        return info["expert_action"]
    commands = obs.admissible_commands or ()
    return commands[h % len(commands)] if commands else "look"


def _play_interleaved(pool: ActorPool, episodes: list[Task], max_actions: int):
    """Plays ``episodes`` slot by slot: each slot takes the next episode as soon as its last one
    ends, so resets of new games run while the other slots step.

    Returns:
      ({episode: (task, [(obs, reward, done, info) of the reset and each step], actions)},
       how many resets were sent while another slot had a step in flight).
    """
    queue = list(enumerate(episodes))
    live: dict[int, tuple[int, Task, list, list]] = {}
    stepping: set[int] = set()
    played, overlapped = {}, 0

    def start(slot: int) -> None:
        nonlocal overlapped
        episode, task = queue.pop(0)
        live[slot] = (episode, task, [], [])
        overlapped += bool(stepping)
        pool.submit("reset", {slot: task})

    for slot in range(min(pool.capacity, len(queue))):
        start(slot)
    while live:
        for slot, r in pool.poll().items():
            stepping.discard(slot)
            episode, task, transcript, actions = live[slot]
            assert not r.infra_failure, f"episode {episode} ({task.name}): {r.error}"
            transcript.append((r.observation, r.reward, r.done, r.info))
            if r.done or len(actions) == max_actions:
                played[episode] = (task, transcript, actions)
                del live[slot]
                if queue:
                    start(slot)
                continue
            actions.append(_choose(episode, len(actions), r.observation, r.info))
            stepping.add(slot)
            pool.submit("step", {slot: actions[-1]})
    return played, overlapped


def _replay(env, task: Task, actions: list[str]) -> list:
    obs = env.reset(task)
    transcript = [(obs, 0.0, False, env.reset_info())]
    for action in actions:
        obs, reward, done, info = env.step(action)
        transcript.append((obs, float(reward), bool(done), info))
    return transcript


def _check_against_sequential(
    family: str, kwargs: dict, episodes: list[Task], *, envs: int, max_actions: int, rounds: int
) -> None:
    """``rounds`` fresh workers (cold caches each time) play ``episodes`` interleaved; each
    episode's transcript must equal the same actions played by one env, one episode at a time."""
    env = registry.make_env(family, **kwargs)
    try:
        for _ in range(rounds):
            with ActorPool(
                "test_concurrent_envs:switching_env",
                {"family": family, **kwargs},
                num_workers=1,
                envs_per_worker=envs,
                concurrent_envs=True,
            ) as pool:
                played, overlapped = _play_interleaved(pool, episodes, max_actions)
            assert sorted(played) == list(range(len(episodes)))
            # Most resets after the first wave ran beside other envs' steps.
            assert overlapped >= (len(episodes) - envs) // 2, overlapped
            for episode, (task, transcript, actions) in sorted(played.items()):
                sequential = _replay(env, task, actions)
                for i, (got, want) in enumerate(zip(transcript, sequential, strict=True)):
                    if got != want:
                        pytest.fail(_difference(episode, task, actions[:i], got, want))
    finally:
        env.close()


def _difference(episode: int, task: Task, actions: list[str], got, want) -> str:
    (obs, reward, done, info), (obs_1, reward_1, done_1, info_1) = got, want
    keys = sorted(info.keys() | info_1.keys())
    info_diff = {k: (info.get(k), info_1.get(k)) for k in keys if info.get(k) != info_1.get(k)}
    return (
        f"episode {episode} ({task.name}) after {actions}: the pool answered differently from "
        f"sequential play (pool, sequential): observation "
        f"{'same' if obs == obs_1 else (obs, obs_1)}, reward {(reward, reward_1)}, done "
        f"{(done, done_1)}, info differs in {info_diff}"
    )


def test_textworld_steps_beside_resets_match_sequential(textworld_games):
    """TextWorld is safe as it is: its steps touch no per-process state of the engine (each
    env's Z-machine is its own copy of jericho's libfrotz; state tracking is per env) and only
    resets parse (the logic of a game kind not seen yet), one at a time on the loop thread."""
    games = [*textworld_games["train"], *textworld_games["valid"], *textworld_games["cooking"]]
    episodes = [games[i % len(games)] for i in range(15)]
    _check_against_sequential(
        "textworld", {"max_steps": 8}, episodes, envs=4, max_actions=8, rounds=2
    )


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """(data root, cache dir) with the six demo ALFWorld tasks in the train split."""
    root = tmp_path_factory.mktemp("alfworld_data")
    alfworld_scenes.write_demo_tasks(root)
    return root, tmp_path_factory.mktemp("alfworld_cache")


def _demo_episodes(count: int) -> list[Task]:
    ids = [alfworld_scenes.demo_task_id(t) for t in alfworld_data.TASK_TYPES]
    return [Task("alfworld", "train", ids[i % len(ids)]) for i in range(count)]


@pytest.mark.parametrize(
    "fast_engine,episodes,rounds", [(True, 24, 2), (False, 12, 1)], ids=["fast", "plain"]
)
def test_alfworld_steps_beside_resets_match_sequential(demo, fast_engine, episodes, rounds):
    """ALFWorld on the demo room, with the memoized engine (cold caches in each fresh worker:
    the first steps parse) and without it (every step parses its feedback and commands)."""
    root, cache = demo
    kwargs = {
        "data_dir": str(root),
        "cache_dir": str(cache),
        "max_steps": 8,
        "fast_engine": fast_engine,
    }
    _check_against_sequential(
        "alfworld", kwargs, _demo_episodes(episodes), envs=6, max_actions=8, rounds=rounds
    )


@pytest.mark.slow
@pytest.mark.shared_data
def test_alfworld_real_tasks_steps_beside_resets_match_sequential(shared_data, tmp_path):
    """Four real valid_unseen tasks (the first of four types), eight episodes through 4 envs."""
    cache = tmp_path / "cache"
    root = alfworld_data.resolve_data_dir(shared_data / "alfworld", cache)
    by_type: dict[str, str] = {}
    for task_id in alfworld_data.list_task_ids(root, "valid_unseen"):
        by_type.setdefault(alfworld_data.task_type_of(task_id), task_id)
    ids = [by_type[t] for t in alfworld_data.TASK_TYPES[:4]]
    episodes = [Task("alfworld", "valid_unseen", ids[i % len(ids)]) for i in range(8)]
    kwargs = {"data_dir": str(root), "cache_dir": str(cache), "max_steps": 12}
    _check_against_sequential("alfworld", kwargs, episodes, envs=4, max_actions=12, rounds=2)
