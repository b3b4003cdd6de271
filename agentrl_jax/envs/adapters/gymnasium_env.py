"""Any registered gymnasium env whose observations and actions are text, as an ``Env``.

    make_env("gymnasium", module="my_envs")            # my_envs registers its ids on import
    env.reset(Task("gymnasium", "train", "MyText-v0/3", (("level", "MyText-v0"), ("seed", 3))))

The env is built with ``gymnasium.make(level)`` and must have ``gymnasium.spaces.Text``
observation and action spaces; any other space is refused, naming the env and the space (a
``Box`` of pixels or a ``Discrete`` action has no text to show or to write). Episodes are seeded
through ``reset(seed=...)``. What the adapter reads beyond the five-tuple, from the env's
``info`` (each optional):

- ``objective``: the goal line (default: the env id);
- ``admissible_commands``: the valid actions now, so ``rollout.constrain_actions`` can write one;
- ``won`` (or gymnasium's ``is_success``): success; without either, an episode is won when it
  terminates with a reward of at least ``win_reward``;
- ``state_key`` (an int): the env's own state key; without it, the key is the seed and the
  actions played so far (equal histories of a deterministic env are equal states; GiGPO then
  groups less than it could, never wrongly).

An action outside the action space (too long, a character outside its charset) is not sent: it
counts as a step and an invalid action, with feedback naming the space.
"""

from __future__ import annotations

import importlib
from typing import Any

from agentrl_jax.envs.base import Env, Observation, Task, stable_key


def import_module(module: str) -> None:
    """Imports ``module`` (whose import registers gymnasium ids), naming it when it fails."""
    if not module:
        return
    try:
        importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"env.kwargs.module={module!r} (the module that registers the gymnasium env) cannot "
            f"be imported: {e}"
        ) from e


def check_text_env(env_id: str, module: str = "") -> None:
    """Raises when ``env_id`` is not a registered gymnasium env with Text spaces."""
    make(env_id, module).close()


def make(env_id: str, module: str = "", **make_kwargs: Any):
    """``gymnasium.make(env_id)`` after importing ``module``, its spaces checked to be text.

    Raises:
      ValueError: ``env_id`` is not registered (listing close ids), or a space is not
        ``gymnasium.spaces.Text`` (naming the env and the space).
    """
    import gymnasium  # noqa: PLC0415 - only this family needs it

    import_module(module)
    try:
        gymnasium.spec(env_id)
    except gymnasium.error.Error as e:
        raise ValueError(
            f"gymnasium env {env_id!r} is not registered ({e}); register it with "
            "gymnasium.register in a module named by env.kwargs.module"
        ) from e
    env = gymnasium.make(env_id, **make_kwargs)
    for what in ("observation_space", "action_space"):
        space = getattr(env, what)
        if not isinstance(space, gymnasium.spaces.Text):
            env.close()
            raise ValueError(
                f"gymnasium env {env_id!r} has {what}={space!r}; the gymnasium adapter needs "
                "text (gymnasium.spaces.Text) observations and actions"
            )
    return env


class GymnasiumEnv(Env):
    """A gymnasium text env behind the ``Env`` contract.

    Args:
      module: a module to import first, whose import registers the env ids (gymnasium's own
        ``"module:EnvId"`` form, split in two so the level stays a plain id).
      max_steps: the step that reaches it ends the episode (``info["truncated"]``), on top of
        the env's own ``TimeLimit``.
      admissible_commands: pass the env's ``info["admissible_commands"]`` on (False: never).
      win_reward: an episode that terminates with at least this reward is won, when the env's
        info says neither ``won`` nor ``is_success``.
      make_kwargs: keyword arguments for ``gymnasium.make``.
    """

    def __init__(
        self,
        module: str = "",
        max_steps: int = 50,
        admissible_commands: bool = True,
        win_reward: float = 1.0,
        make_kwargs: dict[str, Any] | None = None,
    ):
        self.module = module
        self.max_steps = max_steps
        self.admissible_commands = admissible_commands
        self.win_reward = win_reward
        self.make_kwargs = dict(make_kwargs or {})
        self._env = None
        self._env_id = ""

    def _observation(self, text: Any, info: dict[str, Any], feedback: str) -> Observation:
        if not isinstance(text, str):
            raise ValueError(
                f"gymnasium env {self._env_id!r} returned a {type(text).__name__} observation; "
                "its Text observation space promises a str"
            )
        commands = info.get("admissible_commands") if self.admissible_commands else None
        return Observation(
            objective=str(info.get("objective") or self._env_id),
            text=text,
            feedback=feedback,
            admissible_commands=tuple(str(c) for c in commands) if commands else None,
        )

    def _state_key(self, info: dict[str, Any]) -> int:
        key = info.get("state_key")
        if isinstance(key, int) and not isinstance(key, bool):
            return key
        return stable_key("gymnasium", self._env_id, self.task.param("seed"), tuple(self.history))

    def reset(self, task: Task) -> Observation:
        env_id = task.param("level")
        if self._env is None or env_id != self._env_id:
            self.close()
            self._env = make(env_id, self.module, **self.make_kwargs)
            self._env_id = env_id
        self.task, self.steps, self.history = task, 0, []
        text, info = self._env.reset(seed=int(task.param("seed")))
        self._info = dict(info)
        return self._observation(text, self._info, "")

    def reset_info(self) -> dict[str, Any]:
        return {"state_key": self._state_key(self._info), "won": False}

    def step(self, action: str) -> tuple[Observation, float, bool, dict[str, Any]]:
        self.steps += 1
        space = self._env.action_space
        if not isinstance(action, str) or not space.contains(action):
            text = (
                f"That action is not in the env's action space {space!r} (a str of "
                f"{space.min_length} to {space.max_length} characters of its charset)."
            )
            obs = self._observation(text, self._info, text)
            info = {"won": False, "invalid_action": True, "truncated": False}
            done = self.steps >= self.max_steps
            info.update(truncated=done, steps=self.steps, state_key=self._state_key(self._info))
            return obs, 0.0, done, info
        listed = self._info.get("admissible_commands")
        self.history.append(action)
        text, reward, terminated, truncated, env_info = self._env.step(action)
        self._info = dict(env_info)
        reward = float(reward)
        if "won" in env_info or "is_success" in env_info:
            won = bool(env_info.get("won", env_info.get("is_success")))
        else:
            won = bool(terminated) and reward >= self.win_reward
        invalid = bool(env_info.get("invalid_action", listed is not None and action not in listed))
        truncated = bool(truncated) or (not terminated and self.steps >= self.max_steps)
        done = bool(terminated) or truncated
        info = {
            "won": won,
            "invalid_action": invalid,
            "truncated": truncated and not terminated,
            "steps": self.steps,
            "state_key": self._state_key(self._info),
        }
        return self._observation(text, self._info, text), reward, done, info

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None
