"""TextArena's single-player games as an ``Env``: ``make_env("textarena")``, a task's level the
game id (``GuessTheNumber-v0``, ``TowerOfHanoi-v0``, ...).

A game is made with ``textarena.make(game)`` and reset with ``reset(num_players=1, seed=...)``;
a game for two or more players is refused, naming the game and TextArena's own reason. Actions
go through the game's registered action wrappers (``ActionFormattingWrapper`` puts a bare move in
the square brackets the games parse); observations are read from the game itself, each turn the
messages the game sent since the last one (the prompt first, then its answers; the player's own
echoed move left out), so the policy sees each message once and the context grows by turns.

Rewards come at the end, TextArena's own (``state.rewards[0]``: 1 on a solved game, a partial
completion score or -1 otherwise, per game); an episode is won when that reward is at least
``win_reward`` (1). A move the game rejects (``set_invalid_move``) is an invalid action. The
state key is the game, the seed and TextArena's ``game_state`` dict (the engine's state: the
secret, the history it keeps), so GiGPO groups two episodes exactly when the engine's record of
them is equal. TextArena seeds Python's global ``random`` on reset (its games draw from it), so
one process should play one game at a time: the actor pool steps an env's games one after
another unless ``env.concurrent_steps`` is set.
"""

from __future__ import annotations

from typing import Any

from agentrl_jax.envs.base import Env, Observation, Task, stable_key

PLAYER = 0


def _unwrap(game):
    import textarena as ta  # noqa: PLC0415 - only this family needs it

    while isinstance(game, ta.Wrapper):
        game = game.env
    return game


def make(game_id: str, **game_kwargs: Any):
    """``(wrapped game, the game itself)`` of ``game_id``, checked to be single-player.

    Raises:
      ValueError: an unknown game id (naming a few registered ones), or a game that is not for
        one player (TextArena's reason attached).
    """
    import textarena as ta  # noqa: PLC0415
    from textarena.envs.registration import ENV_REGISTRY  # noqa: PLC0415

    if game_id not in ENV_REGISTRY:
        close = sorted(k for k in ENV_REGISTRY if k.split("-")[0] == game_id.split("-")[0])
        raise ValueError(
            f"textarena game {game_id!r} is not registered"
            + (f"; close: {', '.join(close)}" if close else "")
        )
    wrapped = ta.make(game_id, **game_kwargs)
    game = _unwrap(wrapped)
    try:
        game.reset(num_players=1, seed=0)
    except AssertionError as e:
        raise ValueError(
            f"textarena game {game_id!r} is not single-player ({e}); the textarena adapter "
            "plays single-player games only"
        ) from e
    if not isinstance(game.state, ta.SinglePlayerState):
        raise ValueError(
            f"textarena game {game_id!r} keeps a {type(game.state).__name__}, not a "
            "SinglePlayerState; the textarena adapter plays single-player games only"
        )
    return wrapped, game


def check_game(game_id: str) -> None:
    """Raises when ``game_id`` is not a registered single-player TextArena game."""
    make(game_id)


class TextArenaEnv(Env):
    """A TextArena single-player game behind the ``Env`` contract.

    Args:
      max_steps: the step that reaches it ends the episode (``info["truncated"]``); the games
        keep their own turn limits too.
      win_reward: a finished game whose reward is at least this is won.
      game_kwargs: keyword arguments for ``textarena.make`` (a game's own settings).
    """

    def __init__(
        self, max_steps: int = 30, win_reward: float = 1.0, game_kwargs: dict | None = None
    ):
        self.max_steps = max_steps
        self.win_reward = win_reward
        self.game_kwargs = dict(game_kwargs or {})
        self._game_id = ""

    @classmethod
    def lists_admissible_commands(cls, **kwargs: Any) -> bool:
        return False  # TextArena's games do not list their valid moves

    def _messages(self) -> str:
        _, messages = self.game.get_observation()
        return "\n".join(m for sender, m, _ in messages if sender != PLAYER).strip()

    def _state_key(self) -> int:
        state = self.game.state
        return stable_key(
            "textarena", self._game_id, self.task.param("seed"), repr(state.game_state)
        )

    def reset(self, task: Task) -> Observation:
        game_id = task.param("level")
        if game_id != self._game_id:
            self.wrapped, self.game = make(game_id, **self.game_kwargs)
            self._game_id = game_id
        self.task, self.steps = task, 0
        self.game.reset(num_players=1, seed=int(task.param("seed")))
        text = self._messages()
        self.objective = text.split("\n", 1)[0]
        return Observation(objective=self.objective, text=text)

    def reset_info(self) -> dict[str, Any]:
        return {"state_key": self._state_key(), "won": False}

    def step(self, action: str) -> tuple[Observation, float, bool, dict[str, Any]]:
        self.steps += 1
        state = self.game.state
        errors = state.error_count
        done, _ = self.wrapped.step(action if isinstance(action, str) else repr(action))
        invalid = state.error_count > errors or bool(state.game_info[PLAYER].get("invalid_move"))
        reward = float((state.rewards or {}).get(PLAYER, 0.0)) if done else 0.0
        truncated = not done and self.steps >= self.max_steps
        feedback = self._messages()
        if done and state.game_info[PLAYER].get("reason"):
            feedback = f"{feedback}\n{state.game_info[PLAYER]['reason']}".strip()
        info = {
            "won": bool(done) and reward >= self.win_reward,
            "invalid_action": invalid,
            "truncated": truncated,
            "steps": self.steps,
            "score": reward,
            "state_key": self._state_key(),
        }
        obs = Observation(objective=self.objective, text=feedback, feedback=feedback)
        return obs, reward, bool(done) or truncated, info
