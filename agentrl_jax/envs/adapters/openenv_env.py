"""An OpenEnv server's environment as an ``Env``: reset/step/state through openenv-core's own
client (``GenericEnvClient``, one WebSocket session per env, at ``<url>/ws``).

    make_env("openenv", url="http://127.0.0.1:8000")
    make_env("openenv", app="my_server:app")      # started here, on 127.0.0.1, by uvicorn

OpenEnv's actions and observations are typed (pydantic models whose JSON schemas the server
publishes at ``/schema``); the adapter needs text both ways. It reads the schemas once and picks:

- the action field the policy's text goes into: ``action_field``, or the action's one required
  string field;
- the observation field the policy reads: ``observation_field``, or the observation's first
  string field;
- the valid actions, where the observation lists them: ``actions_field``, or the first
  list-of-strings field named ``legal_actions``, ``valid_actions``, ``admissible_commands`` or
  ``available_actions`` (shown, and written by ``rollout.constrain_actions``).

A server whose schemas hold no such fields is refused, naming the server and the schema.
Rewards are the server's (None counts 0); an episode is won when it ends with a reward of at
least ``win_reward`` (OpenEnv's observations carry no success flag over the wire: the server
drops their metadata). An action the server rejects (a validation error) is an invalid action:
the episode goes on, the error is the feedback. The state key is the server's ``state()`` (its
episode id and step count left out) with the observation, so it is as fine as what the server
exposes. Episodes are seeded through ``reset(seed=...)``.
"""

from __future__ import annotations

import atexit
import importlib.util
import socket
import subprocess
import sys
import time
from typing import Any

from agentrl_jax.envs.base import Env, Observation, Task, stable_key

ACTION_LIST_FIELDS = ("legal_actions", "valid_actions", "admissible_commands", "available_actions")
_BOOKKEEPING = ("episode_id", "step_count")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(app: str, *, port: int = 0, timeout_s: float = 60.0, env=None) -> tuple[str, Any]:
    """Starts ``uvicorn app`` (``"module:attr"`` of an OpenEnv FastAPI app) on 127.0.0.1.

    Returns:
      ``(url, process)`` once the server answers ``/health``; stop it with ``process.terminate``.

    Raises:
      RuntimeError: the server exited or did not answer within ``timeout_s`` (its output
        attached).
    """
    import requests  # noqa: PLC0415

    module = app.partition(":")[0]
    if ":" not in app or importlib.util.find_spec(module) is None:
        raise ValueError(
            f"env.kwargs.app={app!r}: expected 'module:attr' of an importable module holding "
            "an OpenEnv FastAPI app (openenv.core.env_server.create_fastapi_app)"
        )
    port = port or free_port()
    cmd = [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(  # noqa: S603 - the user's own server module
        [*cmd, "--log-level", "warning"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out = proc.stdout.read().decode(errors="replace")
            raise RuntimeError(f"OpenEnv server {app!r} exited with {proc.returncode}:\n{out}")
        try:
            if requests.get(f"{url}/health", timeout=1).ok:
                return url, proc
        except requests.ConnectionError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"OpenEnv server {app!r} did not answer {url}/health in {timeout_s} s")


def _string_fields(schema: dict[str, Any]) -> list[str]:
    props = schema.get("properties", {})
    return [k for k, v in props.items() if v.get("type") == "string" and k != "metadata"]


def _list_of_strings(prop: dict[str, Any]) -> bool:
    return prop.get("type") == "array" and prop.get("items", {}).get("type") == "string"


def text_fields(
    schemas: dict[str, Any], url: str, action_field: str, observation_field: str, actions_field: str
) -> tuple[str, str, str]:
    """``(action field, observation field, valid-actions field or "")`` of a server's schemas.

    Raises:
      ValueError: naming the server, the schema and its fields, when a field is missing or none
        can be picked.
    """
    action, obs = schemas.get("action", {}), schemas.get("observation", {})
    action_props, obs_props = action.get("properties", {}), obs.get("properties", {})
    required = [k for k in action.get("required", ()) if k in _string_fields(action)]
    if action_field:
        if action_props.get(action_field, {}).get("type") != "string":
            raise ValueError(
                f"OpenEnv server {url}: env.kwargs.action_field={action_field!r} is not a string "
                f"field of its action schema (fields: {sorted(action_props)})"
            )
    elif len(required) == 1:
        action_field = required[0]
    else:
        raise ValueError(
            f"OpenEnv server {url}: its action schema {action.get('title', '')!r} has "
            f"{len(required)} required string fields ({required}; all fields: "
            f"{sorted(action_props)}); the openenv adapter writes the policy's text into one: "
            "name it with env.kwargs.action_field"
        )
    if observation_field:
        if obs_props.get(observation_field, {}).get("type") != "string":
            raise ValueError(
                f"OpenEnv server {url}: env.kwargs.observation_field={observation_field!r} is not "
                f"a string field of its observation schema (fields: {sorted(obs_props)})"
            )
    elif _string_fields(obs):
        observation_field = _string_fields(obs)[0]
    else:
        raise ValueError(
            f"OpenEnv server {url}: its observation schema {obs.get('title', '')!r} has no "
            f"string field (fields: {sorted(obs_props)}); the openenv adapter needs text "
            "observations"
        )
    if actions_field and not _list_of_strings(obs_props.get(actions_field, {})):
        raise ValueError(
            f"OpenEnv server {url}: env.kwargs.actions_field={actions_field!r} is not a list of "
            f"strings in its observation schema (fields: {sorted(obs_props)})"
        )
    if not actions_field:
        listed = [f for f in ACTION_LIST_FIELDS if _list_of_strings(obs_props.get(f, {}))]
        actions_field = listed[0] if listed else ""
    return action_field, observation_field, actions_field


class OpenEnvEnv(Env):
    """An OpenEnv environment, served at ``url`` (or by ``app`` started here), as an ``Env``.

    Args:
      url: the server's base URL (``http://host:port``).
      app: instead of ``url``: ``"module:attr"`` of an OpenEnv FastAPI app this env serves
        itself on 127.0.0.1 (one server per env; stopped on ``close``).
      action_field, observation_field, actions_field: the schema fields to use (see the
        module's docstring; "" picks them).
      admissible_commands: pass the listed valid actions on (False: never).
      max_steps: the step that reaches it ends the episode (``info["truncated"]``).
      win_reward: an episode that ends with at least this reward is won.
      timeout_s: seconds to wait for the server's answer to one message.
    """

    def __init__(
        self,
        url: str = "",
        app: str = "",
        action_field: str = "",
        observation_field: str = "",
        actions_field: str = "",
        admissible_commands: bool = True,
        max_steps: int = 30,
        win_reward: float = 1.0,
        timeout_s: float = 60.0,
    ):
        if bool(url) == bool(app):
            raise ValueError(
                "the openenv env needs exactly one of env.kwargs.url (a running server) and "
                f"env.kwargs.app (a server to start); got url={url!r}, app={app!r}"
            )
        self.url, self.app, self._server = url.rstrip("/"), app, None
        self.fields = (action_field, observation_field, actions_field)
        self.admissible_commands = admissible_commands
        self.max_steps = max_steps
        self.win_reward = win_reward
        self.timeout_s = timeout_s
        self._client = None

    def _connect(self) -> None:
        import requests  # noqa: PLC0415
        from openenv.core.generic_client import GenericEnvClient  # noqa: PLC0415

        if self.app:
            self.url, self._server = serve(self.app)
            atexit.register(self.close)
        try:
            schemas = requests.get(f"{self.url}/schema", timeout=self.timeout_s).json()
        except requests.RequestException as e:
            raise ConnectionError(f"OpenEnv server {self.url}: GET /schema failed: {e}") from e
        self.action_field, self.observation_field, self.actions_field = text_fields(
            schemas, self.url, *self.fields
        )
        self._client = GenericEnvClient(base_url=self.url, message_timeout_s=self.timeout_s).sync()
        self._client.connect()

    def _observation(self, payload: dict[str, Any], feedback: str) -> Observation:
        text = str(payload.get(self.observation_field) or "")
        listed = payload.get(self.actions_field) if self.actions_field else None
        commands = tuple(str(c) for c in listed) if listed and self.admissible_commands else None
        return Observation(
            objective=self.objective, text=text, feedback=feedback, admissible_commands=commands
        )

    def _state_key(self, payload: dict[str, Any]) -> int:
        state = {k: v for k, v in self._client.state().items() if k not in _BOOKKEEPING}
        return stable_key("openenv", self.url, repr(sorted(state.items())), repr(payload))

    def reset(self, task: Task) -> Observation:
        if self._client is None:
            self._connect()
        self.task, self.steps = task, 0
        result = self._client.reset(seed=int(task.param("seed")))
        self._payload = dict(result.observation)
        self.objective = str(self._payload.get(self.observation_field) or "").split("\n")[0]
        return self._observation(self._payload, "")

    def reset_info(self) -> dict[str, Any]:
        return {"state_key": self._state_key(self._payload), "won": False}

    def step(self, action: str) -> tuple[Observation, float, bool, dict[str, Any]]:
        self.steps += 1
        listed = self._payload.get(self.actions_field) if self.actions_field else None
        try:
            result = self._client.step({self.action_field: action})
        except RuntimeError as e:  # the server rejected the action (its validation error)
            done = self.steps >= self.max_steps
            obs = self._observation(self._payload, f"The action was rejected: {e}")
            info = {"won": False, "invalid_action": True, "truncated": done, "steps": self.steps}
            return obs, 0.0, done, {**info, "state_key": self._state_key(self._payload)}
        self._payload = dict(result.observation)
        reward = float(result.reward or 0.0)
        truncated = not result.done and self.steps >= self.max_steps
        info = {
            "won": bool(result.done) and reward >= self.win_reward,
            "invalid_action": listed is not None and action not in listed,
            "truncated": truncated,
            "steps": self.steps,
            "state_key": self._state_key(self._payload),
        }
        text = str(self._payload.get(self.observation_field) or "")
        return self._observation(self._payload, text), reward, bool(result.done) or truncated, info

    def close(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            finally:
                self._client = None
        if self._server is not None:
            self._server.terminate()
            self._server.wait(timeout=10)
            self._server = None
