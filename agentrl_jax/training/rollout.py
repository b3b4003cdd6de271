"""Batched multi-turn rollouts: environments in the actor pool, the policy in the sampler.

Token-in, token-out. Each observation is rendered to text and encoded once, as it is fed to the
model (``ChatTemplate.turn_ids``); the actions are the sampler's own ids. The environment receives
decoded text, but nothing trained on is ever re-encoded from decoded text.

Each step keeps its newest observation's ids (``Step.obs_ids``) and each episode the observation
after its last action (``Trajectory.final_obs_ids``). An episode is ``truncated`` when a limit
cut it: the rollout's ``max_turns`` or context length (below), or the environment's own step
limit (its step info says ``truncated``).

Context modes:

- ``episode``: one KV cache per episode kept across turns; each turn prefills only the new
  observation ids. An episode whose next turn would not fit ``max_seq_len`` (its prompt plus
  ``max_new_tokens``) ends there, marked ``truncated``.
- ``step``: every turn starts a fresh context: the system prompt with the episode's goal
  (encoded once at reset), then the stored ids of the last ``history_turns`` turns (observation
  and action, as they were first encoded), then the new observation; the goal is always in view,
  however old the turn that stated it. Oldest turns are dropped first until the context fits
  ``max_seq_len`` (``truncated`` is then set on the step's info as ``context_truncated``).
"""

from __future__ import annotations

import copy
import dataclasses

import jax
import numpy as np

from agentrl_jax.envs.base import Observation, Task
from agentrl_jax.sampling import SamplingParams
from agentrl_jax.training import chaos
from agentrl_jax.training.chat import ChatTemplate
from agentrl_jax.training.trajectory import Step, Trajectory

CONTEXT_MODES = ("episode", "step")


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """Attributes:
    group_size: G rollouts per task instance (they share a group id).
    max_turns: environment steps per episode at most.
    max_new_tokens: tokens per action at most.
    max_seq_len: tokens one context may hold (the episode in ``episode`` mode).
    context_mode: 'episode' or 'step'.
    history_turns: k, the turns kept in a step-wise context.
    system_prompt: text before the first observation.
    show_admissible: list the admissible commands in each observation.
    constrain_actions: constrained decoding: the policy can only write one of the
      observation's admissible commands (closed with the stop token). Every draw is from the
      policy masked to the tokens that continue an admissible command; the allowed ids are
      stored with the action so the learner normalises over the same set. Observations without
      admissible commands leave the turn unconstrained; an env that never lists any is a config
      error, and an admissible command that does not fit ``max_new_tokens`` with its stop token
      stops the rollout with an error naming it and its length (it is never cut).
    """

    group_size: int = 4
    max_turns: int = 12
    max_new_tokens: int = 12
    max_seq_len: int = 1536
    context_mode: str = "episode"
    history_turns: int = 2
    system_prompt: str = "You are playing a text game. Reply with one command."
    show_admissible: bool = True
    constrain_actions: bool = False

    def __post_init__(self):
        if self.context_mode not in CONTEXT_MODES:
            raise ValueError(
                f"rollout.context_mode is {self.context_mode!r}; expected one of {CONTEXT_MODES}"
            )
        for name in ("group_size", "max_turns", "max_new_tokens", "max_seq_len"):
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
    obs: Observation, *, first: bool, show_admissible: bool, goal: bool = True
) -> str:
    """The text the agent reads for one turn (the first states the goal unless ``goal=False``)."""
    parts = []
    if first:
        if goal:
            parts.append(goal_line(obs))
        parts.append(obs.text)
    else:
        parts.append(obs.feedback or obs.text)
    if obs.inventory:
        parts.append(f"Inventory: {obs.inventory}")
    if show_admissible and obs.admissible_commands:
        parts.append("Commands: " + " | ".join(obs.admissible_commands))
    return "\n".join(p.strip() for p in parts if p and p.strip())


def goal_line(obs: Observation) -> str:
    return f"Goal: {obs.objective}"


class RolloutWorker:
    """Runs episodes of a batch of tasks with a sampler and an actor pool."""

    def __init__(self, pool, sampler, tokenizer, template: ChatTemplate, config: RolloutConfig):
        self.pool = pool
        self.sampler = sampler
        self.tokenizer = tokenizer
        self.template = template
        self.config = config
        self.system_ids = template.system_ids(tokenizer, config.system_prompt)

    def _obs_ids(self, obs: Observation, first: bool) -> list[int]:
        text = render_observation(
            obs,
            first=first,
            show_admissible=self.config.show_admissible,
            goal=self.config.context_mode == "episode",  # step mode: the goal is in the header
        )
        return self.template.turn_ids(self.tokenizer, text, first=first)

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
        """Episodes the actor pool plays at once (None: a pool without a limit)."""
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
    ) -> list[Trajectory]:
        """Plays ``group_size`` episodes of every task; returns them in task-major order.

        With ``expert=True`` the environment's expert acts instead of the policy (SFT
        demonstrations): its command is encoded once and closed with the stop token, and the
        contexts are built exactly as for the policy, so demonstrations and rollouts match.

        ``task_offset`` is the position of ``tasks[0]`` in a longer task list that this call
        plays a slice of (a multi-host process's share, starting on a wave boundary): each wave
        is keyed and grouped by its position in the whole list, so the slice plays exactly as it
        would inside the whole list.
        """
        group_size = group_size or self.config.group_size
        per_wave = self.wave_size(len(tasks), group_size)
        out = []
        for start in range(0, len(tasks), per_wave):
            first = task_offset + start
            out += self._run_wave(
                tasks[start : start + per_wave],
                jax.random.fold_in(rng, first),
                sampling=sampling,
                group_offset=group_offset + first,
                expert=expert,
                group_size=group_size,
            )
        return out

    def _run_wave(self, tasks, rng, *, sampling, group_offset, expert, group_size):
        """One batch of episodes that fits the pool at once."""
        cfg = self.config
        episodes = [t for t in tasks for _ in range(group_size)]
        trajs = [
            Trajectory(task=t, group=group_offset + i // group_size) for i, t in enumerate(episodes)
        ]
        results = self.pool.reset(episodes)
        live = []  # per episode: still playing
        pending_ids: list[list[int]] = []
        choices: list[list[list[int]] | None] = [None] * len(episodes)  # constrain_actions
        history: list[list[list[int]]] = [[] for _ in episodes]  # step mode: per-turn ids
        headers: list[list[int]] = [[] for _ in episodes]  # step mode: system prompt + goal
        for i, res in enumerate(results):
            if res.infra_failure:
                trajs[i].infra_failure = True
                live.append(False)
                pending_ids.append([])
                continue
            live.append(True)
            pending_ids.append(self._obs_ids(res.observation, first=True))
            choices[i] = self._choices(res.observation)
            if cfg.context_mode == "step":
                headers[i] = trajs[i].header_ids = self._header_ids(res.observation)
            trajs[i].steps.append(_empty_step(res.info))

        cache = None
        if cfg.context_mode == "episode" and not expert:
            cache = self.sampler.start(len(episodes), cfg.max_seq_len)
        used = np.zeros(len(episodes), np.int64)
        # RL's rollouts (a chaos kill point); greedy evaluations and demonstrations are not.
        sampled = not expert and not (sampling or self.sampler.sampling).greedy

        for turn in range(cfg.max_turns):
            if not any(live):
                break
            feed = []
            for i in range(len(episodes)):
                if not live[i]:
                    feed.append([])
                    continue
                if cfg.context_mode == "episode":
                    ids = (self.system_ids if turn == 0 else []) + pending_ids[i]
                    if used[i] + len(ids) + cfg.max_new_tokens > cfg.max_seq_len:
                        trajs[i].truncated = True
                        trajs[i].steps.pop()  # the observation that did not fit gets no action
                        trajs[i].final_obs_ids = pending_ids[i]
                        live[i] = False
                        feed.append([])
                        continue
                    feed.append(ids)
                else:
                    feed.append(
                        self._step_context(headers[i], history[i], pending_ids[i], trajs[i])
                    )
            if not any(feed):
                break
            allowed = None  # per episode, per action token: the ids the draw allowed
            if expert:
                actions_ids = [
                    self._expert_ids(t.steps[-1].info) if f else [] for t, f in zip(trajs, feed)
                ]
                logprobs = np.zeros((len(episodes), max(map(len, actions_ids)) + 1), np.float32)
            else:
                if cfg.context_mode == "step":
                    cache = self.sampler.start(len(episodes), cfg.max_seq_len)
                kwargs = {}
                if cfg.constrain_actions:
                    kwargs["choices"] = [c if f else None for c, f in zip(choices, feed)]
                out = self.sampler.step_turn(
                    cache,
                    feed,
                    cfg.max_new_tokens,
                    jax.random.fold_in(rng, turn),
                    sampling=sampling,
                    **kwargs,
                )
                cache = out.cache if cfg.context_mode == "episode" else None
                actions_ids = out.token_lists()
                allowed = out.allowed_lists() if cfg.constrain_actions else None
                # Log-probs under the distribution sampled from (the learner's logits / T);
                # greedy turns (never trained on) keep the raw policy's.
                # (With top-k / top-p they are of the filtered distribution: the mismatch shows
                # in the trainer's rollout/logprob_mismatch metric.)
                greedy = (sampling or self.sampler.sampling).greedy
                logprobs = np.asarray(out.policy_logprobs if greedy else out.logprobs)
            actions: list[str | None] = []
            for i in range(len(episodes)):
                if not feed[i]:
                    actions.append(None)
                    continue
                step = trajs[i].steps[-1]
                step.prompt_ids = feed[i]
                step.obs_ids = pending_ids[i]
                step.action_ids = actions_ids[i]
                step.action_logprobs = logprobs[i, : len(actions_ids[i])].tolist()
                if allowed is not None:
                    step.action_allowed = allowed[i]
                used[i] += len(feed[i]) + len(actions_ids[i])
                if cfg.context_mode == "step":
                    history[i].append(pending_ids[i] + actions_ids[i])
                actions.append(self._decode_action(actions_ids[i]))
            results = self.pool.step(actions)
            for i, res in enumerate(results):
                if res is None:
                    continue
                step = trajs[i].steps[-1]
                if res.infra_failure:
                    trajs[i].infra_failure = True
                    live[i] = False
                    continue
                step.reward = float(res.reward)
                step.done = bool(res.done)
                step.info = {**step.info, **_step_info(res.info)}
                if res.observation is not None:
                    pending_ids[i] = self._obs_ids(res.observation, first=False)
                if res.done:
                    trajs[i].won = bool(res.info.get("won", False))
                    # The environment's own step limit cuts the episode; it did not end it.
                    trajs[i].truncated = bool(res.info.get("truncated", False))
                    if res.observation is not None:
                        trajs[i].final_obs_ids = pending_ids[i]
                    live[i] = False
                    continue
                choices[i] = self._choices(res.observation)
                trajs[i].steps.append(_empty_step(res.info))
            if turn == 0 and sampled:
                chaos.maybe_kill("rollout")
        for i, traj in enumerate(trajs):
            # Episodes still running at max_turns: the last observation got no action.
            if live[i] and traj.steps and not traj.steps[-1].action_ids:
                traj.steps.pop()
                traj.truncated = True
                traj.final_obs_ids = pending_ids[i]
        return trajs

    def _step_context(self, header, history, obs_ids, traj) -> list[int]:
        """Header (system + goal) + the last k turns (stored ids) + the new observation, fitted."""
        cfg = self.config
        keep = history[-cfg.history_turns :] if cfg.history_turns else []
        budget = cfg.max_seq_len - cfg.max_new_tokens - len(header) - len(obs_ids)
        while keep and sum(len(t) for t in keep) > budget:
            keep = keep[1:]
            traj.steps[-1].info["context_truncated"] = True
        if budget < 0:
            raise ValueError(
                f"an observation of {len(obs_ids)} tokens does not fit rollout.max_seq_len="
                f"{cfg.max_seq_len} with max_new_tokens={cfg.max_new_tokens}"
            )
        return header + [t for turn in keep for t in turn] + obs_ids

    def _choices(self, obs: Observation) -> list[list[int]] | None:
        """constrain_actions: the admissible commands as the ids the policy may write."""
        if not self.config.constrain_actions or not obs.admissible_commands:
            return None
        stop = self.template.stop_id(self.tokenizer)
        choices = []
        for command in obs.admissible_commands:
            ids = self.tokenizer.encode(command, add_special_tokens=False) + [stop]
            if len(ids) > self.config.max_new_tokens:
                # Never cut: a cut command is a different command (or none) to the env.
                raise ValueError(
                    f"admissible command {command!r} is {len(ids)} tokens with its stop token; "
                    f"config.rollout.max_new_tokens={self.config.max_new_tokens} cannot write it "
                    f"whole under constrained decoding: raise max_new_tokens to >= {len(ids)}"
                )
            choices.append(ids)
        return choices

    def _expert_ids(self, info) -> list[int]:
        action = info.get("expert_action")
        if not action:
            raise ValueError(
                "expert rollout: the environment gave no expert_action; expert demonstrations "
                "need an env with an expert (TextWorld, ALFWorld)"
            )
        # Never cut: a cut command would be a different command to the env (and a lost demo).
        ids = self.tokenizer.encode(action, add_special_tokens=False)
        return ids + [self.template.stop_id(self.tokenizer)]

    def _decode_action(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True).strip()


def _empty_step(info) -> Step:
    return Step(
        prompt_ids=[],
        action_ids=[],
        action_logprobs=[],
        state_key=int(info.get("state_key", 0)),
        info={"expert_action": info.get("expert_action")},
    )


def _step_info(info) -> dict:
    keys = ("won", "invalid_action", "score", "max_score", "task_type")
    return {k: info[k] for k in keys if k in info}
