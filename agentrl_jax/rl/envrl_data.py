"""ENVRL's examples from the rollouts: (s_t, a_t, s_{t+1}) as the agent saw, wrote and got them.

- s_t is what the agent saw when it acted at t: a goal part, always kept when an example is cut
  (step-wise: the header with the system prompt and the goal; whole-episode: the first prompt,
  which states the goal), then the rest of the context, oldest first (the history, then the
  newest observation), of which the oldest tokens go first when an example is too long.
- a_t is the sampled action ids.
- s_{t+1} is the environment's next observation turn alone (``Step.obs_ids`` of the next step,
  or ``Trajectory.final_obs_ids`` after the last action, so the final transition is kept), never
  the next prompt: in step-wise mode that prompt's history holds a_t, which would let inverse
  dynamics copy the answer and state prediction copy the history.

Each example carries an instruction turn saying which task it is (``SP_INSTRUCTION``,
``ID_INSTRUCTION``), encoded by the chat template like an observation.
"""

from __future__ import annotations

from agentrl_jax import kernels
from agentrl_jax.rollout.chat_template import ChatTemplate
from agentrl_jax.rollout.trajectory import Trajectory

SP_INSTRUCTION = "Predict the next observation."
ID_INSTRUCTION = "Which action led from the first observation to the second?"


def transitions(traj: Trajectory, mode: str, max_len: int | None = None) -> list:
    """The trajectory's ENVRL transitions (``kernels.Transition``), one per step with a known
    next observation; ``max_len`` bounds the context kept (no example holds more)."""
    steps = traj.steps
    if not steps:
        return []
    goal = traj.header_ids if mode == "step" else steps[0].prompt_ids
    out = []
    history: list[int] = []  # whole-episode: everything the agent saw after the first prompt
    for t, step in enumerate(steps):
        if mode == "step":
            if step.prompt_ids[: len(goal)] != goal:
                raise ValueError(
                    f"trajectory of {traj.task.name}, step {t}: the prompt does not start "
                    "with the trajectory's header_ids; expected step-wise contexts"
                )
            context = step.prompt_ids[len(goal) :]
        else:
            if t:
                history += steps[t - 1].action_ids + step.prompt_ids
                if max_len is not None:
                    history = history[-max_len:]
            context = list(history)
        next_obs = steps[t + 1].obs_ids if t + 1 < len(steps) else traj.final_obs_ids
        if next_obs:
            out.append(kernels.Transition(goal, context, step.action_ids, next_obs))
    return out


def schedule_step(horizon: int, iteration: int, first: int, update: int, updates: int) -> float:
    """The ENVRL weights' schedule step of one RL update.

    Update ``update`` (of ``updates``) of RL iteration ``iteration``, the learner having made
    ``first`` updates before that iteration: with ``envrl.horizon`` set, the RL updates so far;
    unset (0), the RL phase's progress in iterations, ``iteration + update / updates`` (the
    learner's horizon is then the run's iterations), so the weights reach 0 at the end of the
    phase however many updates each iteration makes (step-wise: one row per step played).
    """
    return float(first + update) if horizon else iteration + update / updates


def instruction_ids(tokenizer, template: ChatTemplate, text: str) -> list[int]:
    """An instruction as a turn of the conversation (encoded like an observation)."""
    return template.turn_ids(tokenizer, text, first=False)


def examples(
    trajs: list[Trajectory], mode: str, tokenizer, template: ChatTemplate, *, max_len: int
) -> dict[str, kernels.AuxExamples]:
    """State-prediction ("sp") and inverse-dynamics ("id") examples of ``max_len`` tokens."""
    per_traj = [transitions(t, mode, max_len) for t in trajs]
    pad = tokenizer.pad_token_id
    return {
        "sp": kernels.build_state_prediction(
            per_traj,
            max_len=max_len,
            instruction_ids=instruction_ids(tokenizer, template, SP_INSTRUCTION),
            pad_id=pad,
        ),
        "id": kernels.build_inverse_dynamics(
            per_traj,
            max_len=max_len,
            instruction_ids=instruction_ids(tokenizer, template, ID_INSTRUCTION),
            pad_id=pad,
        ),
    }
