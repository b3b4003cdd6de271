"""SweEnv: the coding environment behind the common Env contract (``agentrl_jax.envs.base``).

    env = SweEnv.from_jsonl("swe_tasks/tasks.jsonl")           # LocalRuntime, sandboxed
    obs = env.reset(Task("swe", "train", "parse__flip_compare__1a2b3c4d"))
    obs, reward, done, info = env.step("```bash\\npython -m pytest -q\\n```")

Each step runs one action: a fenced block (the default, format in ``actions``), or with
``action_format="tools"`` a ``ToolCall`` of one of its function tools (``actions.TOOL_SCHEMAS``:
bash, view, create, str_replace, insert, undo, submit), which the rollout parses from the
policy's own tool-call format, answering with a tool turn. ``submit`` - or reaching
``max_turns``, which submits the current diff - evaluates the agent's diff with the runtime and
ends the episode with the ``reward`` kind chosen ('resolved' or 'verified_ratio'). ``info``
carries ``won``, ``invalid_action``, ``state_key`` (a key of the repository's diff, so equal code
states group together for GiGPO/GAGPO), ``turn``, and at the end ``resolved``,
``verified_ratio``, ``infra_failure`` and ``eval_reason``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from agentrl_jax.envs.base import Env, Observation, Task, ToolCall, stable_key
from agentrl_jax.envs.swe import actions
from agentrl_jax.envs.swe.runtime import LocalRuntime, Runtime, RuntimeSetupError
from agentrl_jax.envs.swe.tasks import SweTask, load_jsonl

INSTRUCTIONS = (
    "You are working in a Python repository (the current directory) to resolve the issue "
    "below. Explore, edit the code, run commands, and submit when done.\n\n" + actions.FORMAT_HELP
)
TOOL_INSTRUCTIONS = (
    "You are working in a Python repository (the current directory) to resolve the issue "
    "below. " + actions.TOOLS_HELP
)
ACTION_FORMATS = ("fenced", "tools")


class SweEnv(Env):
    """A repository-repair environment.

    Args:
      tasks: the task records, looked up by ``Task.id`` (= instance_id).
      runtime_factory: builds the runtime (default: a sandboxed LocalRuntime).
      max_turns: actions before the episode is submitted automatically.
      reward: 'resolved' or 'verified_ratio'.
      output_chars: longest command output shown to the model (head + tail kept).
      command_timeout_s: wall-clock limit of one bash action.
      action_format: 'fenced' (the default: the policy writes fenced blocks, parsed here) or
        'tools' (function tools: ``step`` takes a ``ToolCall``, parsed and checked by the
        rollout against ``tool_schemas``).
    """

    def __init__(
        self,
        tasks: Sequence[SweTask],
        runtime_factory: Callable[[], Runtime] = LocalRuntime,
        max_turns: int = 30,
        reward: str = "resolved",
        output_chars: int = 8000,
        command_timeout_s: float = 60.0,
        action_format: str = "fenced",
    ):
        if action_format not in ACTION_FORMATS:
            raise ValueError(
                f"action_format={action_format!r}: expected one of {list(ACTION_FORMATS)}"
            )
        if reward not in ("resolved", "verified_ratio"):
            raise ValueError(f"reward={reward!r}: expected 'resolved' or 'verified_ratio'")
        if max_turns < 1:
            raise ValueError(f"max_turns={max_turns}: expected >= 1")
        self.tasks = {t.instance_id: t for t in tasks}
        self.runtime_factory = runtime_factory
        self.max_turns, self.reward_kind = max_turns, reward
        self.output_chars, self.command_timeout_s = output_chars, command_timeout_s
        self.action_format = action_format
        self.runtime: Runtime | None = None
        self.editor: actions.FileEditor | None = None
        self.task: SweTask | None = None
        self.turn = 0
        self.done = True

    @classmethod
    def lists_admissible_commands(cls, **kwargs) -> bool:
        return False  # free-form bash and edit actions: there is no list to choose from

    @classmethod
    def tool_schemas(cls, **kwargs) -> tuple[dict[str, Any], ...]:
        """Its function tools with ``action_format="tools"``; none with fenced blocks."""
        return actions.TOOL_SCHEMAS if kwargs.get("action_format") == "tools" else ()

    @classmethod
    def from_jsonl(cls, path: str, **kwargs) -> SweEnv:
        """An env over a JSONL file's tasks; the file's folder (gold patches) is hidden from
        sandboxed commands."""
        folder = os.path.dirname(os.path.abspath(path))
        kwargs.setdefault("runtime_factory", lambda: LocalRuntime(hidden=(folder,)))
        return cls(load_jsonl(path), **kwargs)

    def reset(self, task: Task) -> Observation:
        if task.id not in self.tasks:
            raise KeyError(f"unknown SWE task {task.id!r}; {len(self.tasks)} tasks loaded")
        if self.runtime is None:
            self.runtime = self.runtime_factory()
        self.task = self.tasks[task.id]
        self.runtime.reset(self.task)
        self.editor = actions.FileEditor(self.runtime)
        self.turn, self.done = 0, False
        text = TOOL_INSTRUCTIONS if self.action_format == "tools" else INSTRUCTIONS
        return Observation(objective=self.task.problem_statement, text=text)

    def _state_key(self) -> int:
        return stable_key(self.task.instance_id, self.runtime.diff())

    def step(self, action: str | ToolCall) -> tuple[Observation, float, bool, dict[str, Any]]:
        if self.done or self.task is None:
            raise RuntimeError("step() after the episode ended; call reset(task)")
        tools = self.action_format == "tools"
        if tools != isinstance(action, ToolCall):
            raise TypeError(
                f"SweEnv(action_format={self.action_format!r}) steps with "
                f"{'a ToolCall' if tools else 'text'}; got {type(action).__name__}"
            )
        self.turn += 1
        info: dict[str, Any] = {"won": False, "invalid_action": False, "turn": self.turn}
        try:
            act = actions.from_call(action) if tools else actions.parse_action(action)
        except actions.ActionError as e:
            act = None
            info["invalid_action"] = True
            help_text = "" if tools else f"\n\n{actions.FORMAT_HELP}"
            feedback = f"Invalid action: {e}{help_text}"
        if act is not None and act.tool == "submit":
            return self._finish(info, "submitted")
        if act is not None:
            feedback = self._run(act, info)
        if self.turn >= self.max_turns:
            info["truncated"] = True
            return self._finish(info, f"turn limit ({self.max_turns}) reached: submitted", feedback)
        info["state_key"] = self._state_key()
        obs = Observation(
            objective=self.task.problem_statement,
            text=actions.truncate(feedback, self.output_chars),
            feedback=actions.truncate(feedback, self.output_chars),
        )
        return obs, 0.0, False, info

    def _run(self, act: actions.Action, info: dict[str, Any]) -> str:
        if act.tool == "bash":
            r = self.runtime.exec(act.body, self.command_timeout_s)
            out = r.output
            if r.timed_out:
                out += f"\n[command killed after {self.command_timeout_s:.0f}s]"
            elif r.output_killed:
                out += "\n[command killed: too much output]"
            else:
                out += f"\n[exit code {r.exit_code}]"
            return out
        try:
            return self.editor.run(act)
        except actions.ActionError as e:
            info["invalid_action"] = True
            return f"Error: {e}"

    def _finish(self, info: dict[str, Any], why: str, feedback: str = ""):
        self.done = True
        patch = self.runtime.diff()
        info["state_key"] = stable_key(self.task.instance_id, patch)
        try:
            result = self.runtime.evaluate(patch)
            g, dropped = result.grade, result.dropped_files
        except (RuntimeSetupError, OSError) as e:
            from agentrl_jax.envs.swe.grading import failed_grade

            g, dropped = failed_grade(f"evaluation failed: {e}", True), ()
        reward = g.reward(self.reward_kind)
        info.update(
            won=g.resolved == 1.0,
            resolved=g.resolved,
            verified_ratio=g.verified_ratio,
            infra_failure=g.infra_failure,
            eval_reason=g.reason,
            dropped_files=dropped,
            patch=patch,
        )
        text = f"{feedback}\n{why}. Evaluation: {g.reason}. Reward {reward:.2f}.".strip()
        obs = Observation(objective=self.task.problem_statement, text=text, feedback=text)
        return obs, reward, True, info

    def close(self) -> None:
        if self.runtime is not None:
            self.runtime.close()
            self.runtime = None
