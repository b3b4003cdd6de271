"""A verifiers taskset (verifiers 0.4, ``verifiers.v1``) as an ``Env``: each task's prompt is the
observation, the policy's reply is scored by the task's own rewards (its ``@vf.reward``
methods, the config's plugged reward functions and judges: verifiers' ``Task.score``), and the
episode ends.

    make_env("verifiers", taskset="my_taskset")      # vf.load_taskset(TasksetConfig(id=...))

verifiers 0.4 no longer has ``MultiTurnEnv``, ``ToolEnv`` or a ``Rubric`` class: an environment
is a ``Taskset`` (tasks and their rewards) played by an ``Env`` whose ``run(task, agents)``
drives a harness program that calls the model itself, through an OpenAI-compatible endpoint.
This adapter takes the taskset half: tasks are loaded with verifiers' own loader
(``verifiers.v1.utils.loaders.load_taskset``, which imports the taskset's module and its
``__all__``-exported ``Taskset``), and each reply becomes a ``Trace`` (the prompt, then the reply
as a sampled assistant message) that ``task.score(trace)`` scores with no runtime (rewards that
need a sandbox runtime are skipped, as verifiers skips them offline, and logged). One turn per
episode: tasksets whose ``Env.run`` plays several turns (a game engine or a simulated user
answering) are not adapted. Splits: verifiers' tasksets have none, so a task's split is fixed by
a hash of its ``Task.key`` (1 in 10 ``valid``, 1 in 10 ``test``, the rest ``train``), and a
level is ``all``.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from agentrl_jax.envs.base import Env, Observation, Task, stable_key

HELD_OUT = {0: "valid", 1: "test"}  # stable_key(task key) % 10 -> split; the rest: train
MAX_SCAN = 1_000_000  # tasks read from an endless taskset while looking for a split's tasks


def load(taskset: str, taskset_args: dict[str, Any] | None = None):
    """The taskset ``taskset`` (a verifiers taskset id: an importable module exporting a
    ``Taskset``), built with verifiers' own loader.

    Raises:
      ValueError: naming the id and verifiers' reason when it cannot be loaded.
    """
    import verifiers.v1 as vf  # noqa: PLC0415 - only this family needs it
    from verifiers.v1.utils.loaders import load_taskset  # noqa: PLC0415

    if not taskset:
        raise ValueError("the verifiers env needs env.kwargs.taskset (a verifiers taskset id)")
    try:
        return load_taskset(vf.TasksetConfig(id=taskset, **dict(taskset_args or {})))
    except (ImportError, AttributeError, TypeError, ValueError) as e:
        raise ValueError(f"verifiers taskset {taskset!r} cannot be loaded: {e}") from e


def split_of(key: str) -> str:
    return HELD_OUT.get(stable_key("verifiers", key) % 10, "train")


def verifiers_tasks(level: str, split: str, count: int, env_kwargs: dict[str, Any]) -> list[Task]:
    """The first ``count`` tasks of ``split`` (by key hash) in the taskset's order."""
    if level != "all":
        raise ValueError(f"env 'verifiers' has one level, 'all' (got {level!r})")
    if split not in ("train", "valid", "test"):
        raise ValueError(f"env 'verifiers' has no split {split!r}; its splits: train, valid, test")
    tasks = []
    for task in itertools.islice(
        load(env_kwargs.get("taskset", ""), env_kwargs.get("taskset_args")), MAX_SCAN
    ):
        if split_of(task.key) == split:
            idx = task.data.idx
            tasks.append(Task("verifiers", split, f"{idx}", (("level", level), ("idx", idx))))
            if len(tasks) == count:
                break
    return tasks


class VerifiersEnv(Env):
    """One task of a verifiers taskset per episode, its reply scored by the task's rewards.

    Args:
      taskset: the verifiers taskset id (a module exporting its ``Taskset`` in ``__all__``).
      taskset_args: more ``TasksetConfig`` fields (the taskset's own settings).
      win_reward: a reply whose (weighted, summed) reward is at least this is a win.
    """

    def __init__(
        self, taskset: str = "", taskset_args: dict | None = None, win_reward: float = 1.0
    ):
        # Loaded on the first reset, not here: importing verifiers takes seconds to tens of
        # seconds on a busy machine, and an actor worker builds its envs before it reports
        # ready (a reset has its own timeout, and an env that raises there fails one episode).
        self.taskset_id, self.taskset_args = taskset, dict(taskset_args or {})
        self.win_reward = win_reward
        self._tasks: list[Any] = []
        self._stream = None

    @classmethod
    def lists_admissible_commands(cls, **kwargs: Any) -> bool:
        return False  # a reply is free text

    def _task(self, idx: int):
        if self._stream is None:
            self._stream = iter(load(self.taskset_id, self.taskset_args))
        while len(self._tasks) <= idx:
            self._tasks.append(next(self._stream))
        return self._tasks[idx]

    def reset(self, task: Task) -> Observation:
        self.task = self._task(int(task.param("idx")))
        data = self.task.data
        text = "\n\n".join(t for t in (data.system_prompt, data.prompt_text) if t)
        self.objective = data.description or data.prompt_text.split("\n")[0]
        return Observation(objective=self.objective, text=text)

    def reset_info(self) -> dict[str, Any]:
        return {"state_key": stable_key("verifiers", self.task.key), "won": False}

    def score(self, reply: str):
        """The verifiers ``Trace`` of ``reply`` to the current task, scored."""
        import verifiers.v1 as vf  # noqa: PLC0415
        from verifiers.v1.graph import MessageNode  # noqa: PLC0415
        from verifiers.v1.trace import AgentInfo, Trace, TraceTask  # noqa: PLC0415

        task = self.task
        trace = Trace(
            task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
            agent=AgentInfo(config=vf.AgentConfig()),
        )
        prompt = task.data.prompt
        messages = [vf.UserMessage(content=prompt)] if isinstance(prompt, str) else list(prompt)
        if task.data.system_prompt:
            messages.insert(0, vf.SystemMessage(content=task.data.system_prompt))
        for i, message in enumerate(messages):
            trace.nodes.append(MessageNode(parent=i - 1 if i else None, message=message))
        reply_node = MessageNode(
            parent=len(messages) - 1, message=vf.AssistantMessage(content=reply), sampled=True
        )
        trace.nodes.append(reply_node)
        asyncio.run(task.score(trace))
        return trace

    def step(self, action: str) -> tuple[Observation, float, bool, dict[str, Any]]:
        trace = self.score(action)
        reward = float(trace.reward)
        scores = ", ".join(f"{k} {v.score:g}" for k, v in trace.rewards.items() if v is not None)
        feedback = f"Scored: {scores or 'no rewards'}."
        info = {
            "won": reward >= self.win_reward,
            "invalid_action": False,
            "truncated": False,
            "steps": 1,
            "score": reward,
            "state_key": stable_key("verifiers", self.task.key, action),
        }
        obs = Observation(objective=self.objective, text=feedback, feedback=feedback)
        return obs, reward, True, info
