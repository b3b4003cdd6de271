"""The actor pool: batched reset/step, determinism, and real crash/hang recovery."""

import os
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from agentrl_jax.envs import registry
from agentrl_jax.envs.actors import ActorPool
from agentrl_jax.envs.base import Env, Observation, Task, stable_key
from agentrl_jax.envs.textworld.env import TextWorldEnv

pytestmark = pytest.mark.filterwarnings("ignore:.*is not fully supported")


class FaultyEnv(Env):
    """Counts steps; the action "crash" kills the process, "hang" sleeps, "raise" raises.

    A task param ``reset_sleep`` delays its reset (to see resets overlap other work).
    """

    def __init__(self, hang_s: float = 60.0):
        self.hang_s = hang_s

    def reset(self, task):
        time.sleep(task.param("reset_sleep", 0.0))
        if task.param("crash_on_reset"):
            os._exit(7)
        self.task, self.n = task, 0
        return Observation(objective=task.id, text=f"{task.id}:0")

    def step(self, action):
        if action == "crash":
            os._exit(3)  # No cleanup, no exception: what a segfault looks like from outside.
        if action == "hang":
            time.sleep(self.hang_s)
        if action == "raise":
            raise ValueError("boom")
        self.n += 1
        obs = Observation(objective=self.task.id, text=f"{self.task.id}:{self.n}:{action}")
        info = {
            "won": False,
            "invalid_action": False,
            "state_key": stable_key(self.task.id, self.n),
            "pid": os.getpid(),
        }
        return obs, float(self.n), self.n >= 3, info


registry.register("faulty-test", FaultyEnv, overwrite=True)


def _tasks(n, **params):
    return [Task("faulty-test", "train", str(i), tuple(params.items())) for i in range(n)]


@pytest.fixture(scope="module")
def faulty_pool():
    with ActorPool(
        "faulty-test", {"hang_s": 60.0}, num_workers=2, envs_per_worker=2, step_timeout_s=3.0
    ) as pool:
        yield pool


def test_batched_reset_and_step(faulty_pool):
    results = faulty_pool.reset(_tasks(3))
    assert [r.observation.text for r in results] == ["0:0", "1:0", "2:0"]
    out = faulty_pool.step(["a", None, "c"])
    assert out[1] is None
    assert [out[0].observation.text, out[2].observation.text] == ["0:1:a", "2:1:c"]
    assert out[0].reward == 1.0 and not out[0].done and not out[0].infra_failure
    # Episodes 0 and 2 live in the same worker (slot i -> worker i % 2), episode 1 in the other.
    assert out[0].info["pid"] == out[2].info["pid"]
    out = faulty_pool.step(["a", "b", "c"])
    out = faulty_pool.step(["a", "b", "c"])
    assert [r.done for r in out] == [True, False, True]
    with pytest.raises(ValueError, match="episode 0 is done"):
        faulty_pool.step(["a", "b", None])
    with pytest.raises(ValueError, match="got 2 actions for a batch of 3"):
        faulty_pool.step(["a", "b"])
    with pytest.raises(ValueError, match="the pool holds 1..4 episodes"):
        faulty_pool.reset(_tasks(5))


def test_crash_is_recovered_and_its_episodes_marked(faulty_pool):
    faulty_pool.reset(_tasks(4))
    before = faulty_pool.worker_pids()
    metrics = dict(faulty_pool.metrics)
    # Episodes 1 and 3 share worker 1; episode 1 kills it, episode 3 (not stepped) is lost too.
    out = faulty_pool.step(["a", "crash", "c", None])
    assert not out[0].infra_failure and not out[2].infra_failure
    assert out[1].infra_failure and out[1].done and "worker 1 crashed" in out[1].error
    after = faulty_pool.worker_pids()
    assert after[0] == before[0] and after[1] != before[1]
    assert not psutil.pid_exists(before[1]) or psutil.Process(before[1]).status() == "zombie"
    out = faulty_pool.step(["a", None, "c", "d"])
    assert out[3].infra_failure and "worker 1 crashed" in out[3].error
    assert out[0].observation.text == "0:2:a"  # The other worker's episodes went on.
    assert faulty_pool.metrics["worker_crashes"] == metrics["worker_crashes"] + 1
    assert faulty_pool.metrics["worker_restarts"] == metrics["worker_restarts"] + 1
    assert faulty_pool.metrics["infra_failures"] == metrics["infra_failures"] + 2
    # The restarted worker serves new episodes.
    results = faulty_pool.reset(_tasks(4))
    assert not any(r.infra_failure for r in results)
    assert faulty_pool.step(["a"] * 4)[1].observation.text == "1:1:a"


def test_hang_is_timed_out_and_recovered(faulty_pool):
    faulty_pool.reset(_tasks(2))
    hangs = faulty_pool.metrics["worker_hangs"]
    t0 = time.monotonic()
    out = faulty_pool.step(["a", "hang"])
    elapsed = time.monotonic() - t0
    assert 3.0 <= elapsed < 30.0  # step_timeout_s=3, then a restart; never the 60 s sleep.
    assert out[1].infra_failure and "hung > 3 s during step" in out[1].error
    assert not out[0].infra_failure and out[0].observation.text == "0:1:a"
    assert faulty_pool.metrics["worker_hangs"] == hangs + 1
    assert not faulty_pool.reset(_tasks(2))[1].infra_failure


def test_crash_during_reset(faulty_pool):
    tasks = _tasks(2)
    tasks[1] = Task("faulty-test", "train", "1", (("crash_on_reset", True),))
    results = faulty_pool.reset(tasks)
    assert not results[0].infra_failure and results[0].observation.text == "0:0"
    assert results[1].infra_failure and "crashed during reset" in results[1].error
    out = faulty_pool.step(["a", None])
    assert out[0].observation.text == "0:1:a"


def test_env_exception_fails_one_episode_only(faulty_pool):
    faulty_pool.reset(_tasks(4))
    pids = faulty_pool.worker_pids()
    out = faulty_pool.step(["raise", "a", "c", "d"])
    assert out[0].infra_failure and "env raised ValueError: boom" in out[0].error
    assert [r.infra_failure for r in out[1:]] == [False, False, False]
    assert faulty_pool.worker_pids() == pids  # Nobody was restarted.
    assert faulty_pool.step([None, "b", "c", "d"])[2].observation.text == "2:2:c"


def test_resets_are_pipelined(faulty_pool):
    """reset_async returns at once; 4 resets of 1 s on 2 workers take ~2 s, not 4."""
    t0 = time.monotonic()
    pending = faulty_pool.reset_async(_tasks(4, reset_sleep=1.0))
    assert time.monotonic() - t0 < 0.5
    with pytest.raises(RuntimeError, match="collect the pending resets"):
        faulty_pool.step(["a"] * 4)
    time.sleep(1.0)  # "Other work" while the workers reset.
    results = pending.result()
    assert time.monotonic() - t0 < 3.5
    assert [r.observation.text for r in results] == ["0:0", "1:0", "2:0", "3:0"]
    assert pending.result() is results


@pytest.mark.parametrize("concurrent", [False, True], ids=["in_turn", "concurrent"])
def test_pool_is_deterministic_and_matches_sequential(textworld_games, concurrent):
    """TextWorld through 2 workers equals one env played sequentially, step for step, whether
    a worker steps its envs in turn or side by side (``concurrent_envs``)."""
    tasks = textworld_games["train"] + textworld_games["valid"]
    kwargs = {"reward": "dense", "max_steps": 8}
    scripts = ["look", "inventory", "xyzzy", "go north", "go south", "take all", "look", "open it"]

    sequential, reset_keys = [], []
    env = TextWorldEnv(**kwargs)
    for task in tasks:
        steps = [env.reset(task)]
        reset_keys.append(env.reset_info()["state_key"])
        for action in scripts:
            obs, reward, done, info = env.step(action)
            steps.append((obs, reward, done, info))
            if done:
                break
        sequential.append(steps)

    pool = ActorPool(
        "textworld", kwargs, num_workers=2, envs_per_worker=2, concurrent_envs=concurrent
    )
    with pool:
        for _ in range(2):  # Twice: a reused pool gives the same answers.
            resets = pool.reset(tasks)
            assert [r.info["state_key"] for r in resets] == reset_keys
            pooled = [[r.observation] for r in resets]
            for action in scripts:
                actions = [action if len(p) == 1 or not p[-1][2] else None for p in pooled]
                for p, r in zip(pooled, pool.step(actions)):
                    if r is not None:
                        assert not r.infra_failure, r.error
                        p.append((r.observation, r.reward, r.done, r.info))
            assert pooled == sequential
        assert pool.metrics["infra_failures"] == 0


def test_unknown_env_and_bad_kwargs_fail_clearly():
    with pytest.raises(ValueError, match="unknown env 'nope'; valid names: .*textworld"):
        ActorPool("nope", num_workers=1)
    with pytest.raises(RuntimeError, match="(?s)could not build its envs.*reward='shaped'"):
        ActorPool("textworld", {"reward": "shaped"}, num_workers=1)


def test_clean_shutdown_without_close_leaves_no_orphans(tmp_path):
    """A script that never closes its pool exits cleanly: no traceback, no live workers."""
    script = tmp_path / "leaky.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys
            sys.path.insert(0, {os.path.dirname(__file__)!r})
            from agentrl_jax.envs.actors import ActorPool
            from agentrl_jax.envs.base import Task
            if __name__ == "__main__":
                pool = ActorPool("test_actors:FaultyEnv", num_workers=2)
                pool.reset([Task("faulty-test", "train", str(i)) for i in range(2)])
                print("PIDS", *pool.worker_pids(), flush=True)
            """
        )
    )
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=repo
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "Error" not in proc.stderr, proc.stderr
    pids = [int(p) for p in proc.stdout.split("PIDS")[1].split()]
    deadline = time.monotonic() + 5
    while any(psutil.pid_exists(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
    assert not alive, f"orphan workers: {alive}"


def test_a_pool_freed_after_its_module_is_torn_down_exits_quietly(tmp_path):
    """At exit, modules that outlive the last collection (held by a C extension; here by the sys
    module) have their globals set to None in reverse import order, so a pool kept by a module
    imported before actors.py is freed after actors.py's globals are gone. Its cleanup needs
    none of them: stderr stays empty and no worker is left."""
    (tmp_path / "holder.py").write_text("POOLS = []\n")
    script = tmp_path / "exits.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys
            sys.path[:0] = [{str(tmp_path)!r}, {os.path.dirname(__file__)!r}]
            import holder  # before actors.py: its globals are cleared after actors.py's
            from agentrl_jax.envs import actors

            if __name__ == "__main__":
                pool = actors.ActorPool("chaos_env:ChaosEnv", num_workers=1, start_timeout_s=60)
                holder.POOLS.append(pool)
                sys.kept_alive = (holder, actors)  # both outlive the last collection
                print("PIDS", *pool.worker_pids(), flush=True)
            """
        )
    )
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=repo)  # this checkout's package
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "", proc.stderr
    pids = [int(p) for p in proc.stdout.split("PIDS")[1].split()]
    deadline = time.monotonic() + 5
    while any(psutil.pid_exists(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
    assert not alive, f"orphan workers: {alive}"


def _run_script(path, body):
    path.write_text(textwrap.dedent(body))
    return subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, timeout=120, cwd=path.parent
    )


def test_a_script_without_a_main_guard_is_told_to_add_one(tmp_path):
    """The README's snippet saved as a script and run without ``if __name__ == "__main__":``:
    the workers (forkserver) import the main module again, which builds a pool again while they
    start. The error names the cause and the idiom, not only a worker's death."""
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    proc = _run_script(
        tmp_path / "try_pool.py",
        f"""
        import sys
        sys.path.insert(0, {tests_dir!r})
        from agentrl_jax.envs.actors import ActorPool

        pool = ActorPool("chaos_env:ChaosEnv", num_workers=1, start_timeout_s=60)
        print("built", flush=True)
        pool.close()
        """,
    )
    assert proc.returncode == 1 and "built" not in proc.stdout, proc.stdout + proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: env worker 0 died while starting"), proc.stderr
    assert "try_pool.py builds the actor pool when it is imported (line 6" in last, last
    assert 'put the code that builds the pool under `if __name__ == "__main__":`' in last, last
    # The same script with the guard runs.
    proc = _run_script(
        tmp_path / "guarded.py",
        f"""
        import sys
        sys.path.insert(0, {tests_dir!r})
        from agentrl_jax.envs.actors import ActorPool

        if __name__ == "__main__":
            pool = ActorPool("chaos_env:ChaosEnv", num_workers=1, start_timeout_s=60)
            print("built", flush=True)
            pool.close()
        """,
    )
    assert proc.returncode == 0 and "built" in proc.stdout, proc.stderr


def test_close_stops_workers():
    pool = ActorPool("faulty-test", num_workers=2)
    pids = pool.worker_pids()
    pool.close()
    pool.close()  # Twice is fine.
    assert not any(psutil.pid_exists(p) for p in pids)
    with pytest.raises(RuntimeError, match="closed"):
        pool.reset(_tasks(1))


def test_step_latency_wraps_any_env_and_changes_no_answer():
    """``env.kwargs.step_latency_s``: every step of the pool's envs waits that long (a fixed
    delay, or one drawn per step from [low, high]); the answers are the env's own."""
    from agentrl_jax.envs.base import LatencyEnv, parse_latency

    tasks = _tasks(2)
    with (
        ActorPool("faulty-test", {}, num_workers=2, envs_per_worker=1) as plain,
        ActorPool("faulty-test", {"step_latency_s": 0.3}, num_workers=2, envs_per_worker=1) as slow,
    ):
        want = [r.observation.text for r in plain.reset(tasks)]
        assert [r.observation.text for r in slow.reset(tasks)] == want
        t0 = time.perf_counter()
        got = slow.step(["a", "b"])
        waited = time.perf_counter() - t0
        ref = plain.step(["a", "b"])
        assert [(r.observation.text, r.reward, r.done) for r in got] == [
            (r.observation.text, r.reward, r.done) for r in ref
        ]
        # The two workers wait side by side: one delay, not two.
        assert 0.3 <= waited < 0.6, waited

    env = registry.make_env("faulty-test", step_latency_s=[0.05, 0.1])
    assert isinstance(env, LatencyEnv) and (env.low, env.high) == (0.05, 0.1)
    env.reset(tasks[0])
    for _ in range(3):
        t0 = time.perf_counter()
        env.step("a")
        assert 0.05 <= time.perf_counter() - t0 < 0.3
    assert env.hang_s == 60.0  # the wrapped env's attributes
    assert not isinstance(registry.make_env("faulty-test"), LatencyEnv)
    for bad in (-1, [0.2, 0.1], "slow", [0.1], True):
        with pytest.raises(ValueError, match="env.kwargs.step_latency_s is .*; expected seconds"):
            parse_latency(bad)


def test_concurrent_envs_wait_side_by_side_in_one_worker():
    """With ``concurrent_envs`` one worker's envs step at once: 4 steps of 0.3 s take ~0.3 s
    (in turn, 1.2 s); the answers are the same."""
    tasks = _tasks(4)
    answers = {}
    for concurrent in (False, True):
        with ActorPool(
            "faulty-test",
            {"step_latency_s": 0.3},
            num_workers=1,
            envs_per_worker=4,
            concurrent_envs=concurrent,
        ) as pool:
            pool.reset(tasks)
            t0 = time.perf_counter()
            out = pool.step(["a", "b", "c", "d"])
            waited = time.perf_counter() - t0
            answers[concurrent] = [(r.observation.text, r.reward, r.done) for r in out]
        if concurrent:
            assert 0.3 <= waited < 0.7, waited
        else:
            assert waited >= 1.2, waited
    assert answers[True] == answers[False]


def test_submit_and_poll_slot_by_slot():
    """``submit`` returns at once; ``poll`` hands back each slot's answer as it arrives, so a
    slot can be stepped again (or reset with a new task) while others are still stepping."""
    with ActorPool(
        "faulty-test",
        {"hang_s": 1.0},
        num_workers=1,
        envs_per_worker=3,
        concurrent_envs=True,
        step_timeout_s=5.0,
    ) as pool:
        pool.submit("reset", dict(enumerate(_tasks(3))))
        got = {}
        while len(got) < 3:
            got.update(pool.poll())
        assert [got[s].observation.text for s in range(3)] == ["0:0", "1:0", "2:0"]
        t0 = time.perf_counter()
        pool.submit("step", {0: "hang", 1: "a"})  # slot 0 sleeps 1 s
        first = pool.poll()
        assert list(first) == [1] and first[1].observation.text == "1:1:a"
        assert time.perf_counter() - t0 < 0.5
        pool.submit("step", {1: "b"})
        pool.submit("reset", {2: Task("faulty-test", "train", "7", ())})
        got = {}
        while len(got) < 2:
            got.update(pool.poll())
        assert got[1].observation.text == "1:2:b" and got[2].observation.text == "7:0"
        assert pool.poll(timeout=0.0) == {} or pool.in_flight
        late = pool.poll()
        assert late[0].observation.text == "0:1:hang" and pool.in_flight == 0
        assert pool.poll(timeout=0.0) == {}
        with pytest.raises(ValueError, match="slot 3 is outside the pool"):
            pool.submit("step", {3: "a"})
        pool.submit("step", {1: "c"})  # the third step ends it (done)
        assert pool.poll()[1].done
        with pytest.raises(ValueError, match="episode in slot 1 is done; reset it before stepping"):
            pool.submit("step", {1: "d"})
        pool.submit("step", {0: "a"})
        with pytest.raises(ValueError, match="slot 0 has an op in flight"):
            pool.submit("step", {0: "a"})
        assert pool.poll()[0].observation.text == "0:2:a"
