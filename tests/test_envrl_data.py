"""ENVRL examples of real TextWorld episodes, as the trainer builds them (envrl_data.examples).

The expert plays a generated game through the rollout worker; the expected observation ids are
computed independently here, by replaying the episode's commands in a fresh env and encoding
what it shows with the chat template.
"""

import jax
import pytest

from agentrl_jax import kernels
from agentrl_jax.envs.actors import StepResult
from agentrl_jax.envs.textworld.env import TextWorldEnv
from agentrl_jax.models.tokenizer import build_tokenizer
from agentrl_jax.rl import envrl_data
from agentrl_jax.rollout.chat import get_template
from agentrl_jax.rollout.rollout import RolloutConfig, RolloutWorker, render_observation

# The raw TextWorld engine warns that Jericho cannot track these games' score.
pytestmark = pytest.mark.filterwarnings("ignore:.*is not fully supported")

TEMPLATE = get_template("qwen")


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    texts = ["You are in a kitchen. Goal: take the key and open the chest. go east | open"] * 10
    return build_tokenizer(texts, 400, tmp_path_factory.mktemp("tok"))


class InProcessPool:
    """The actor pool's interface over one TextWorld env in this process (no worker start-up)."""

    def __init__(self, max_steps):
        self.env = TextWorldEnv(max_steps=max_steps)

    def reset(self, tasks):
        (task,) = tasks
        return [StepResult(self.env.reset(task), info=self.env.reset_info())]

    def step(self, actions):
        obs, reward, done, info = self.env.step(actions[0])
        return [StepResult(obs, reward=reward, done=done, info=info)]


def _play(tok, task, mode, *, max_turns=20, env_steps=50, history_turns=1):
    cfg = RolloutConfig(
        max_turns=max_turns, max_new_tokens=32, max_seq_len=4096, context_mode=mode,
        history_turns=history_turns,
    )  # fmt: skip
    pool = InProcessPool(env_steps)
    worker = RolloutWorker(pool, None, tok, TEMPLATE, cfg)
    (traj,) = worker.run([task], jax.random.key(0), expert=True, group_size=1)
    pool.env.close()
    return traj, worker


def _replayed_observations(tok, task, traj, mode):
    """The ids of the observation after each action, from a fresh env fed the same commands."""
    env = TextWorldEnv(max_steps=50)
    env.reset(task)
    out = []
    for step in traj.steps:
        obs, *_ = env.step(tok.decode(step.action_ids, skip_special_tokens=True).strip())
        text = render_observation(obs, first=False, show_admissible=True, goal=mode == "episode")
        out.append(TEMPLATE.turn_ids(tok, text, first=False))
    env.close()
    return out


def _split(ex, i):
    """(input ids before the target, target ids) of example i."""
    ids, target = ex.input_ids[i].tolist(), ex.target_mask[i].tolist()
    start, end = target.index(1), len(target) - target[::-1].index(1)
    return ids[:start], ids[start:end]


def _contains(seq, sub):
    return any(seq[i : i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


def test_step_wise_examples_hold_the_next_observation_never_the_action(textworld_games, tok):
    task = textworld_games["train"][0]
    traj, worker = _play(tok, task, "step")
    assert traj.won and not traj.truncated and len(traj.steps) >= 2
    n = len(traj.steps)
    next_obs = _replayed_observations(tok, task, traj, "step")
    ex = envrl_data.examples([traj], "step", tok, TEMPLATE, max_len=4096)
    sp_instruction = envrl_data.instruction_ids(tok, TEMPLATE, envrl_data.SP_INSTRUCTION)
    id_instruction = envrl_data.instruction_ids(tok, TEMPLATE, envrl_data.ID_INSTRUCTION)
    # One example per action: the final transition (the winning move's observation) included.
    assert ex["sp"].steps.tolist() == ex["id"].steps.tolist() == list(range(n))
    for t, step in enumerate(traj.steps):
        s_t = step.prompt_ids  # what the agent saw: header, last turn, newest observation
        sp_input, sp_target = _split(ex["sp"], t)
        assert sp_target == next_obs[t]  # s_{t+1}: the env's next observation alone
        assert sp_input == s_t + step.action_ids + sp_instruction
        id_input, id_target = _split(ex["id"], t)
        assert id_target == step.action_ids
        assert id_input == s_t + next_obs[t] + id_instruction
        if all(step.action_ids != s.action_ids for s in traj.steps[:t]):
            assert not _contains(id_input, step.action_ids)  # a_t is not in its own input
        if t + 1 < n:  # The next prompt, the old s_{t+1}, holds a_t in its history.
            assert _contains(traj.steps[t + 1].prompt_ids, step.action_ids)
    assert "*** The End ***" in tok.decode(_split(ex["sp"], n - 1)[1])


def test_cut_examples_keep_the_goal_and_drop_the_middle_history(textworld_games, tok):
    task = textworld_games["train"][1]
    traj, worker = _play(tok, task, "step", history_turns=3)
    t = len(traj.steps) - 1
    step = traj.steps[t]
    header = traj.header_ids
    assert "Goal:" in tok.decode(header)
    history_and_obs = step.prompt_ids[len(header) :]
    assert len(history_and_obs) > len(step.obs_ids) + 20  # earlier turns are in view
    sp_instruction = envrl_data.instruction_ids(tok, TEMPLATE, envrl_data.SP_INSTRUCTION)
    id_instruction = envrl_data.instruction_ids(tok, TEMPLATE, envrl_data.ID_INSTRUCTION)
    # A budget that fits the goal, the newest observation, a_t and s_{t+1}, but not the history.
    target = traj.final_obs_ids
    keep = len(step.obs_ids) + 5
    max_len = len(header) + keep + len(step.action_ids) + len(sp_instruction) + len(target)
    ex = envrl_data.examples([traj], "step", tok, TEMPLATE, max_len=max_len)
    sp_input, sp_target = _split(ex["sp"], t)
    assert sp_input == header + history_and_obs[-keep:] + step.action_ids + sp_instruction
    assert sp_target == target
    id_input, id_target = _split(ex["id"], t)
    assert id_target == step.action_ids
    kept = max_len - len(header) - len(target) - len(id_instruction) - len(step.action_ids)
    assert 0 < kept < len(history_and_obs)
    assert id_input == header + history_and_obs[-kept:] + target + id_instruction


def test_episode_cut_by_the_env_step_limit_keeps_its_last_observation(textworld_games, tok):
    task = textworld_games["train"][2]
    traj, worker = _play(tok, task, "episode", env_steps=1)
    assert traj.truncated and not traj.won and len(traj.steps) == 1
    (next_obs,) = _replayed_observations(tok, task, traj, "episode")
    assert traj.final_obs_ids == next_obs
    ex = envrl_data.examples([traj], "episode", tok, TEMPLATE, max_len=1024)
    sp_instruction = envrl_data.instruction_ids(tok, TEMPLATE, envrl_data.SP_INSTRUCTION)
    step = traj.steps[0]
    assert _split(ex["sp"], 0) == (step.prompt_ids + step.action_ids + sp_instruction, next_obs)


def test_default_schedule_decays_over_the_rl_phase_however_many_updates_an_iteration_makes():
    # A horizon set: the step is the RL updates so far (4 iterations of 3 updates).
    ks = [envrl_data.schedule_step(12, it, 3 * it, u, 3) for it in range(4) for u in range(3)]
    assert ks == list(range(12))
    # Unset (step-wise: iterations of 5, 2 and 8 updates): the phase's progress in iterations,
    # against the learner's horizon of 3 iterations.
    ks = [
        envrl_data.schedule_step(0, it, 0, u, per)
        for it, per in enumerate([5, 2, 8])
        for u in range(per)
    ]
    want = [u / 5 for u in range(5)] + [1.0, 1.5] + [2 + u / 8 for u in range(8)]
    assert ks == pytest.approx(want, abs=1e-12)
    weights = [float(kernels.cosine_weight(k, 0.1, 3)) for k in ks]
    assert weights[0] == pytest.approx(0.1)
    assert all(a > b for a, b in zip(weights, weights[1:])) and weights[-1] < 0.003
