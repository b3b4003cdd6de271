"""Rollouts are token-in, token-out: the batch holds exactly the ids the model read and sampled."""

import dataclasses

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from agentrl_jax.envs.actors import StepResult
from agentrl_jax.envs.base import Observation, Task
from agentrl_jax.models import CausalLM, preset
from agentrl_jax.models.tokenizer import build_tokenizer
from agentrl_jax.rl.learner import Learner
from agentrl_jax.rl.spec import RLSpec
from agentrl_jax.rollout.chat import get_template
from agentrl_jax.rollout.rollout import RolloutConfig, RolloutWorker, render_observation
from agentrl_jax.rollout.trajectory import episode_rows, step_arrays, step_rows
from agentrl_jax.sampling import Sampler, SamplingParams, StopConfig

TEXTS = [
    "Goal: open the chest and take the coin. You are in a kitchen. There is a door to the north.",
    "go north | open chest | take coin | look | inventory | examine table",
    "You open the chest. You take the coin. Nothing happens. That's not a verb I recognise.",
] * 20


class ScriptedPool:
    """An in-process stand-in for ActorPool: each episode ends after ``length`` steps."""

    def __init__(self, lengths):
        self.lengths = lengths
        self.t = []

    def _obs_commands(self):
        return ("go north", "go south", "take coin", "take coin from chest")

    def _obs(self, i):
        return self._obs_at(self.t[i])

    def _obs_at(self, t):
        return Observation(
            objective="take the coin",
            text=f"room {t}",
            feedback=f"you did step {t}",
            admissible_commands=self._obs_commands(),
        )

    def reset(self, tasks):
        self.t = [0] * len(tasks)
        self.actions = []
        return [
            StepResult(self._obs(i), info={"state_key": 100, "expert_action": "go north"})
            for i in range(len(tasks))
        ]

    def step(self, actions):
        out = []
        for i, a in enumerate(actions):
            if a is None:
                out.append(None)
                continue
            self.t[i] += 1
            done = self.t[i] >= self.lengths[i % len(self.lengths)]
            self.actions.append(a)
            info = {"won": done, "state_key": 100 + self.t[i], "expert_action": "take coin"}
            out.append(StepResult(self._obs(i), reward=1.0 if done else 0.0, done=done, info=info))
        return out


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tok = build_tokenizer(TEXTS, 320, tmp_path_factory.mktemp("tok"))
    cfg = preset(
        "tiny",
        vocab_size=320,
        hidden_size=32,
        intermediate_size=64,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
    )
    policy = CausalLM(cfg, rngs=nnx.Rngs(0))
    template = get_template("plain")
    sampler = Sampler(
        policy,
        sampling=SamplingParams(temperature=1.0),
        stop=StopConfig(eos_ids=(template.stop_id(tok),)),
        pad_id=tok.pad_token_id,
    )
    return tok, policy, template, sampler


def _rollout(
    setup, mode, lengths=(2, 3), max_turns=4, max_seq_len=512, sampling=None, constrain=False
):
    tok, policy, template, sampler = setup
    cfg = RolloutConfig(
        group_size=2,
        max_turns=max_turns,
        max_new_tokens=12 if constrain else 6,  # the longest command is 11 tokens
        max_seq_len=max_seq_len,
        context_mode=mode,
        history_turns=1,
        constrain_actions=constrain,
    )
    worker = RolloutWorker(ScriptedPool(lengths), sampler, tok, template, cfg)
    tasks = [Task("scripted", "train", "a"), Task("scripted", "train", "b")]
    return worker.run(tasks, jax.random.key(0), sampling=sampling), worker


class LongCommandPool(ScriptedPool):
    """A pool whose only admissible command is longer than a small ``max_new_tokens``."""

    def _obs_commands(self):
        return ("take coin from chest",)


@pytest.mark.parametrize("mode", ["episode", "step"])
def test_constrained_decoding_writes_a_command_longer_than_max_new_tokens_whole(setup, mode):
    """Under constrained decoding the admissible commands bound the action: a turn's budget is
    its longest command with the stop token when ``max_new_tokens`` is shorter, never a cut."""
    tok, policy, template, sampler = setup
    (command,) = LongCommandPool([1])._obs_commands()
    n = len(tok.encode(command, add_special_tokens=False)) + 1  # with the stop token
    assert n > 2
    cfg = RolloutConfig(
        group_size=1, max_turns=2, max_new_tokens=2, context_mode=mode, constrain_actions=True
    )
    pool = LongCommandPool([2])
    (traj,) = RolloutWorker(pool, sampler, tok, template, cfg).run(
        [Task("scripted", "train", "a")], jax.random.key(0)
    )
    assert pool.actions == [command, command]
    assert [len(s.action_ids) for s in traj.steps] == [n, n]
    assert traj.won and not traj.truncated


def test_a_context_that_cannot_hold_the_longest_command_ends_the_episode_truncated(setup):
    """The context check counts the turn's budget: a prompt that leaves room for
    ``max_new_tokens`` but not for the whole command ends the episode, cut, not the run."""
    tok, policy, template, sampler = setup
    (command,) = LongCommandPool([1])._obs_commands()
    n = len(tok.encode(command, add_special_tokens=False)) + 1
    fits = RolloutConfig(group_size=1, max_turns=1, max_new_tokens=2, constrain_actions=True)
    worker = RolloutWorker(LongCommandPool([1]), sampler, tok, template, fits)
    (traj,) = worker.run([Task("scripted", "train", "a")], jax.random.key(0))
    prompt = len(traj.steps[0].prompt_ids)
    short = dataclasses.replace(fits, max_seq_len=prompt + n - 1)
    worker = RolloutWorker(LongCommandPool([1]), sampler, tok, template, short)
    (traj,) = worker.run([Task("scripted", "train", "a")], jax.random.key(0))
    assert traj.truncated and not traj.steps


def test_episode_rows_hold_exactly_what_the_model_read_and_sampled(setup):
    tok, policy, template, sampler = setup
    trajs, worker = _rollout(setup, "episode")
    assert [t.group for t in trajs] == [0, 0, 1, 1]
    assert [len(t.steps) for t in trajs] == [2, 3, 2, 3]
    assert all(t.won for t in trajs)
    rows = episode_rows(trajs, 512, tok.pad_token_id)
    for r, traj in enumerate(trajs):
        expected = [i for s in traj.steps for i in s.prompt_ids + s.action_ids]
        n = len(expected)
        assert rows.tokens[r, :n].tolist() == expected
        assert rows.mask[r, n:].sum() == 0
        # The first step's prompt starts with the system prompt, encoded once.
        assert traj.steps[0].prompt_ids[: len(worker.system_ids)] == worker.system_ids
        # Loss mask and step ids cover exactly the sampled ids, step by step.
        acted = rows.tokens[r][rows.loss_mask[r] > 0].tolist()
        assert acted == [i for s in traj.steps for i in s.action_ids]
        steps = rows.step_ids[r][rows.loss_mask[r] > 0].tolist()
        assert steps == [k for k, s in enumerate(traj.steps) for _ in s.action_ids]
    arrays = step_arrays(trajs, 4)
    assert arrays.rewards.tolist()[1] == [0.0, 0.0, 1.0, 0.0]
    assert arrays.state_keys[1, :3].tolist() == [100, 101, 102]


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_sampler_logprobs_equal_the_learners_teacher_forced_logprobs(setup, temperature):
    # The recorded log-probs are of the distribution sampled from; the learner, told the
    # temperature, recomputes exactly them from logits / T.
    tok, policy, template, sampler = setup
    trajs, _ = _rollout(setup, "episode", sampling=SamplingParams(temperature=temperature))
    rows = episode_rows(trajs, 512, tok.pad_token_id)
    learner = Learner(policy, None, optax.sgd(0.0), spec=RLSpec.for_losses(temperature=temperature))
    state = learner.init(policy)
    batch = {"tokens": rows.tokens, "mask": rows.mask}
    logp = np.asarray(learner.policy_logprobs(state.policy, batch))
    on = rows.loss_mask > 0
    np.testing.assert_allclose(logp[on], rows.old_logprobs[on], atol=1e-5, rtol=0)


# Episode mode at T=1 runs under -m slow: T=0.6 covers the same path, scaled.
@pytest.mark.parametrize(
    "mode, temperature",
    [pytest.param("episode", 1.0, marks=pytest.mark.slow), ("episode", 0.6), ("step", 1.0)],
)
def test_constrained_actions_are_admissible_and_the_learner_normalises_over_the_same_ids(
    setup, mode, temperature
):
    tok, policy, template, sampler = setup
    stop = template.stop_id(tok)
    commands = {
        c: tok.encode(c, add_special_tokens=False) + [stop]
        for c in ScriptedPool([1])._obs_commands()
    }
    trajs, worker = _rollout(
        setup, mode, sampling=SamplingParams(temperature=temperature), constrain=True
    )
    # A random policy writes nothing admissible unconstrained; constrained, it writes only
    # admissible commands, token for token as the tokenizer encodes them.
    assert all(s.action_ids in commands.values() for t in trajs for s in t.steps)
    assert set(worker.pool.actions) <= set(commands)
    rows = (episode_rows if mode == "episode" else step_rows)(trajs, 512, tok.pad_token_id)
    on = rows.loss_mask > 0
    # Independent reference: the teacher-forced logits of the rows, each action token
    # normalised over the next ids of the commands that match the action so far.
    logits, _ = policy(rows.tokens, mask_bt=rows.mask)
    logits = np.asarray(logits, np.float64) / temperature
    expected = np.zeros(rows.tokens.shape)
    for r in range(rows.tokens.shape[0]):
        for t in np.flatnonzero(on[r]):
            k = t - 1
            while on[r, k]:
                k -= 1
            prefix = rows.tokens[r, k + 1 : t].tolist()
            ids = sorted({c[len(prefix)] for c in commands.values() if c[: len(prefix)] == prefix})
            assert sorted(rows.allowed[r, t][rows.allowed[r, t] >= 0].tolist()) == ids
            z = logits[r, t - 1]
            expected[r, t] = (
                z[rows.tokens[r, t]] - np.log(np.sum(np.exp(z[ids] - z.max()))) - z.max()
            )
    np.testing.assert_allclose(rows.old_logprobs[on], expected[on], atol=2e-5, rtol=0)
    learner = Learner(policy, None, optax.sgd(0.0), spec=RLSpec.for_losses(temperature=temperature))
    state = learner.init(policy)
    batch = {"tokens": rows.tokens, "mask": rows.mask, "allowed": rows.allowed}
    logp = np.asarray(learner.policy_logprobs(state.policy, batch))
    np.testing.assert_allclose(logp[on], rows.old_logprobs[on], atol=1e-5, rtol=0)
    # Greedy (evaluation) turns are constrained too.
    greedy, worker = _rollout(setup, mode, sampling=SamplingParams(temperature=0.0), constrain=True)
    assert set(worker.pool.actions) <= set(commands)


def test_lossy_round_trip_text_cannot_change_what_is_trained(setup):
    tok, *_ = setup
    trajs, _ = _rollout(setup, "episode")
    rows = episode_rows(trajs, 512, tok.pad_token_id)
    lossy = 0
    for r, traj in enumerate(trajs):
        for step in traj.steps:
            ids = step.action_ids
            reencoded = tok.encode(tok.decode(ids), add_special_tokens=False)
            lossy += reencoded != ids
        acted = rows.tokens[r][rows.loss_mask[r] > 0].tolist()
        assert acted == [i for s in traj.steps for i in s.action_ids]
    # A random policy emits token sequences that the tokenizer would never produce, so decoding
    # and re-encoding would have changed the training data; the batch keeps the sampled ids.
    assert lossy > 0


def test_step_mode_rebuilds_context_from_stored_ids(setup):
    tok, *_ = setup
    trajs, worker = _rollout(setup, "step", lengths=(3,))
    rows = step_rows(trajs, 512, tok.pad_token_id)
    assert rows.tokens.shape[0] == sum(len(t.steps) for t in trajs)
    first, second, third = trajs[0].steps
    # A step's context is a header (system prompt + the goal, encoded once at reset), the last
    # turn (its observation and action, as first encoded) and the new observation: rebuilt
    # from stored ids, never re-encoded.
    header = worker.template.system_ids(tok, f"{worker.config.system_prompt}\nGoal: take the coin")
    assert first.prompt_ids[: len(header)] == header
    assert tok.decode(first.prompt_ids[len(header) :]).count("Goal:") == 0
    head = first.prompt_ids + first.action_ids
    assert second.prompt_ids[: len(head)] == head
    # history_turns=1: step 2 keeps step 1's turn but not step 0's; the goal is still in view.
    turn1 = second.prompt_ids[len(head) :] + second.action_ids
    assert third.prompt_ids[: len(header)] == header
    assert third.prompt_ids[len(header) : len(header) + len(turn1)] == turn1


def test_episode_that_outgrows_the_context_is_truncated(setup):
    trajs, worker = _rollout(setup, "episode", lengths=(50,), max_turns=50, max_seq_len=96)
    assert all(t.truncated and not t.won for t in trajs)
    assert all(len(t.steps) >= 1 and all(s.action_ids for s in t.steps) for t in trajs)
    for traj in trajs:  # The observation that did not fit is kept as the final one.
        k = len(traj.steps)
        obs = render_observation(ScriptedPool([1])._obs_at(k), first=False, show_admissible=True)
        assert traj.final_obs_ids == worker.template.turn_ids(worker.tokenizer, obs, first=False)


class LongObservationPool(ScriptedPool):
    """ScriptedPool whose episode ``i`` shows, at step ``long_at[i]`` (0: the reset), an
    observation longer than any context."""

    def __init__(self, lengths, long_at):
        super().__init__(lengths)
        self.long_at = long_at

    def _obs(self, i):
        t = self.t[i]
        return self.long_obs(t) if t == self.long_at[i] else self._obs_at(t)

    def long_obs(self, t):
        long = " ".join(["chest"] * 1000)
        obs = self._obs_at(t)
        return dataclasses.replace(obs, text=f"{obs.text} {long}", feedback=long)


def test_step_mode_observation_longer_than_the_context_ends_the_episode_truncated(setup):
    """Step-wise contexts: an observation that no context can hold ends its episode as truncated
    (at the reset: an episode of no step), counted, and the other episodes play on."""
    from agentrl_jax.run.trainer import rollout_metrics

    tok, policy, template, sampler = setup
    cfg = RolloutConfig(
        group_size=2,
        max_turns=4,
        max_new_tokens=6,
        max_seq_len=512,
        context_mode="step",
        history_turns=1,  # as _rollout: the same compiled shapes
    )
    pool = LongObservationPool((3,), long_at=(2, 0, -1, -1))
    worker = RolloutWorker(pool, sampler, tok, template, cfg)
    tasks = [Task("scripted", "train", "a"), Task("scripted", "train", "b")]
    trajs = worker.run(tasks, jax.random.key(0))
    assert [(t.truncated, t.won, len(t.steps)) for t in trajs] == [
        (True, False, 2), (True, False, 0), (False, True, 3), (False, True, 3),
    ]  # fmt: skip
    assert not any(t.infra_failure for t in trajs)
    # The observation that did not fit is the episode's final one; it got no action.
    cut, unplayed = trajs[0], trajs[1]
    assert cut.final_obs_ids == worker._obs_ids(pool.long_obs(2), first=False)
    assert unplayed.final_obs_ids == worker._obs_ids(pool.long_obs(0), first=True)
    assert len(cut.final_obs_ids) > cfg.max_seq_len
    assert all(s.action_ids and len(s.prompt_ids) <= 512 - 6 for s in cut.steps)
    metrics = rollout_metrics(trajs)
    assert metrics["rollout/infra_failures"] == 0.0
    assert metrics["rollout/truncated"] == 0.5 and metrics["rollout/success_rate"] == 0.5
    # The rows hold the played steps only.
    rows = step_rows([t for t in trajs if t.steps], 512, tok.pad_token_id)
    assert rows.tokens.shape[0] == 2 + 3 + 3


@pytest.mark.parametrize("mode", ["episode", "step"])
def test_every_step_keeps_its_observation_and_the_episode_its_final_one(setup, mode):
    tok, *_ = setup
    trajs, worker = _rollout(setup, mode, lengths=(2, 5), max_turns=3)
    assert [(t.won, t.truncated, len(t.steps)) for t in trajs] == [
        (True, False, 2), (False, True, 3), (True, False, 2), (False, True, 3),
    ]  # fmt: skip
    for traj in trajs:
        shown = [ScriptedPool([1])._obs_at(k) for k in range(len(traj.steps) + 1)]
        ids = [
            worker._obs_ids(obs, first=k == 0) for k, obs in enumerate(shown)
        ]  # as encoded for the model, once
        assert [s.obs_ids for s in traj.steps] == ids[:-1]
        assert all(s.prompt_ids[-len(s.obs_ids) :] == s.obs_ids for s in traj.steps)
        assert traj.final_obs_ids == ids[-1]  # won: the winning move's answer; cut: the next one
        assert traj.header_ids == (worker._header_ids(shown[0]) if mode == "step" else [])


def test_truncated_episode_rows_bootstrap_gae_from_the_state_after_the_last_action(setup):
    from agentrl_jax import kernels
    from agentrl_jax.rl import rl_batch

    tok, *_ = setup
    trajs, _ = _rollout(setup, "episode", lengths=(2, 5), max_turns=3)
    rl = rl_batch.build_rows(trajs, "episode", tok.pad_token_id, 1, bootstrap=True)
    rows = rl.rows
    values = np.random.default_rng(0).uniform(-1, 1, rows.tokens.shape).astype(np.float32)
    adv, ret = rl_batch.advantages(
        rl, len(trajs), "gae", kernels.AdvantageConfig(gamma=0.9, lam=0.8), values=values
    )
    for r, traj in enumerate(trajs):
        n = sum(len(s.prompt_ids) + len(s.action_ids) for s in traj.steps)
        pos = rows.bootstrap_pos[r]
        if traj.truncated:  # the row goes on with the final observation, no loss on it
            assert pos == n + len(traj.final_obs_ids) < rows.tokens.shape[1]
            assert rows.tokens[r, n:pos].tolist() == traj.final_obs_ids
            assert rows.mask[r, n:pos].all() and not rows.loss_mask[r, n:].any()
        else:
            assert pos == -1 and not rows.mask[r, n:].any()
        # Plain GAE over the agent tokens; after the last: V where the next action would start.
        agent = np.flatnonzero(rows.loss_mask[r])
        rewards = np.zeros(len(agent))
        for k, step in enumerate(traj.steps):
            rewards[np.flatnonzero(rows.step_ids[r, agent] == k)[-1]] = step.reward
        v = [float(values[r, t]) for t in agent] + [float(values[r, pos]) if pos >= 0 else 0.0]
        want, last = np.zeros(len(agent)), 0.0
        for i in reversed(range(len(agent))):
            last = rewards[i] + 0.9 * v[i + 1] - v[i] + 0.9 * 0.8 * last
            want[i] = last
        np.testing.assert_allclose(adv[r, agent], want, rtol=0, atol=1e-5)
        np.testing.assert_allclose(ret[r, agent], want + v[:-1], rtol=0, atol=1e-5)


def test_expert_rollout_encodes_the_experts_command_once(setup):
    tok, policy, template, sampler = setup
    cfg = RolloutConfig(group_size=1, max_turns=5, max_new_tokens=6, max_seq_len=512)
    pool = ScriptedPool((2,))
    worker = RolloutWorker(pool, sampler, tok, template, cfg)
    (traj,) = worker.run([Task("scripted", "train", "a")], jax.random.key(0), expert=True)
    stop = template.stop_id(tok)
    assert [s.action_ids for s in traj.steps] == [
        tok.encode("go north", add_special_tokens=False) + [stop],
        tok.encode("take coin", add_special_tokens=False) + [stop],
    ]
    assert pool.actions == ["go north", "take coin"] and traj.won


def test_run_reports_the_episodes_that_end_to_progress(setup):
    tok, policy, template, sampler = setup
    cfg = RolloutConfig(group_size=2, max_turns=3, max_new_tokens=6, max_seq_len=512)
    pool = ScriptedPool((2, 3))
    pool.capacity = 4  # waves of 2 tasks x 2 episodes
    worker = RolloutWorker(pool, sampler, tok, template, cfg)
    tasks = [Task("scripted", "train", x) for x in "abc"]
    ended = []
    trajs = worker.run(tasks, jax.random.key(0), expert=True, progress=ended.append)
    assert len(trajs) == 6 and ended == [4, 2]


def test_render_observation_lists_commands():
    obs = Observation(objective="win", text="a room", admissible_commands=("look", "go east"))
    text = render_observation(obs, first=True, show_admissible=True)
    assert text.splitlines() == ["Goal: win", "a room", "Commands: look | go east"]


@pytest.mark.parametrize("restate", [False, True])
def test_restate_goal_opens_every_observation_of_an_episode_with_the_goal(setup, restate):
    tok, policy, template, sampler = setup
    cfg = RolloutConfig(
        group_size=1, max_turns=5, max_new_tokens=6, max_seq_len=512, restate_goal=restate
    )
    worker = RolloutWorker(ScriptedPool((3,)), sampler, tok, template, cfg)
    (traj,) = worker.run([Task("scripted", "train", "a")], jax.random.key(0), expert=True)
    texts = [tok.decode(s.obs_ids, skip_special_tokens=True) for s in traj.steps]
    texts.append(tok.decode(traj.final_obs_ids, skip_special_tokens=True))
    assert "Goal: take the coin" in texts[0]
    assert ["Goal: take the coin" in t for t in texts[1:]] == [restate] * 3
    assert all(f"you did step {t}" in text for t, text in enumerate(texts[1:], 1))


def test_render_observation_restates_the_goal_after_the_first_turn_only_when_asked():
    obs = Observation(objective="win", text="a room", feedback="you moved")
    assert render_observation(obs, first=False, show_admissible=False) == "you moved"
    again = render_observation(obs, first=False, show_admissible=False, restate=True)
    assert again.splitlines() == ["Goal: win", "you moved"]
    # Step mode (goal=False: the header holds it) never restates it.
    assert render_observation(
        obs, first=False, show_admissible=False, goal=False, restate=True
    ) == ("you moved")
