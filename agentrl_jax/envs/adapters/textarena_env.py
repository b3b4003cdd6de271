"""TextArena's single-player games as an ``Env``: ``make_env("textarena")``, a task's level the
game id (``GuessTheNumber-v0``, ``TowerOfHanoi-v0``, ...).

A game is made with ``textarena.make(game)`` and reset with ``reset(num_players=1, seed=...)``;
a game for two or more players is refused, naming the game and TextArena's own reason. Actions
go through the game's registered action wrappers (``ActionFormattingWrapper`` puts a bare move in
the square brackets the games parse); observations are read from the game itself, each turn the
messages the game sent since the last one (the prompt first, then its answers; the player's own
echoed move left out), so the policy sees each message once and the context grows by turns.

Rewards come at the end. With ``reward="game"`` (the default) they are TextArena's own
(``state.rewards[0]``: 1 on a solved game, a partial completion score or -1 otherwise, per game);
with ``reward="sparse"`` they are 1 on a won episode and 0 otherwise, so a policy is paid for
winning only (FrozenLake's game reward pays up to 0.95 for walking into a hole near the goal).
Either way ``info["score"]`` is the game's own reward, and an episode is won when that is at
least ``win_reward`` (1). A move the game rejects (``set_invalid_move``) is an invalid action. The
state key is the game, the seed and TextArena's ``game_state`` dict (the engine's state: the
secret, the history it keeps), so GiGPO groups two episodes exactly when the engine's record of
them is equal. TextArena seeds Python's global ``random`` on reset (its games draw from it), so
one process should play one game at a time: the actor pool steps an env's games one after
another unless ``env.concurrent_steps`` is set.

TextArena has no protocol for listing a game's valid moves or for an expert. Where this module
knows a game's rules (``GAME_RULES``, by the game's class: today FrozenLake, every size), it reads
the engine's own state for both: ``admissible_commands=True`` lists the moves the game accepts
(constrained decoding writes one of them), and ``info["expert_action"]`` is a solver's move, so
SFT has demonstrations. For another game ``admissible_commands=True`` is refused when its tasks
are drawn, and it has no expert.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from typing import Any

from agentrl_jax.envs.base import Env, Observation, Task, stable_key

PLAYER = 0
REWARD_MODES = ("game", "sparse")


# ---------------------------------------------------------------------------- known games


@dataclasses.dataclass(frozen=True)
class GameRules:
    """What the adapter knows of one game beyond TextArena's protocol, read from the engine.

    Attributes:
      valid_moves: ``valid_moves(game) -> tuple[str, ...]``, the moves the game accepts in its
        current state, as the policy writes them (the game's action wrapper adds the brackets).
      expert_move: ``expert_move(game) -> str | None``, a solver's move from the current state
        (one of ``valid_moves``), None where the game is over or cannot be won.
    """

    valid_moves: Callable[[Any], tuple[str, ...]]
    expert_move: Callable[[Any], str | None]


# FrozenLake's moves as its engine defines them (``FrozenLakeEnv.actions``), in the order the
# expert prefers among equally short paths: toward the goal's default corner first.
_LAKE_ORDER = ("down", "right", "up", "left")


def _lake_moves(game) -> tuple[str, ...]:
    """The FrozenLake moves that stay on the board (a move into a wall is an invalid move; one
    into a hole is legal and loses)."""
    r, c = game.state.game_state["player_pos"]
    return tuple(
        m
        for m in _LAKE_ORDER
        if 0 <= r + game.actions[m][0] < game.size and 0 <= c + game.actions[m][1] < game.size
    )


def _lake_distances(game) -> dict[tuple[int, int], int]:
    """Steps from every cell to the goal over the grid's non-hole cells (breadth-first)."""
    grid, goal = game.state.game_state["grid"], tuple(game.state.game_state["goal_pos"])
    dist, queue = {goal: 0}, collections.deque([goal])
    while queue:
        r, c = queue.popleft()
        for dr, dc in game.actions.values():
            nr, nc = r + dr, c + dc
            inside = 0 <= nr < game.size and 0 <= nc < game.size
            if inside and (nr, nc) not in dist and grid[nr][nc] != "H":
                dist[(nr, nc)] = dist[(r, c)] + 1
                queue.append((nr, nc))
    return dist


def _lake_expert(game) -> str | None:
    """The first move of a shortest hole-free path to the goal (ties broken by
    ``_LAKE_ORDER``); None once the game is over or when no path exists."""
    if game.state.done:
        return None
    pos = tuple(game.state.game_state["player_pos"])
    dist = _lake_distances(game)
    if pos not in dist or dist[pos] == 0:
        return None
    for move in _lake_moves(game):
        dr, dc = game.actions[move]
        if dist.get((pos[0] + dr, pos[1] + dc)) == dist[pos] - 1:
            return move
    return None  # unreachable: a cell at distance d > 0 has a neighbour at d - 1


# Games by their engine class's name (every registered variant of a game shares its class).
GAME_RULES: dict[str, GameRules] = {
    "FrozenLakeEnv": GameRules(valid_moves=_lake_moves, expert_move=_lake_expert),
}


def rules(game) -> GameRules | None:
    """The ``GameRules`` of a TextArena game (unwrapped), None for a game this module does not
    know."""
    return GAME_RULES.get(type(game).__name__)


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


def check_game(game_id: str, admissible_commands: bool = False) -> None:
    """Raises when ``game_id`` is not a registered single-player TextArena game, or when
    ``admissible_commands`` asks for the valid moves of a game whose moves are not known here."""
    _, game = make(game_id)
    if admissible_commands and rules(game) is None:
        raise _no_move_list(game_id, game)


def _no_move_list(game_id: str, game) -> ValueError:
    """The refusal of ``admissible_commands=True`` for a game without ``GAME_RULES``."""
    return ValueError(
        f"env.kwargs.admissible_commands=True lists a game's valid moves, but textarena game "
        f"{game_id!r} ({type(game).__name__}) has no known move list; games with one: "
        f"{', '.join(sorted(GAME_RULES))} (agentrl_jax/envs/adapters/textarena_env.py)"
    )


class TextArenaEnv(Env):
    """A TextArena single-player game behind the ``Env`` contract.

    Args:
      max_steps: the step that reaches it ends the episode (``info["truncated"]``); the games
        keep their own turn limits too.
      win_reward: a finished game whose reward is at least this is won.
      game_kwargs: keyword arguments for ``textarena.make`` (a game's own settings).
      admissible_commands: list the game's valid moves in each observation (games in
        ``GAME_RULES`` only).
      reward: ``"game"``, TextArena's own final reward; ``"sparse"``, 1 for a won episode and 0
        otherwise.
    """

    def __init__(
        self,
        max_steps: int = 30,
        win_reward: float = 1.0,
        game_kwargs: dict | None = None,
        admissible_commands: bool = False,
        reward: str = "game",
    ):
        if reward not in REWARD_MODES:
            raise ValueError(
                f"textarena env.kwargs.reward: expected one of {REWARD_MODES}, got {reward!r}"
            )
        self.reward = reward
        self.max_steps = max_steps
        self.win_reward = win_reward
        self.game_kwargs = dict(game_kwargs or {})
        self.admissible_commands = admissible_commands
        self._game_id = ""
        self._rules: GameRules | None = None

    def _observation(self, text: str, feedback: str = "") -> Observation:
        moves = None
        if self.admissible_commands:
            moves = () if self.game.state.done else self._rules.valid_moves(self.game)
        return Observation(
            objective=self.objective, text=text, feedback=feedback, admissible_commands=moves
        )

    def _expert(self) -> str | None:
        return self._rules.expert_move(self.game) if self._rules is not None else None

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
            self._rules = rules(self.game)
            if self.admissible_commands and self._rules is None:
                raise _no_move_list(game_id, self.game)
        self.task, self.steps = task, 0
        self.game.reset(num_players=1, seed=int(task.param("seed")))
        text = self._messages()
        self.objective = text.split("\n", 1)[0]
        return self._observation(text)

    def reset_info(self) -> dict[str, Any]:
        return {"state_key": self._state_key(), "won": False, "expert_action": self._expert()}

    def step(self, action: str) -> tuple[Observation, float, bool, dict[str, Any]]:
        self.steps += 1
        state = self.game.state
        errors = state.error_count
        done, _ = self.wrapped.step(action if isinstance(action, str) else repr(action))
        invalid = state.error_count > errors or bool(state.game_info[PLAYER].get("invalid_move"))
        score = float((state.rewards or {}).get(PLAYER, 0.0)) if done else 0.0
        won = bool(done) and score >= self.win_reward
        reward = score if self.reward == "game" else float(won)
        truncated = not done and self.steps >= self.max_steps
        feedback = self._messages()
        if done and state.game_info[PLAYER].get("reason"):
            feedback = f"{feedback}\n{state.game_info[PLAYER]['reason']}".strip()
        info = {
            "won": won,
            "invalid_action": invalid,
            "truncated": truncated,
            "steps": self.steps,
            "score": score,
            "state_key": self._state_key(),
            "expert_action": None if done or truncated else self._expert(),
        }
        return self._observation(feedback, feedback), reward, bool(done) or truncated, info
