"""A fault-tolerant pool of env worker processes behind a batched reset/step API.

    with ActorPool("textworld", {"max_steps": 50}, num_workers=2, envs_per_worker=4) as pool:
        pending = pool.reset_async(tasks)        # workers start resetting now ...
        ...                                      # ... while the learner does other work
        results = pending.result()               # list[StepResult], one per task
        results = pool.step(["go north", ...])   # one action per episode (None: skip it)

Or slot by slot, without waiting for a whole batch (the rollout's continuous batching):

        pool.submit("reset", {0: task_a, 5: task_b})  # returns at once
        pool.submit("step", {3: "open door"})
        answers = pool.poll(timeout=1.0)        # {slot: StepResult}, whatever has arrived

Episode ``i`` of a batch lives in slot ``i``; slots are spread round-robin over the workers
(slot ``i`` -> worker ``i % num_workers``), so even a small batch uses every worker. Each worker
owns ``envs_per_worker`` envs built through the registry by name, so any registered family
(TextWorld, ALFWorld, SWE) runs here; the pool knows nothing about any of them. A worker steps
its envs' steps concurrently with ``concurrent_envs=True`` (``env.concurrent_steps``), each env
on a thread of its own: a slow step (a test suite, a remote env, ``env.kwargs.step_latency_s``)
then holds up only its own episode, and engines that release the GIL (TextWorld's, subprocesses)
run side by side. An env's own ops never overlap: the pool sends an episode's next op only after
its answer. Resets always run one at a time (loading a TextWorld game is not thread-safe), on the
worker's loop thread, beside other envs' steps: an engine that keeps per-process state guards it
itself (ALFWorld's takes a per-process lock, ``envs/alfworld/engine.py``'s ``ENGINE_LOCK``).

Faults: a worker that dies (segfault, ``os._exit``, OOM kill), or that has not answered an op
within ``step_timeout_s`` (``reset_timeout_s`` for a reset) of sending it, is killed and
restarted. Every live episode it held is lost: its op in flight, or its next step if it had
none, comes back with ``infra_failure=True`` and ``done=True`` so the trainer can drop it from
the update. An env that raises an exception fails only that episode (the worker lives on).
``pool.metrics`` counts all of it. Results never depend on which worker ran an episode, so a
pool is as deterministic as its envs.

Scripts: the workers start through multiprocessing's forkserver (or spawn), which imports the
main module again in each worker. A script must build its pool under
``if __name__ == "__main__":``; one that builds it at import time would build another pool in
every worker as it starts, and the pool says so when its workers die that way.

Shutdown: ``close()`` (also on ``with`` exit, when the pool is garbage-collected and at
interpreter exit) asks each worker to stop, then kills the stragglers; workers ignore SIGINT (the
parent decides) and exit by themselves if the parent process disappears, so no orphans are left
behind. The cleanup is a ``weakref.finalize`` of the workers alone, not a ``__del__``: it runs at
most once, before the interpreter tears module globals down, and never after.
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import dataclasses
import multiprocessing as mp
import multiprocessing.connection as mp_connection
import os
import signal
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Sequence
from concurrent import futures
from typing import Any

from agentrl_jax.envs import base, registry
from agentrl_jax.envs.base import Observation, Task


@dataclasses.dataclass
class StepResult:
    """One episode's answer to a reset or a step.

    Attributes:
      observation: the env's observation (None when the episode failed or was skipped).
      reward: the step reward (0.0 after a reset).
      done: the episode ended (won, lost, step limit, or infrastructure failure).
      info: the env's info dict (``won``, ``state_key``, ... see ``agentrl_jax.envs.base``).
      infra_failure: the episode was lost to a worker crash, hang or env exception; leave it out
        of the update (it says nothing about the policy).
      error: what went wrong, when ``infra_failure``.
    """

    observation: Observation | None
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    infra_failure: bool = False
    error: str | None = None


def _failure(error: str) -> StepResult:
    return StepResult(observation=None, done=True, infra_failure=True, error=error)


class PendingResets:
    """Resets sent to the workers and not yet collected; ``result()`` waits for them."""

    def __init__(self, pool: ActorPool, episodes: int):
        self._pool = pool
        self._episodes = episodes
        self._results: list[StepResult] | None = None

    def result(self) -> list[StepResult]:
        """Waits for every reset and returns one StepResult per task, in task order."""
        if self._results is None:
            self._results = self._pool._collect(self, self._episodes)
        return self._results


class _Worker:
    """The parent's handle on one worker process."""

    def __init__(
        self, ctx, index: int, env_path: str, env_kwargs: dict, num_envs: int, concurrent: bool
    ):
        self.index = index
        self.conn, child_conn = ctx.Pipe(duplex=True)
        self.process = ctx.Process(
            target=_worker_main,
            args=(child_conn, env_path, env_kwargs, num_envs, os.getpid(), concurrent),
            name=f"agentrl-env-worker-{index}",
            daemon=True,
        )
        self.process.start()
        # The parent must drop its copy of the child's end: otherwise a dead worker's pipe never
        # reports EOF and a crash would look like a hang.
        child_conn.close()

    def wait_ready(self, timeout_s: float) -> None:
        if not self.conn.poll(timeout_s):
            raise RuntimeError(f"env worker {self.index} did not start within {timeout_s:.0f} s")
        try:
            kind, payload = self.conn.recv()
        except (EOFError, OSError) as e:
            self.process.join(timeout=5.0)  # its exit code, if it is done dying
            cause = _unguarded_main()
            if cause is not None:
                raise RuntimeError(
                    f"env worker {self.index} died while starting (exit code "
                    f"{self.process.exitcode}): {cause}"
                ) from e
            raise RuntimeError(
                f"env worker {self.index} died while building its envs (exit code "
                f"{self.process.exitcode})"
            ) from e
        if kind != "ready":
            raise RuntimeError(f"env worker {self.index} could not build its envs:\n{payload}")

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=10)
        self.conn.close()

    def stop(self, timeout_s: float) -> None:
        with contextlib.suppress(OSError, ValueError):  # Already dead or closed.
            self.conn.send(("close", None))
        self.process.join(timeout=timeout_s)
        self.kill()


class ActorPool:
    """N worker processes, each owning several envs, stepped in batches.

    Args:
      env_name: a registered env name (``agentrl_jax.envs.registry``) or a "module:attr" path.
      env_kwargs: keyword arguments for the env factory, the same in every worker.
      num_workers: worker processes (default: the core count).
      envs_per_worker: envs each worker owns; the pool holds ``num_workers * envs_per_worker``
        episodes at once.
      step_timeout_s: a worker silent this long during a step is declared hung and restarted
        (the clock restarts at each result it sends, so this bounds one env step).
      reset_timeout_s: the same bound for one reset.
      start_timeout_s: how long a worker may take to start and build its envs.
      mp_context: "forkserver" (default) or "spawn"; never "fork", which is unsafe once JAX or
        any other threaded library is loaded in the parent.
      concurrent_envs: a worker runs each env's steps on a thread of its own, so its envs step
        side by side (for envs whose steps wait: remote, subprocesses, a step latency); False
        (default) steps them one after another.
    """

    def __init__(
        self,
        env_name: str,
        env_kwargs: dict[str, Any] | None = None,
        *,
        num_workers: int | None = None,
        envs_per_worker: int = 1,
        step_timeout_s: float = 60.0,
        reset_timeout_s: float = 120.0,
        start_timeout_s: float = 120.0,
        mp_context: str = "forkserver",
        concurrent_envs: bool = False,
    ):
        if mp_context not in ("forkserver", "spawn"):
            raise ValueError(f"mp_context={mp_context!r}: expected 'forkserver' or 'spawn'")
        if getattr(mp.current_process(), "_inheriting", False):
            # multiprocessing is starting this process and runs the main module again: a pool
            # built at import time would start workers of its own, endlessly.
            raise RuntimeError(
                "ActorPool: built while multiprocessing starts a worker process and imports the "
                "main module again, so the module builds the pool when it is imported; "
                f"{_GUARD_ADVICE}"
            )
        self.num_workers = num_workers or os.cpu_count() or 1
        if self.num_workers < 1 or envs_per_worker < 1:
            raise ValueError(
                f"num_workers={self.num_workers} and envs_per_worker={envs_per_worker} "
                "must both be >= 1"
            )
        self.envs_per_worker = envs_per_worker
        self.capacity = self.num_workers * envs_per_worker
        self.step_timeout_s = step_timeout_s
        self.reset_timeout_s = reset_timeout_s
        self.start_timeout_s = start_timeout_s
        self.concurrent_envs = concurrent_envs
        self._env_path = registry.resolve(env_name)  # Raises on an unknown name, here.
        self._env_kwargs = dict(env_kwargs or {})
        self._ctx = mp.get_context(mp_context)
        self.metrics: dict[str, float] = {
            "resets": 0,
            "steps": 0,
            "infra_failures": 0,
            "worker_crashes": 0,
            "worker_hangs": 0,
            "worker_restarts": 0,
            "env_exceptions": 0,
            "reset_wait_s": 0.0,
            "step_wait_s": 0.0,
        }
        # Changed in place only: the finalizer below holds this list, never the pool.
        self._workers: list[_Worker] = []
        self._closed = False
        # Stops the workers on close(), when the pool is collected, or at exit, before module
        # globals are torn down (a finalizer never runs during the teardown). Registered with
        # atexit too, so that it runs before multiprocessing's exit hook, which would terminate
        # the (daemonic) workers without letting them close their envs.
        self._finalizer = weakref.finalize(self, _stop_workers, self._workers)
        atexit.register(self._finalizer)
        # Per slot: a live episode; why it was lost (reported at its next step).
        self._alive: list[bool] = [False] * self.capacity
        self._lost: list[str | None] = [None] * self.capacity
        self._batch = 0  # episodes of the last ``reset_async`` (the batch ``step`` takes)
        self._pending: PendingResets | None = None
        # Ops sent and not answered: slot -> (kind, deadline, timeout_s).
        self._inflight: dict[int, tuple[str, float, float]] = {}
        self._early: dict[int, StepResult] = {}  # answers known at submit (lost episodes)
        try:
            for w in range(self.num_workers):
                self._workers.append(self._start_worker(w, wait=False))
            for worker in self._workers:
                worker.wait_ready(self.start_timeout_s)
        except BaseException:
            self.close()
            raise

    # ----------------------------------------------------------------------------- public API

    def reset_async(self, tasks: Sequence[Task]) -> PendingResets:
        """Starts resetting one env per task and returns at once (collect with ``.result()``).

        Episode ``i`` of the new batch is ``tasks[i]``, in slot ``i``; the previous batch is
        forgotten.
        """
        self._check_open()
        if self._pending is not None:
            raise RuntimeError("collect the pending resets (.result()) before starting new ones")
        if not 0 < len(tasks) <= self.capacity:
            raise ValueError(
                f"got {len(tasks)} tasks; the pool holds 1..{self.capacity} episodes "
                f"({self.num_workers} workers x {self.envs_per_worker} envs)"
            )
        self._wait_all()  # a new batch starts clean: what is still in flight is dropped
        self._alive = [False] * self.capacity
        self._lost = [None] * self.capacity
        self._batch = len(tasks)
        self.submit("reset", dict(enumerate(tasks)))
        self._pending = PendingResets(self, len(tasks))
        return self._pending

    def reset(self, tasks: Sequence[Task]) -> list[StepResult]:
        """Resets one env per task and waits: one StepResult per task (observation set)."""
        return self.reset_async(tasks).result()

    def step(self, actions: Sequence[str | None]) -> list[StepResult | None]:
        """Steps every episode whose action is not None; returns one result per episode.

        Args:
          actions: one entry per episode of the current batch (the tasks of the last reset);
            None skips an episode (it is done, or the policy has nothing for it yet).

        Returns:
          A list as long as ``actions``: a StepResult for each stepped episode, None where the
          action was None.
        """
        self._check_open()
        if self._pending is not None:
            raise RuntimeError("collect the pending resets (.result()) before stepping")
        if len(actions) != self._batch:
            raise ValueError(f"got {len(actions)} actions for a batch of {self._batch} episodes")
        items = {ep: a for ep, a in enumerate(actions) if a is not None}
        for ep in items:
            if not self._alive[ep] and self._lost[ep] is None:
                raise ValueError(f"episode {ep} is done; pass None as its action")
        out: list[StepResult | None] = [None] * len(actions)
        if items:
            t0 = time.perf_counter()
            self.submit("step", items)
            for ep, result in self._wait_all().items():
                out[ep] = result
            self.metrics["step_wait_s"] += time.perf_counter() - t0
        return out

    def submit(self, kind: str, items: dict[int, Any]) -> None:
        """Sends ops and returns at once: ``kind`` "reset" with ``{slot: task}`` (a new episode
        in each slot) or "step" with ``{slot: action}``. Collect the answers with ``poll``.

        Raises:
          ValueError: a slot outside the pool, a slot with an op still in flight, or a step of
            a slot whose episode is done.
        """
        self._check_open()
        if kind not in ("reset", "step"):
            raise ValueError(f"submit: kind={kind!r}, expected 'reset' or 'step'")
        for slot in items:
            if not 0 <= slot < self.capacity:
                raise ValueError(f"slot {slot} is outside the pool (0..{self.capacity - 1})")
            if slot in self._inflight:
                raise ValueError(f"slot {slot} has an op in flight; poll for its answer first")
        send = {}
        for slot, payload in items.items():
            if kind == "reset":
                self._alive[slot], self._lost[slot] = True, None
            elif self._lost[slot] is not None:  # its worker died: the episode is gone
                self._early[slot] = _failure(self._lost[slot])
                self._alive[slot], self._lost[slot] = False, None
                self.metrics["infra_failures"] += 1
                continue
            elif not self._alive[slot]:
                raise ValueError(f"episode in slot {slot} is done; reset it before stepping")
            send[slot] = payload
        timeout_s = self.reset_timeout_s if kind == "reset" else self.step_timeout_s
        deadline = time.monotonic() + timeout_s
        by_worker: dict[int, list[tuple[int, Any]]] = {}
        for slot, payload in send.items():
            w, local = self._locate(slot)
            by_worker.setdefault(w, []).append((local, payload))
            self._inflight[slot] = (kind, deadline, timeout_s)
        for w, batch in by_worker.items():
            # A dead worker fails the send: poll then sees EOF on its pipe and restarts it.
            with contextlib.suppress(OSError, ValueError):
                self._workers[w].conn.send((kind, batch))

    def poll(self, timeout: float | None = None) -> dict[int, StepResult]:
        """The answers that have arrived, ``{slot: StepResult}``, waiting up to ``timeout``
        seconds for the first (None: until one arrives or nothing is in flight; 0: no wait).

        A worker that crashed or passed an op's deadline is restarted here: its ops in flight
        come back as infra failures, and its other live episodes are lost (their next step
        answers so).
        """
        out, self._early = self._early, {}
        end = None if timeout is None else time.monotonic() + timeout
        while self._inflight and not out:
            waiting = {self._locate(slot)[0] for slot in self._inflight}
            conns = {self._workers[w].conn: w for w in waiting}
            now = time.monotonic()
            wait = min(d for _, d, _ in self._inflight.values()) - now
            if end is not None:
                wait = min(wait, end - now)
            for conn in mp_connection.wait(list(conns), timeout=max(0.0, wait)):
                w = conns[conn]
                try:
                    while conn.poll():
                        local, result = conn.recv()
                        slot = local * self.num_workers + w
                        kind, _, _ = self._inflight.pop(slot)
                        out[slot] = self._account(slot, kind, result)
                except (EOFError, OSError):
                    self.metrics["worker_crashes"] += 1
                    self._replace_worker(w, out, "crashed")
            now = time.monotonic()
            late = {
                self._locate(slot)[0]: (kind, limit)
                for slot, (kind, deadline, limit) in self._inflight.items()
                if deadline <= now
            }
            for w, (_, limit) in late.items():
                self.metrics["worker_hangs"] += 1
                self._replace_worker(w, out, f"hung > {limit:g} s")
            if end is not None and time.monotonic() >= end:
                break
        return out

    @property
    def in_flight(self) -> int:
        """Ops sent and not yet answered (or answered and not yet polled)."""
        return len(self._inflight) + len(self._early)

    def close(self) -> None:
        """Stops every worker (asks, then kills after a grace period). Safe to call twice."""
        self._closed = True
        self._finalizer()  # runs _stop_workers once, whoever calls first
        atexit.unregister(self._finalizer)

    def worker_pids(self) -> list[int]:
        """Process ids of the live workers (for tests and monitoring)."""
        return [w.process.pid for w in self._workers]

    def __enter__(self) -> ActorPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------------------ internals

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the actor pool is closed")

    def _start_worker(self, index: int, *, wait: bool = True) -> _Worker:
        worker = _Worker(
            self._ctx,
            index,
            self._env_path,
            self._env_kwargs,
            self.envs_per_worker,
            self.concurrent_envs,
        )
        if wait:
            worker.wait_ready(self.start_timeout_s)
        return worker

    def _locate(self, episode: int) -> tuple[int, int]:
        return episode % self.num_workers, episode // self.num_workers

    def _collect(self, pending: PendingResets, episodes: int) -> list[StepResult]:
        if pending is not self._pending:
            raise RuntimeError("these resets were superseded or already collected")
        t0 = time.perf_counter()
        try:
            results = self._wait_all()
        finally:
            self._pending = None
        self.metrics["reset_wait_s"] += time.perf_counter() - t0
        return [results[ep] for ep in range(episodes)]

    def _wait_all(self) -> dict[int, StepResult]:
        """Every answer to the ops in flight."""
        out: dict[int, StepResult] = {}
        while self.in_flight:
            out.update(self.poll())
        return out

    def _account(self, slot: int, kind: str, result: StepResult) -> StepResult:
        if result.infra_failure:
            self.metrics["infra_failures"] += 1
            if (result.error or "").startswith("env raised"):
                self.metrics["env_exceptions"] += 1
        if result.done:
            self._alive[slot] = False
        self.metrics["resets" if kind == "reset" else "steps"] += 1
        return result

    def _replace_worker(self, w: int, out: dict[int, StepResult], why: str) -> None:
        """Kills and restarts worker ``w``; every live episode it held is lost: an op in flight
        answers with a failure now (into ``out``), another live episode at its next step."""
        self._workers[w].kill()
        self._workers[w] = self._start_worker(w)
        self.metrics["worker_restarts"] += 1
        for slot in range(w, self.capacity, self.num_workers):
            if slot in self._inflight:
                kind, _, _ = self._inflight.pop(slot)
                error = f"worker {w} {why} during {kind}; restarted"
                out[slot] = self._account(slot, kind, _failure(error))
            elif slot in out:
                # Answered before the crash: the env state behind it is gone all the same.
                out[slot] = _failure(f"worker {w} {why}; restarted")
                self._alive[slot] = False
                self.metrics["infra_failures"] += 1
            elif self._alive[slot]:
                self._lost[slot] = f"worker {w} {why}; restarted"  # Reported on its next step.


def _stop_workers(workers: list[_Worker]) -> None:
    """A pool's cleanup (its ``weakref.finalize``): stops and forgets every worker of the list."""
    for worker in workers:
        worker.stop(timeout_s=5.0)
    workers.clear()


_GUARD_ADVICE = 'put the code that builds the pool under `if __name__ == "__main__":`'


def _unguarded_main() -> str | None:
    """Why a worker died while starting, when the main module is the cause; else None.

    The cause: the pool is built by the main script's top-level code, outside an
    ``if __name__ == "__main__":`` block. Found from the call stack (the main module's
    ``<module>`` frame, at the line that is building the pool) and the script's syntax tree.
    """
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not path:  # interactive, python -c, notebooks: nothing is re-imported
        return None
    frame = sys._getframe()
    while frame is not None:
        if frame.f_globals is vars(main) and frame.f_code.co_name == "<module>":
            break
        frame = frame.f_back
    if frame is None:  # built from code the main module did not run at import time
        return None
    line = frame.f_lineno
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        guard = isinstance(node, ast.If) and _is_main_test(node.test)
        if guard and node.lineno <= line <= (node.end_lineno or node.lineno):
            return None  # guarded: the workers' import does not run it
    return (
        f"{path} builds the actor pool when it is imported (line {line}, outside an "
        'if __name__ == "__main__": block), and each worker process (multiprocessing\'s '
        "forkserver or spawn) imports the main module again, which builds a pool again while "
        f"the worker starts; {_GUARD_ADVICE}"
    )


def _is_main_test(test: ast.expr) -> bool:
    """Whether ``test`` is ``__name__ == "__main__"`` (either way round)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return False
    if not isinstance(test.ops[0], ast.Eq):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    consts = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return len(names) == 1 and len(consts) == 1


# ------------------------------------------------------------------------------ worker side


def _worker_main(
    conn, env_path: str, env_kwargs: dict, num_envs: int, parent_pid: int, concurrent: bool
) -> None:
    """A worker's loop: build envs, then answer ("reset"|"step", [(local, payload)]) messages.

    Each item is answered by its own message as soon as it is done. With ``concurrent`` each
    env's steps run on a thread of its own (an env is never sent its next op before its answer,
    so its ops never overlap); resets, and every op otherwise, run one after another in this
    loop.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle.
    threading.Thread(target=_exit_when_orphaned, args=(parent_pid,), daemon=True).start()
    try:
        factory = _factory(registry.load_factory(env_path), env_kwargs)
        envs = [factory(seed=i) for i in range(num_envs)]
    except Exception:  # noqa: BLE001 - reported to the parent, which raises it.
        conn.send(("error", traceback.format_exc()))
        return
    conn.send(("ready", None))
    send_lock = threading.Lock()
    threads = futures.ThreadPoolExecutor(num_envs) if concurrent else None

    def answer(local: int, kind: str, payload) -> None:
        result = _run_one(envs, local, kind, payload, factory)
        with send_lock, contextlib.suppress(OSError, ValueError):  # the parent is gone
            conn.send((local, result))

    while True:
        try:
            kind, batch = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            break
        if kind == "close":
            break
        for local, payload in batch:
            # Resets stay in this loop, one at a time: loading a game is not thread-safe in
            # every engine (TextWorld's grammar parser is shared by the process).
            if threads is None or kind == "reset":
                answer(local, kind, payload)
            else:
                threads.submit(answer, local, kind, payload)
    if threads is not None:
        threads.shutdown(wait=False, cancel_futures=True)
    for env in envs:
        with contextlib.suppress(Exception):  # Best effort on the way out.
            env.close()


def _factory(make, env_kwargs: dict):
    """``factory(seed) -> env``: ``make(**kwargs)``, behind a ``LatencyEnv`` when the kwargs ask
    for a step latency (``env.kwargs.step_latency_s``; its draws seeded by ``seed``)."""
    latency, own = base.split_latency(env_kwargs)

    def build(seed: int = 0):
        env = make(**own)
        return env if latency is None else base.LatencyEnv(env, latency, seed=seed)

    return build


def _run_one(envs, local: int, kind: str, payload, factory) -> StepResult:
    try:
        if kind == "reset":
            obs = envs[local].reset(payload)
            return StepResult(observation=obs, info=envs[local].reset_info())
        obs, reward, done, info = envs[local].step(payload)
        return StepResult(observation=obs, reward=float(reward), done=bool(done), info=info)
    except Exception as e:  # noqa: BLE001 - one episode fails, the worker lives on.
        # The env may be half-updated: replace it so the next reset starts clean.
        with contextlib.suppress(Exception):
            envs[local].close()
        envs[local] = factory(seed=local)
        tb = traceback.format_exc(limit=-3)
        return _failure(f"env raised {type(e).__name__}: {e}\n{tb}")


def _exit_when_orphaned(parent_pid: int) -> None:
    """Ends the worker if the parent process is gone (killed -9 before it could close us)."""
    while True:
        time.sleep(1.0)
        try:
            os.kill(parent_pid, 0)
        except ProcessLookupError:
            os._exit(0)
        except PermissionError:
            pass  # The pid exists (reused by another user's process would be odd; keep going).
