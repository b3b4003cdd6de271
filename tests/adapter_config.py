r"""The adapter tests' runs (tests/test_adapters.py): ``launch.train`` at the test size on an
adapted environment, one per argument.

    PYTHONPATH=tests python -m launch.train --config=tests/adapter_config.py:gymnasium \
        --workdir=/tmp/gym
    PYTHONPATH=tests python -m launch.train --config=tests/adapter_config.py:openenv \
        --config.env.kwargs.url=http://127.0.0.1:8000 --workdir=/tmp/openenv
    python -m launch.train --config=tests/adapter_config.py:textarena --workdir=/tmp/ta
    PYTHONPATH=tests python -m launch.train --config=tests/adapter_config.py:verifiers \
        --workdir=/tmp/vf

A 1-layer model, 1 RL iteration of 2 x 2 episodes, no SFT (the adapted envs have no expert);
constrained decoding where the env lists its valid commands (the corridor's, in both the
gymnasium and the OpenEnv form), free text for TextArena's GuessTheNumber and the verifiers
taskset's sums (one reply per episode, scored by the taskset's reward).
"""

import ml_collections

from agentrl_jax.run.config import base_config

LEVELS = {
    "gymnasium": "TextCorridor-v0",  # tests/adapter_envs.py registers it
    "openenv": "default",
    "textarena": "GuessTheNumber-v0",
    "verifiers": "all",  # tests/vf_arith.py, a verifiers taskset
}


def get_config(arg: str = "gymnasium") -> ml_collections.ConfigDict:
    c = base_config()
    kwargs = {
        "gymnasium": dict(module="adapter_envs", max_steps=3),
        "openenv": dict(url="", max_steps=3),
        "textarena": dict(max_steps=3),
        "verifiers": dict(taskset="vf_arith"),
    }[arg]
    level = LEVELS[arg]
    c.env.update(
        name=arg,
        kwargs=kwargs,
        train_levels=(level,),
        eval_levels=(level,),
        num_train_tasks=2,
        num_eval_tasks=1,
        num_report_tasks=1,
        num_transcripts=1,
        num_workers=1,
        envs_per_worker=2,
    )
    c.rollout.update(
        max_turns=3,
        max_new_tokens=6,
        max_seq_len=512 if arg == "textarena" else 256,
        group_size=2,
        constrain_actions=arg in ("gymnasium", "openenv"),
    )
    c.model.tokenizer_vocab = 300
    c.model.overrides = dict(
        hidden_size=32,
        intermediate_size=64,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
    )
    c.budget = dict(total=4, sft_fraction=0.0)
    c.rl.update(tasks_per_iteration=2, minibatch_size=4, epochs=1, actor_lr=1e-4)
    c.checkpoint = dict(keep_last=2, keep_best=1, every=1)
    return c
