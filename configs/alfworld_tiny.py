r"""ALFWorld on a CPU: a small policy trained from scratch, SFT on the expert, then GRPO.

    python -m launch.train --config=configs/alfworld_tiny.py --workdir=runs/alfworld_tiny

The data: ``--config.env.kwargs.data_dir=DIR``, else ``$ALFWORLD_DATA`` (the standard
``alfworld-download`` layout, or the project's pack in ``../shared/data/alfworld``, which the
first run unpacks into the cache). Greedy evaluation on
valid_seen (140 tasks, rooms seen in training: the split that tunes) and valid_unseen (134, new
rooms: the split that reports), per task type (``docs/environments_alfworld.md``).

What makes it run on 2 cores (``python -m launch.bench iteration --config=configs/alfworld_tiny.py``
measures it; docs/performance.md):

- Step-wise contexts without the admissible list: the objective, the last turns and the new
  observation. Constrained decoding already restricts the policy to the admissible commands, so
  listing them in the prompt only tripled it (median 581 tokens a step with the list, 197 without,
  on 48 expert episodes of train games).
- A context of 512 tokens (the longest expert step above: 463) and 16 new tokens (the longest
  admissible command: 9 with its stop token at this vocabulary).
- Train tasks spread over the six types and the rooms (``alfworld_tasks``' order), the
  tokenizer learnt from the expert episodes of 200 of them.
"""

import ml_collections
from ml_collections import config_dict

from agentrl_jax.run.config import base_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = base_config()
    c.model.update(tokenizer_vocab=1024, tokenizer_tasks=200)
    c.env.update(
        name="alfworld",
        # data_dir: the data root, its json_2.1.1 folder or the pack; None reads $ALFWORLD_DATA.
        kwargs=dict(max_steps=50, admissible_commands=True, data_dir=config_dict.placeholder(str)),
        train_levels=("all",),
        eval_levels=("all@valid_seen", "all@valid_unseen"),
        num_train_tasks=3553,
        num_eval_tasks=140,
        num_report_tasks=0,
        num_workers=2,
        envs_per_worker=16,
    )
    c.curriculum.stages = [[("all", 1.0)]]
    c.rollout.update(
        group_size=4,
        max_turns=50,
        max_new_tokens=16,
        max_seq_len=512,
        context_mode="step",
        history_turns=2,
        show_admissible=False,
        constrain_actions=True,
        system_prompt="You are an agent in a household. Reply with one action.",
    )
    c.sft.update(epochs=3, batch_size=32, learning_rate=2e-3, warmup_steps=20)
    # 400 demonstrations (4,000 units), then 20 RL iterations of 8 tasks x 4 rollouts.
    c.budget = dict(total=4000 + 20 * 32, sft_fraction=4000 / (4000 + 20 * 32))
    c.rl.update(
        algo="grpo",
        tasks_per_iteration=8,
        minibatch_size=32,
        epochs=1,
        actor_lr=2e-4,
        aggregation="seq_mean_token_mean",
        task_pool="unseen",
    )
    c.checkpoint.every = 5
    if arg == "sft":  # SFT alone at the same budget of demonstrations: the study's baseline
        c.budget = dict(total=4000, sft_fraction=1.0)
    return c
