"""A small text game whose task says how it fails, for chaos tests of the actor pool.

Its own module, importing only the env contract: every worker the pool (re)starts imports it,
so a restart costs a process start, not a JAX import.

An episode is ``LENGTH`` steps of "go on" (any text is a step); the last one wins. Task params:

- ``hang_at``: step k sleeps ``hang_s`` (past the pool's step timeout: the worker is restarted).
- ``raise_at``: step k raises (that episode fails; the worker lives on).
- ``long_obs_at``: the observation after step k (0: the reset's) is ``long_words`` words long.
"""

from __future__ import annotations

import time

from agentrl_jax.envs import registry
from agentrl_jax.envs.base import Env, Observation, stable_key

LENGTH = 3
COMMANDS = ("go on", "wait")


class ChaosEnv(Env):
    def __init__(self, hang_s: float = 30.0, long_words: int = 400):
        self.hang_s = hang_s
        self.long_words = long_words

    def _obs(self) -> Observation:
        text = f"{self.task.id} room {self.n}"
        if self.task.param("long_obs_at", -1) == self.n:
            text += " " + " ".join(["room"] * self.long_words)
        return Observation(
            objective=f"reach room {LENGTH}",
            text=text,
            feedback=text,
            admissible_commands=COMMANDS,
        )

    def _info(self) -> dict:
        return {"state_key": stable_key(self.task.id, self.n), "expert_action": "go on"}

    def reset(self, task):
        self.task, self.n = task, 0
        return self._obs()

    def reset_info(self):
        return self._info()

    def step(self, action):
        step = self.n + 1
        if self.task.param("hang_at") == step:
            time.sleep(self.hang_s)
        if self.task.param("raise_at") == step:
            raise RuntimeError(f"chaos: {self.task.id} raised at step {step}")
        self.n = step
        done = step >= LENGTH
        info = {**self._info(), "won": done, "invalid_action": action not in COMMANDS}
        return self._obs(), float(done), done, info


registry.register("chaos-test", ChaosEnv, overwrite=True)
