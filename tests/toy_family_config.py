r"""The test suite's run on the user-registered corridor family (tests/toy_env_family.py).

    PYTHONPATH=tests python -m launch.train --config=tests/toy_family_config.py \
        --config.plugins="('toy_env_family',)" --workdir=/tmp/toy

The family is not the package's: the config names it, and ``--config.plugins`` imports the module
that registers it before the config is validated. A 1-layer model, 1 RL
iteration of 2 x 2 episodes, no SFT; short rows, since the game's observations are a sentence long.
"""

import ml_collections

from agentrl_jax.run.config import base_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    del arg
    c = base_config()
    c.env.update(
        name="toy-corridor",
        kwargs=dict(max_steps=3),
        train_levels=("short",),
        eval_levels=("short",),
        num_train_tasks=2,
        num_eval_tasks=1,
        num_report_tasks=1,
        num_transcripts=1,
        num_workers=1,
        envs_per_worker=2,
    )
    c.curriculum.stages = [[("short", 1.0)]]
    c.rollout.update(
        max_turns=3, max_new_tokens=6, max_seq_len=256, group_size=2, constrain_actions=True
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
    # No demonstrations (SFT would compile a program of its own): one RL iteration of 2 x 2.
    c.budget = dict(total=4, sft_fraction=0.0)
    c.rl.update(tasks_per_iteration=2, minibatch_size=4, epochs=1, actor_lr=1e-4)
    c.checkpoint = dict(keep_last=2, keep_best=1, every=1)
    return c
