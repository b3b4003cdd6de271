r"""ALFWorld on a CPU: a small policy trained from scratch, SFT on the expert, then GRPO.

    python -m launch.train --config=configs/alfworld_tiny.py --workdir=runs/alfworld_tiny

The data: ``--config.env.kwargs.data_dir=DIR``, else ``$ALFWORLD_DATA`` (the standard
``alfworld-download`` layout, or the project's pack in ``../shared/data/alfworld``, which the
first run unpacks into the cache). Greedy evaluation on
valid_seen (140 tasks, rooms seen in training: the split that tunes) and valid_unseen (134, new
rooms: the split that reports), per task type (``docs/environments_alfworld.md``).

Its settings, measured (docs/performance.md "ALFWorld on 2 cores", docs/results.md ``alfworld``:
tuned on valid_seen; no tuning decision reads valid_unseen):

- Whole-episode contexts without the admissible list (3,072 tokens hold 50 turns). Constrained
  decoding restricts the policy to the admissible commands, so listing them only tripled each
  prompt (step-wise contexts: a median of 581 tokens with the list, 197 without, on 48 expert
  episodes of train games). A whole episode trains on 812 tokens a demonstration against 2,730
  as step rows, prefills only each turn's new observation, and lets the policy see where it has
  been: with the last 2 turns alone, the SFT policy looped between two receptacles (run A).
- The goal restated at the head of every observation (``rollout.restate_goal``): with it alone
  changed, the SFT policy won 37 of 140 valid_seen games against 4 (runs C and D).
- 1,200 demonstrations (920 won, the ones SFT trains on) for 5 epochs: 400 for 10 epochs (run
  B) and 1,200 for 5 (run C) both won 4 of 140 valid_seen games; C's SFT fits the expert better,
  and D starts from it.
- 16 new tokens a turn (the longest admissible command: 9 with its stop token here).
- Train tasks spread over the six types and the rooms (``alfworld_tasks``' order); the
  tokenizer learnt from the expert episodes of the first 200.
- ``--config.env.kwargs.data_dir`` or ``$ALFWORLD_DATA`` for the data; the games' PDDL
  translations persist in the cache, so a game loads in ~0.4 s after its first time.
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
        max_seq_len=3072,
        context_mode="episode",
        restate_goal=True,
        show_admissible=False,
        constrain_actions=True,
        system_prompt="You are an agent in a household. Reply with one action.",
    )
    # Run D's SFT (docs/results.md alfworld): 5 epochs of the won episodes, 8 a batch.
    c.sft.update(epochs=5, batch_size=8, learning_rate=2e-3, warmup_steps=20)
    # 1,200 demonstrations (12,000 units), then 20 RL iterations of 8 tasks x 4 rollouts.
    c.budget = dict(total=12000 + 20 * 32, sft_fraction=12000 / (12000 + 20 * 32))
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
    if arg == "sft":  # SFT alone on the same demonstrations, no RL
        c.budget = dict(total=12000, sft_fraction=1.0)
    return c
