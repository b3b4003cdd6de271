"""Continuous batching: the same episodes as synchronous waves, with rows reused and env steps
overlapping the other cohort's decoding, and no turn program compiled after a warm-up play
whatever order the env replies come back in."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx
from inprocess_pool import InProcessPool

from agentrl_jax.envs.actors import ActorPool
from agentrl_jax.envs.base import Observation, Task
from agentrl_jax.models import CausalLM, preset
from agentrl_jax.models.tokenizer import build_tokenizer
from agentrl_jax.rollout.chat import get_template
from agentrl_jax.rollout.rollout import RolloutConfig, RolloutWorker
from agentrl_jax.sampling import Sampler, SamplingParams, StopConfig

pytestmark = pytest.mark.filterwarnings("ignore:.*is not fully supported")

TEXTS = [
    "Goal: open the chest and take the coin. You are in a kitchen. There is a door to the north.",
    "go north | open chest | take coin | look | inventory | examine table | go east | drop key",
] * 20


@pytest.fixture(scope="module")
def policy_setup(tmp_path_factory):
    tok = build_tokenizer(TEXTS, 320, tmp_path_factory.mktemp("tok"))
    cfg = preset(
        "tiny",
        vocab_size=320,
        hidden_size=32,
        intermediate_size=64,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
    )
    template = get_template("plain")
    sampler = Sampler(
        CausalLM(cfg, rngs=nnx.Rngs(0)),
        sampling=SamplingParams(temperature=1.0),
        stop=StopConfig(eos_ids=(template.stop_id(tok),)),
        pad_id=tok.pad_token_id,
    )
    return tok, template, sampler


def _episode(traj):
    return (
        traj.group,
        traj.task.id,
        traj.won,
        traj.truncated,
        traj.infra_failure,
        [(s.prompt_ids, s.obs_ids, s.action_ids, s.reward, s.done) for s in traj.steps],
    )


# Slow: the default suite plays continuous batching through test_train's asynchronous run.
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["episode", "step"])
def test_continuous_batching_plays_the_episodes_of_synchronous_waves(
    policy_setup, textworld_games, mode
):
    """10 episodes (5 tasks x 2) through 8 slots: waves of 4 tasks, or a stream through two
    cohorts of 4 rows, each episode freeing its rows when it ends. Random step latencies make
    the envs answer out of order. Every episode is the same, token for token, with its
    log-probs within float rounding; the groups share their first prefill either way."""
    tok, template, sampler = policy_setup
    games = textworld_games
    tasks = games["train"] + games["valid"] + games["test"]  # 5 distinct games
    kwargs = {"reward": "dense", "max_steps": 4, "admissible_commands": True}
    config = RolloutConfig(
        group_size=2,
        max_turns=4,
        max_new_tokens=64,
        max_seq_len=1024,
        context_mode=mode,
        constrain_actions=True,
        show_admissible=False,
    )
    played, prefilled, ended = {}, {}, {}
    with ActorPool(
        "textworld",
        {**kwargs, "step_latency_s": [0.0, 0.05]},
        num_workers=2,
        envs_per_worker=4,
        concurrent_envs=True,
    ) as pool:
        for batching in ("waves", "continuous"):
            worker = RolloutWorker(
                pool, sampler, tok, template, dataclasses.replace(config, batching=batching)
            )
            before = sampler.prefilled_rows
            ended[batching] = []  # each progress call's count of episodes that just ended
            played[batching] = worker.run(
                tasks, jax.random.key(3), group_offset=5, progress=ended[batching].append
            )
            prefilled[batching] = sampler.prefilled_rows - before
    waves, stream = played["waves"], played["continuous"]
    assert [_episode(t) for t in stream] == [_episode(t) for t in waves]
    for a, b in zip(stream, waves):
        for sa, sb in zip(a.steps, b.steps):
            np.testing.assert_allclose(sa.action_logprobs, sb.action_logprobs, atol=1e-5)
            assert sa.action_allowed == sb.action_allowed
    assert [t.group for t in stream] == [5 + i // 2 for i in range(10)]
    assert sum(len(t.steps) for t in stream) > 10  # episodes of several turns
    assert prefilled["continuous"] == prefilled["waves"]
    assert ended["waves"] == [8, 2]  # a wave at a time
    assert ended["continuous"] == [1] * 10  # an episode at a time, as each ends


def test_continuous_batching_checks_that_a_group_fits_a_cohort(policy_setup, textworld_games):
    tok, template, sampler = policy_setup
    config = RolloutConfig(group_size=4, batching="continuous", cohorts=2)
    with ActorPool("textworld", {}, num_workers=1, envs_per_worker=6) as pool:
        worker = RolloutWorker(pool, sampler, tok, template, config)
        with pytest.raises(ValueError, match="cohorts of 3 rows, fewer than rollout.group_size=4"):
            worker.run(textworld_games["train"][:1], jax.random.key(0))
    with pytest.raises(ValueError, match="rollout.batching is 'async'; expected one of"):
        RolloutConfig(batching="async")


COMMANDS = ("go north", "open chest", "take coin", "look", "inventory", "examine table", "go east")
WORDS = TEXTS[0].split()


class RoomEnv:
    """A toy game whose prompts, replies and command lists differ in length from task to task
    and turn to turn (so the turns' chunk lengths and choice counts vary): task k is won by
    "take coin", and ends after 2 + k % 3 steps otherwise."""

    def reset(self, task):
        self.k, self.t = int(task.id), 0
        return self._obs(" ".join(WORDS[: 4 + 2 * self.k]))

    def step(self, command):
        self.t += 1
        won = command == "take coin"
        done = won or self.t >= 2 + self.k % 3
        obs = self._obs(" ".join(WORDS[: 1 + (3 * self.k + 7 * self.t + len(command)) % 9]))
        info = {"won": won, "invalid_action": False, "state_key": self.t}
        return obs, float(won), done, info

    def _obs(self, text):
        commands = COMMANDS[: 2 + (self.k + self.t) % 3]
        return Observation("take the coin", text, feedback=text, admissible_commands=commands)


def test_continuous_batching_compiles_no_turn_program_after_a_warm_up_play(policy_setup):
    """16 episodes (8 tasks x 2) through two cohorts of 4 rows, the envs answering in three
    different orders: the cohorts' turns run different mixes of rows each time (first prompts
    beside replies, commands lists of different lengths), yet after the first play no turn
    program is compiled (the sampler's trace counter), and every play is the waves' episodes,
    token for token."""
    tok, template, sampler = policy_setup
    config = RolloutConfig(
        group_size=2,
        max_turns=4,
        max_new_tokens=8,
        max_seq_len=256,
        constrain_actions=True,
        show_admissible=False,
    )
    tasks = [Task("room", "train", str(k)) for k in range(8)]
    pool = InProcessPool(RoomEnv() for _ in range(8))
    waves = RolloutWorker(pool, sampler, tok, template, config)
    in_waves = waves.run(tasks, jax.random.key(5))
    reference = [_episode(t) for t in in_waves]
    assert sum(len(e[-1]) for e in reference) > 16  # episodes of several turns
    stream = RolloutWorker(
        None, sampler, tok, template, dataclasses.replace(config, batching="continuous")
    )
    compiled, logs = [], []
    for seed in (0, 1, 2):  # the first play warms up: its compilations are not counted
        stream.pool = InProcessPool((RoomEnv() for _ in range(8)), seed=seed)
        before = sampler.num_traces
        played = stream.run(tasks, jax.random.key(5))
        compiled.append(sampler.num_traces - before)
        logs.append(stream.pool.log)
        assert [_episode(t) for t in played] == reference
        for a, b in zip(played, in_waves):
            for sa, sb in zip(a.steps, b.steps):
                np.testing.assert_allclose(sa.action_logprobs, sb.action_logprobs, atol=1e-5)
    assert compiled[0] > 0 and compiled[1:] == [0, 0], compiled
    assert logs[0] != logs[1] != logs[2] != logs[0]  # the replies came back in other orders
