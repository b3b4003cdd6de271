"""Batched multi-turn rollouts: environments in the actor pool, the policy in the sampler.

Token-in, token-out. Each observation is rendered to text and encoded once, as it is fed to the
model (``ChatTemplate.turn_ids``); the actions are the sampler's own ids. The environment receives
decoded text, but nothing trained on is ever re-encoded from decoded text.

The episodes are played by the drivers of ``rollout/play.py`` (``play_wave``, a wave at a time,
and ``play_stream``, continuously batched), for any actor; each episode's state is one
``Episode``. The policy and the expert act through ``RolloutWorker`` (the same contexts for
both), the trainer's tokenizer corpus through its own small actor (``run/build.py``).

Each step keeps its newest observation's ids (``Step.obs_ids``) and each episode the observation
after its last action (``Trajectory.final_obs_ids``). An episode is ``truncated`` when a limit
cut it: the rollout's ``max_turns`` or context length (below), or the environment's own step
limit (its step info says ``truncated``).

Context modes:

- ``episode``: one KV cache per episode kept across turns; each turn prefills only the new
  observation ids. An episode whose next turn would not fit ``max_seq_len`` (its prompt plus
  the turn's action budget, ``RolloutWorker.action_budget``) ends there, marked ``truncated``.
- ``step``: every turn starts a fresh context: the system prompt with the episode's goal
  (encoded once at reset), then the stored ids of the last ``history_turns`` turns (observation
  and action, as they were first encoded), then the new observation; the goal is always in view,
  however old the turn that stated it. Oldest turns are dropped first until the context fits
  ``max_seq_len`` (``truncated`` is then set on the step's info as ``context_truncated``). An
  observation that does not fit even alone with the header (and the action budget) ends the
  episode there, marked ``truncated``, as in ``episode`` mode; one at the reset leaves an
  episode of no step (counted in ``rollout/truncated``, never trained on).

Tool calling (``RolloutWorker(..., tools=ToolCalling(...))``, an env that offers function tools):
the template renders the tools in its system turn, each action is parsed as a call in the
policy's format and checked against the tools' schemas (``rollout/tool_calls.py``), the env is
stepped with the ``ToolCall``, and its answer is fed as a ``tool`` turn (``ChatTemplate.tool_ids``)
instead of a user turn. A malformed call never reaches the env: the actor answers it itself with
a tool turn that names the problem (``invalid_tool_call`` in the step's info, the env's state
unchanged), and the episode goes on.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from agentrl_jax import chaos, timing
from agentrl_jax.envs.actors import StepResult
from agentrl_jax.envs.base import Observation, Task
from agentrl_jax.rollout.chat_template import ChatTemplate
from agentrl_jax.rollout.play import Episode, play_stream, play_wave
from agentrl_jax.rollout.tool_calls import ToolCall, ToolCallError, ToolCalling
from agentrl_jax.rollout.trajectory import Step, Trajectory
from agentrl_jax.sampling import SamplingParams
from agentrl_jax.sampling import buckets as bk
from agentrl_jax.sampling.logits import as_typed_key, fold_in
from agentrl_jax.sampling.sampler import TurnShapes

CONTEXT_MODES = ("episode", "step")
BATCHING = ("waves", "continuous")


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """Attributes:
    group_size: G rollouts per task instance (they share a group id).
    max_turns: environment steps per episode at most.
    max_new_tokens: tokens per action at most; under ``constrain_actions``, a turn whose
      longest admissible command (with its stop token) is longer may write that many instead.
    max_seq_len: tokens one context may hold (the episode in ``episode`` mode).
    context_mode: 'episode' or 'step'.
    history_turns: k, the turns kept in a step-wise context.
    system_prompt: text before the first observation.
    show_admissible: list the admissible commands in each observation.
    restate_goal: ``episode`` mode: every observation opens with the goal line, not only the
      first (a small policy then reads the goal a few tokens back, not hundreds; step mode's
      header already holds it).
    batching: how a call's episodes share the actor pool's slots. ``waves``: as many episodes
      as the pool holds play together, every turn decoded for all of them, then stepped for all
      of them; the next wave starts when the last episode of this one ends. ``continuous``:
      the slots are cut into ``cohorts`` batches of rows, each with its own cache; when an
      episode ends its rows are freed, and the next group of the task list takes them (a
      group's members start together, so they share their prefix). A cohort decodes as soon
      as its rows' env steps are back, while the other cohorts' env steps run: decoding and
      env steps overlap (use ``env.concurrent_steps`` so that a worker's envs step side by
      side). Every episode draws with its own keys, so both play the same episodes. A
      cohort's turns run fixed shapes (``Sampler.step_turn(..., shapes=...)``): once a play
      has run its episodes, no reply order compiles a new turn program.
    cohorts: ``continuous``: batches of rows that take turns on the device (each holds
      ``capacity // cohorts`` rows, at least one group).
    constrain_actions: constrained decoding: the policy can only write one of the
      observation's admissible commands (closed with the stop token). Every draw is from the
      policy masked to the tokens that continue an admissible command; the allowed ids are
      stored with the action so the learner normalises over the same set. Observations without
      admissible commands leave the turn unconstrained; an env that never lists any is a config
      error. The commands bound the action, so a command is never cut: a turn's decode budget
      is ``max_new_tokens`` or its longest command with the stop token, whichever is longer.
    tool_format: tool calling (an env that offers function tools): the format the policy
      writes calls in, a name in ``tool_calls.FORMATS``; empty: its model family's
      (``Family.tool_format``: "qwen" for Qwen2/2.5/3, "llama3_json" for Llama). Unused when
      the env's actions are text.
    """

    group_size: int = 4
    max_turns: int = 12
    max_new_tokens: int = 12
    max_seq_len: int = 1536
    context_mode: str = "episode"
    history_turns: int = 2
    system_prompt: str = "You are playing a text game. Reply with one command."
    show_admissible: bool = True
    restate_goal: bool = False
    constrain_actions: bool = False
    batching: str = "waves"
    cohorts: int = 2
    tool_format: str = ""

    def __post_init__(self):
        if self.batching not in BATCHING:
            raise ValueError(f"rollout.batching is {self.batching!r}; expected one of {BATCHING}")
        if self.context_mode not in CONTEXT_MODES:
            raise ValueError(
                f"rollout.context_mode is {self.context_mode!r}; expected one of {CONTEXT_MODES}"
            )
        for name in ("group_size", "max_turns", "max_new_tokens", "max_seq_len", "cohorts"):
            if getattr(self, name) < 1:
                raise ValueError(f"rollout.{name} is {getattr(self, name)}; expected >= 1")
        if self.history_turns < 0:
            raise ValueError(f"rollout.history_turns is {self.history_turns}; expected >= 0")
        if self.max_new_tokens >= self.max_seq_len:
            raise ValueError(
                f"rollout.max_new_tokens={self.max_new_tokens} leaves no room for a prompt in "
                f"rollout.max_seq_len={self.max_seq_len}; expected max_new_tokens < max_seq_len"
            )


def render_observation(
    obs: Observation,
    *,
    first: bool,
    show_admissible: bool,
    goal: bool = True,
    restate: bool = False,
) -> str:
    """The text the agent reads for one turn: the first states the goal unless ``goal=False``,
    and with ``restate`` every later one does too."""
    parts = []
    if goal and (first or restate):
        parts.append(goal_line(obs))
    parts.append(obs.text if first else obs.feedback or obs.text)
    if obs.inventory:
        parts.append(f"Inventory: {obs.inventory}")
    if show_admissible and obs.admissible_commands:
        parts.append("Commands: " + " | ".join(obs.admissible_commands))
    return "\n".join(p.strip() for p in parts if p and p.strip())


def goal_line(obs: Observation) -> str:
    return f"Goal: {obs.objective}"


class RolloutWorker:
    """Runs episodes of a batch of tasks with a sampler and an actor pool.

    ``tools``: tool calling (module docstring): the env's tools and the policy's call format;
    the template must be the checkpoint's, derived with the same tools (``get_template(...,
    tools=tools)``), so that it renders them and the tool turns.
    """

    def __init__(
        self,
        pool,
        sampler,
        tokenizer,
        template: ChatTemplate,
        config: RolloutConfig,
        tools: ToolCalling | None = None,
    ):
        if tools is not None and not template.has_tools:
            raise ValueError(
                f"tool calling needs a chat template with tool turns; {template.name!r} has none "
                "(get_template('checkpoint', ..., tools=...) derives one from the checkpoint's "
                "own template)"
            )
        if tools is not None and config.constrain_actions:
            raise ValueError(
                "rollout.constrain_actions writes admissible commands; an env that offers "
                "function tools is played with tool calls: expected constrain_actions=False"
            )
        self.pool = pool
        self.sampler = sampler
        self.tokenizer = tokenizer
        self.template = template
        self.config = config
        self.tools = tools
        self.system_ids = template.system_ids(tokenizer, config.system_prompt)
        # Continuous batching's turn shapes, per cohort layout; kept across calls (and shared
        # with ``with_config`` copies) so that later plays run the programs the first compiled.
        self.cohort_shapes: dict[tuple, TurnShapes] = {}

    def _obs_ids(self, obs: Observation, first: bool) -> list[int]:
        text = render_observation(
            obs,
            first=first,
            show_admissible=self.config.show_admissible,
            goal=self.config.context_mode == "episode",  # step mode: the goal is in the header
            restate=self.config.restate_goal,
        )
        if self.tools is not None and not first:  # the env's answer to a call: a tool turn
            return self.template.tool_ids(self.tokenizer, text)
        return self.template.turn_ids(self.tokenizer, text, first=first)

    def _call(self, ep: Episode, text: str) -> str | ToolCall | StepResult:
        """What the env is stepped with for an action ``text``: the text itself; under tool
        calling the parsed ``ToolCall``, or, for a malformed call, the answer the env would
        have nothing to add to: a tool turn naming the problem, the state unchanged."""
        if self.tools is None:
            return text
        step = ep.traj.steps[-1]
        try:
            call = self.tools.parse(text)
        except ToolCallError as e:
            step.info["invalid_tool_call"] = True
            error = f"Error: invalid tool call: {e}"
            obs = Observation(objective=ep.obs.objective, text=error, feedback=error)
            info = {
                "won": False,
                "invalid_action": True,
                "invalid_tool_call": True,
                "state_key": step.state_key,
            }
            if ep.info.get("expert_action") is not None:
                info["expert_action"] = ep.info["expert_action"]
            return StepResult(obs, info=info)
        step.info["invalid_tool_call"] = False
        return call

    def _header_ids(self, obs: Observation) -> list[int]:
        """Step mode: the system prompt and the episode's goal, the start of every context."""
        text = f"{self.config.system_prompt}\n{goal_line(obs)}"
        return self.template.system_ids(self.tokenizer, text)

    def with_config(self, config: RolloutConfig) -> RolloutWorker:
        """A copy of this worker (same pool, sampler and kind) with other rollout settings."""
        new = copy.copy(self)
        new.config = config
        new.system_ids = self.template.system_ids(self.tokenizer, config.system_prompt)
        return new

    @property
    def capacity(self) -> int | None:
        """Episodes the actor pool plays at once: this process's own pool, whose slots its
        waves and continuous batching use (None: a pool without a limit)."""
        return getattr(self.pool, "capacity", None)

    def wave_size(self, num_tasks: int, group_size: int) -> int:
        """Tasks per wave: the episodes the actor pool plays at once (all tasks without a pool).

        Raises:
          ValueError: when one task's group does not fit the pool.
        """
        capacity = getattr(self.pool, "capacity", None)  # this process's pool (waves are local)
        per_wave = num_tasks if not capacity else max(1, capacity // group_size)
        if per_wave < 1 or (capacity and group_size > capacity):
            raise ValueError(
                f"group_size={group_size} does not fit the actor pool ({capacity} episodes)"
            )
        return per_wave

    def run(
        self,
        tasks: list[Task],
        rng: jax.Array,
        *,
        sampling: SamplingParams | None = None,
        group_offset: int = 0,
        expert: bool = False,
        group_size: int | None = None,
        task_offset: int = 0,
        progress: Callable[[int], object] | None = None,
        gather: bool = True,
    ) -> list[Trajectory]:
        """Plays ``group_size`` episodes of every task; returns them in task-major order.

        With ``expert=True`` the environment's expert acts instead of the policy (SFT
        demonstrations): its command is encoded once and closed with the stop token, and the
        contexts are built exactly as for the policy, so demonstrations and rollouts match.

        The tasks are played in waves of at most ``wave_size`` tasks. Every episode draws with
        its own key (``episode_keys``: ``rng``, its task's position, its place in the group),
        so an episode plays the same whichever wave holds it. ``task_offset`` is the position of
        ``tasks[0]`` in a longer task list that this call plays a slice of (a multi-host
        process's share): the slice's episodes are keyed and grouped by their positions in the
        whole list, so they play exactly as they would inside it. ``progress`` is called with
        the number of this worker's episodes that just ended (a progress bar's ``update``).
        ``gather=False`` returns only the episodes this worker played (a multi-host process's
        share, issuing no collective), for ``gather`` to complete later, on the thread that
        issues the run's collectives (asynchronous RL plays in a background thread).
        """
        group_size = group_size or self.config.group_size
        tasks = list(tasks)
        waves = self.waves(len(tasks), self.wave_size(len(tasks), group_size))
        if self.config.batching == "continuous":
            played = self._run_stream(
                tasks,
                waves,
                rng,
                sampling=sampling,
                group_offset=group_offset,
                expert=expert,
                group_size=group_size,
                task_offset=task_offset,
                progress=progress,
            )
            return self.gather(played) if gather else played
        out = []
        for wave in waves:
            first = task_offset + wave.start
            out += self._run_wave(
                tasks[wave],
                episode_keys(rng, first, wave.stop - wave.start, group_size),
                sampling=sampling,
                group_offset=group_offset + first,
                expert=expert,
                group_size=group_size,
            )
            if progress is not None:
                progress((wave.stop - wave.start) * group_size)
        return self.gather(out) if gather else out

    def waves(self, num_tasks: int, per_wave: int) -> list[slice]:
        """The waves this worker plays of a list of ``num_tasks`` tasks: all of them, in order."""
        return cut_waves(0, num_tasks, per_wave)

    def gather(self, played: list[Trajectory]) -> list[Trajectory]:
        """The whole list's episodes from the ones this worker played (here: all of them)."""
        return played

    def _run_wave(self, tasks, keys, *, sampling, group_offset, expert, group_size):
        """One batch of episodes that fits the pool at once (``keys``: one per episode)."""
        episodes = [
            Episode(task=t, traj=Trajectory(task=t, group=group_offset + i // group_size))
            for i, t in enumerate(t for t in tasks for _ in range(group_size))
        ]
        actor = _WaveActor(self, keys, sampling=sampling, expert=expert, size=len(episodes))
        play_wave(self.pool, episodes, self.config.max_turns, actor)
        return [_finished(ep) for ep in episodes]

    def _run_stream(
        self,
        tasks,
        waves,
        rng,
        *,
        sampling,
        group_offset,
        expert,
        group_size,
        task_offset,
        progress,
    ):
        """``batching='continuous'``: this worker's tasks (``waves``) as one stream of groups
        through the pool's slots (``play_stream``), each episode keyed as in its wave."""
        capacity = self.capacity or sum(w.stop - w.start for w in waves) * group_size
        rows = capacity // self.config.cohorts
        if rows < group_size:
            raise ValueError(
                f"rollout.batching='continuous' cuts the actor pool's {capacity} slots into "
                f"rollout.cohorts={self.config.cohorts} cohorts of {rows} rows, fewer than "
                f"rollout.group_size={group_size}: lower cohorts, or raise env.envs_per_worker"
            )
        groups = []
        for wave in waves:
            first = task_offset + wave.start
            keys = episode_keys(rng, first, wave.stop - wave.start, group_size)
            for i, task in enumerate(tasks[wave]):
                group = group_offset + first + i
                groups.append(
                    [
                        Episode(task=task, traj=Trajectory(task=task, group=group))
                        for _ in range(group_size)
                    ]
                )
                for j, ep in enumerate(groups[-1]):
                    ep.key = keys[i * group_size + j]
        shapes = self._cohort_shapes(rows, group_size)
        actors = [
            _WaveActor(self, None, sampling=sampling, expert=expert, size=rows, shapes=shapes)
            for _ in range(self.config.cohorts)
        ]
        play_stream(self.pool, groups, self.config.max_turns, actors, progress)
        return [_finished(ep) for group in groups for ep in group]

    def _cohort_shapes(self, rows: int, group_size: int) -> TurnShapes:
        """The turn shapes of cohorts of ``rows`` rows (``Sampler.step_turn``'s ``shapes``):
        each cohort turn runs at least the largest chunk, width and choice count any cohort
        turn ran before, so once a play has run its episodes' rows, another play of them
        compiles nothing, whatever order the env replies come back in.

        The start prefill's rows are set to the most a turn can start at once: episode mode,
        one prompt per group (its members start together with the same prompt) when the
        sampler shares prefixes; step mode (every turn a fresh context per row), every row.
        """
        cfg = self.config
        share = getattr(self.sampler, "share_prefixes", True)
        key = (rows, group_size, cfg.context_mode, share)
        if key not in self.cohort_shapes:
            starts = rows // group_size if cfg.context_mode == "episode" and share else rows
            first = bk.round_up(max(starts, 1), bk.COUNT_BUCKETS, what="new conversations")
            self.cohort_shapes[key] = TurnShapes(starts=first)
        return self.cohort_shapes[key]

    def _step_context(self, header, history, obs_ids, traj, action: int) -> list[int] | None:
        """Header (system + goal) + the last k turns (stored ids) + the new observation, fitted.

        None when the header, the observation and the turn's ``action`` budget alone exceed
        ``max_seq_len``: no context holds this turn, so the episode ends there (truncated).
        """
        cfg = self.config
        budget = cfg.max_seq_len - action - len(header) - len(obs_ids)
        if budget < 0:
            return None
        keep = history[-cfg.history_turns :] if cfg.history_turns else []
        while keep and sum(len(t) for t in keep) > budget:
            keep = keep[1:]
            traj.steps[-1].info["context_truncated"] = True
        return header + [t for turn in keep for t in turn] + obs_ids

    def _choices(self, obs: Observation) -> list[list[int]] | None:
        """constrain_actions: the admissible commands as the ids the policy may write (each
        closed with the stop token)."""
        if not self.config.constrain_actions or not obs.admissible_commands:
            return None
        stop = self.template.stop_id(self.tokenizer)
        encode, text = self.tokenizer.encode, self.template.action_text
        return [encode(text(c), add_special_tokens=False) + [stop] for c in obs.admissible_commands]

    def action_budget(self, choices: list[list[int]] | None) -> int:
        """Tokens a turn may write: ``max_new_tokens``, or the turn's longest admissible command
        (``choices``, stop token included) when that is longer. A cut command is a different
        command (or none) to the env, so under constrained decoding the commands bound the
        action; the context checks count this budget, so a command that no context holds ends
        the episode (truncated), never the run."""
        longest = max(map(len, choices)) if choices else 0
        return max(self.config.max_new_tokens, longest)

    def _expert_ids(self, info) -> list[int]:
        action = info.get("expert_action")
        if not action:
            raise ValueError(
                "expert rollout: the environment gave no expert_action; expert demonstrations "
                "need an env with an expert (TextWorld, ALFWorld)"
            )
        # Never cut: a cut command would be a different command to the env (and a lost demo).
        ids = self.tokenizer.encode(self.template.action_text(action), add_special_tokens=False)
        return ids + [self.template.stop_id(self.tokenizer)]


def decode_text(tokenizer, ids) -> str:
    """Ids as the environment reads them: special tokens (the stop token) dropped, whitespace
    stripped. What an action's ids become as a command, and how transcripts show every turn."""
    return tokenizer.decode(list(ids), skip_special_tokens=True).strip()


def cut_waves(start: int, stop: int, per_wave: int) -> list[slice]:
    """Tasks ``start .. stop`` cut in order into waves of ``per_wave`` (the last may be short)."""
    return [slice(s, min(s + per_wave, stop)) for s in range(start, stop, per_wave)]


def episode_keys(rng: jax.Array, first: int, num_tasks: int, group_size: int) -> jax.Array:
    """[num_tasks * group_size] keys of the episodes of tasks ``first ..``, task-major.

    Episode j of the task at position t of the task list draws with
    ``fold_in(fold_in(rng, t), j)``: its randomness depends on where its task stands in the
    list, never on which wave (or which process) plays it.
    """
    tasks = np.repeat(np.arange(first, first + num_tasks, dtype=np.int32), group_size)
    members = np.tile(np.arange(group_size, dtype=np.int32), num_tasks)
    return _fold_twice(as_typed_key(rng), tasks, members)


@jax.jit
def _fold_twice(rng, tasks, members):
    fold = jax.vmap(jax.random.fold_in, in_axes=(0, 0))
    return fold(jax.vmap(jax.random.fold_in, in_axes=(None, 0))(rng, tasks), members)


def _finished(ep: Episode) -> Trajectory:
    """An episode's trajectory once it is over (lost, ended, or out of turns)."""
    ep.traj.infra_failure = ep.failed
    # Episodes still running at max_turns: the last observation got no action.
    if ep.live and ep.traj.steps and not ep.traj.steps[-1].action_ids:
        ep.traj.steps.pop()
        ep.traj.truncated = True
        ep.traj.final_obs_ids = ep.pending_ids
    return ep.traj


class _WaveActor:
    """A RolloutWorker's actor for one wave: the sampler on the policy's contexts, or (with
    ``expert``) the env's expert command written into the same contexts."""

    def __init__(
        self,
        worker: RolloutWorker,
        keys,
        *,
        sampling,
        expert: bool,
        size: int,
        shapes: TurnShapes | None = None,
    ):
        self.worker, self.config = worker, worker.config
        if keys is None:  # play_stream: each row's key is set as an episode takes it
            keys = jax.random.split(jax.random.key(0), size)
        self.keys, self.sampling, self.expert, self.size = keys, sampling, expert, size
        self.shapes = shapes  # play_stream's cohorts: fixed turn shapes (Sampler.step_turn)
        self.cache = None

    def admit(self, rows: list[int], episodes: list[Episode]) -> None:
        """``play_stream``: ``episodes`` take cache rows ``rows`` (their keys, an empty row)."""
        keys = jnp.stack([ep.key for ep in episodes])
        self.keys = self.keys.at[np.asarray(rows)].set(keys)
        if self.cache is not None and self.config.context_mode == "episode":
            self.cache = self.worker.sampler.clear_rows(self.cache, rows)

    def start(self, ep: Episode) -> None:
        w = self.worker
        ep.pending_ids = w._obs_ids(ep.obs, first=True)
        ep.choices = w._choices(ep.obs)
        if self.config.context_mode == "step":
            ep.header = ep.traj.header_ids = w._header_ids(ep.obs)
        ep.traj.steps.append(_empty_step(ep.info))

    def _context(self, ep: Episode) -> list[int] | None:
        """The ids ``ep``'s next turn feeds the model (None: they do not fit the context)."""
        cfg, w = self.config, self.worker
        action = w.action_budget(ep.choices)
        if cfg.context_mode == "step":
            return w._step_context(ep.header, ep.history, ep.pending_ids, ep.traj, action)
        ids = (w.system_ids if ep.turn == 0 else []) + ep.pending_ids
        return None if ep.used + len(ids) + action > cfg.max_seq_len else ids

    def act(
        self, turn: int | None, episodes: list[Episode]
    ) -> list[str | ToolCall | StepResult | None]:
        """One command per row of ``episodes`` (None for a row that is not live); each live
        episode plays its own next turn (``ep.turn``). Under tool calling a ``ToolCall``, or the
        ``StepResult`` that answers a malformed call without the env."""
        cfg, w = self.config, self.worker
        second = any(ep.live and ep.turn == 1 for ep in episodes)
        if second and not self.expert and not (self.sampling or w.sampler.sampling).greedy:
            # Mid-rollout of RL (a chaos kill point): a first turn played and stepped.
            # Greedy evaluations and demonstrations are not.
            chaos.maybe_kill("rollout")
        feed = []
        for ep in episodes:
            ids = self._context(ep) if ep.live else []
            if ids is None:  # the context is full: the episode ends here, cut
                ep.traj.truncated = True
                ep.traj.steps.pop()  # the observation that did not fit gets no action
                ep.traj.final_obs_ids = ep.pending_ids
                ep.live = False
                ids = []
            feed.append(ids)
        if not any(feed):
            return [None] * len(episodes)
        allowed = None  # per episode, per action token: the ids the draw allowed
        if self.expert:
            actions_ids = [
                w._expert_ids(ep.traj.steps[-1].info) if f else [] for ep, f in zip(episodes, feed)
            ]
            logprobs = np.zeros((len(episodes), max(map(len, actions_ids)) + 1), np.float32)
        else:
            kwargs = {}
            if cfg.constrain_actions:
                kwargs["choices"] = [ep.choices if f else None for ep, f in zip(episodes, feed)]
            with timing.phase("sample"):
                if self.shapes is not None:
                    kwargs["shapes"] = self.shapes
                if cfg.context_mode == "step" or self.cache is None:
                    fixed = self.shapes is not None  # one cache shape: every slot at once
                    self.cache = w.sampler.start(self.size, cfg.max_seq_len, all_slots=fixed)
                turns = np.asarray([ep.turn for ep in episodes], np.int32)
                out = w.sampler.step_turn(
                    self.cache,
                    feed,
                    [w.action_budget(ep.choices) for ep in episodes],  # rows without feed: 0
                    fold_in(self.keys, turns),  # one key per episode and turn
                    sampling=self.sampling,
                    **kwargs,
                )
                # The turn's program done (its ids are read next anyway), so that ``sample``
                # times the program and ``transfer`` the copies.
                jax.block_until_ready(out.tokens)
            self.cache = out.cache if cfg.context_mode == "episode" else None
            # Log-probs under the distribution sampled from (the learner's logits / T);
            # greedy turns (never trained on) keep the raw policy's.
            # (With top-k / top-p they are of the filtered distribution: the mismatch shows
            # in the trainer's rollout/logprob_mismatch metric.)
            greedy = (self.sampling or w.sampler.sampling).greedy
            with timing.phase("transfer"):
                actions_ids = out.token_lists()
                allowed = out.allowed_lists() if cfg.constrain_actions else None
                logprobs = np.asarray(out.policy_logprobs if greedy else out.logprobs)
        actions: list[str | ToolCall | StepResult | None] = []
        for i, ep in enumerate(episodes):
            if not feed[i]:
                actions.append(None)
                continue
            step = ep.traj.steps[-1]
            step.prompt_ids = feed[i]
            step.obs_ids = ep.pending_ids
            step.action_ids = actions_ids[i]
            step.action_logprobs = logprobs[i, : len(actions_ids[i])].tolist()
            if allowed is not None:
                step.action_allowed = allowed[i]
            ep.used += len(feed[i]) + len(actions_ids[i])
            ep.turn += 1
            if cfg.context_mode == "step":
                ep.history.append(ep.pending_ids + actions_ids[i])
            actions.append(w._call(ep, decode_text(w.tokenizer, actions_ids[i])))
        return actions

    def observe(self, ep: Episode, res: StepResult) -> None:
        w, traj = self.worker, ep.traj
        step = traj.steps[-1]
        step.reward = float(res.reward)
        step.done = bool(res.done)
        step.info = {**step.info, **_step_info(res.info)}
        if res.observation is not None:
            ep.pending_ids = w._obs_ids(res.observation, first=False)
        if res.done:
            traj.won = bool(res.info.get("won", False))
            # The environment's own step limit cuts the episode; it did not end it.
            traj.truncated = bool(res.info.get("truncated", False))
            if res.observation is not None:
                traj.final_obs_ids = ep.pending_ids
            return
        ep.choices = w._choices(res.observation)
        traj.steps.append(_empty_step(res.info))


def _empty_step(info) -> Step:
    return Step(
        prompt_ids=[],
        action_ids=[],
        action_logprobs=[],
        state_key=int(info.get("state_key", 0)),
        info={"expert_action": info.get("expert_action")},
    )


def _step_info(info) -> dict:
    """What a step keeps of the env's answer to its action: the outcome, the score, and the
    state it led to (``state_key``: the step's own ``Step.state_key`` is the state it acted
    from; ``room``, ``expert_steps`` where the env reports them: the failure breakdown's,
    experiments/failures.py)."""
    keys = ("won", "lost", "invalid_action", "invalid_tool_call", "score", "max_score")
    keys += ("task_type", "state_key", "room", "expert_steps")
    return {k: info[k] for k in keys if k in info}
