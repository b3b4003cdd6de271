r"""The built-in default: the tiny policy on simple TextWorld games, SFT then GRPO, on a CPU.

    python -m launch.train --config=configs/tiny_textworld.py --workdir=runs/tiny_textworld

Held-out evaluation on simple (the training complexity) and medium (the next harder one): valid
games for checkpoint selection, and the before/after table on test games (docs/evaluation.md).
``--config=configs/tiny_textworld.py:smoke`` shrinks the run for a quick look at every stage;
``:test`` shrinks it further (a 1-layer model) for the test suite; ``:step`` is the recipe in
step-wise contexts, for games whose episodes outgrow a whole-episode row (the ``reward`` and
``curriculum`` studies).
"""

import ml_collections

from agentrl_jax.run.config import base_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = base_config()
    # Simple games take 2 commands; 6 steps leave room for a detour, and a failed episode's row
    # stays under 768 tokens (12 steps doubled the cost of every failed RL episode).
    c.env.kwargs = dict(reward="dense", max_steps=6, admissible_commands=True)
    # 400 games for the demonstrations, then 64 that RL plays and no demonstration showed.
    c.env.update(train_levels=("simple",), eval_levels=("simple", "medium"), num_train_tasks=464)
    # The before/after table: 50 test games per level, after SFT and after RL (valid games select,
    # test games report; docs/evaluation.md). 200 per level would add ~9 minutes on a fresh clone
    # (generating 400 test games, then 800 greedy episodes) to a run budgeted at 20; headline
    # figures evaluate the finished run with launch.eval --split=test --num_tasks=200.
    c.env.num_report_tasks = 50
    c.curriculum.stages = [[("simple", 1.0)]]
    # Constrained decoding: the policy writes one of the admissible commands (32 tokens hold the
    # longest one at this vocabulary with room: among 200 test games one has 22). Free decoding
    # left the tiny model misspelling the objects it meant (held-out simple 28% after SFT;
    # constrained, the same policy wins 74%).
    c.rollout.update(max_turns=6, max_seq_len=768, max_new_tokens=32, constrain_actions=True)
    # A narrower, 2-layer version of the tiny preset: ~6x cheaper per token, so SFT can take
    # enough steps on 2 cores.
    c.model.overrides = dict(
        hidden_size=128,
        intermediate_size=384,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
    )
    # A small SFT warm start, then RL (the practitioner's guide's budget finding, measured in
    # docs/results.md, study rl_learns): 60 demonstrations x 10 epochs leave the policy winning
    # about a quarter of held-out simple games, with room for RL to learn. (400 demonstrations
    # win ~60% after SFT, and RL then barely moves the policy: approx_kl ~1e-4, clipfrac 0.)
    c.sft.update(epochs=10, learning_rate=3e-3, warmup_steps=5)
    # GRPO on the unseen games: 16 tasks x 4 rollouts an iteration, two passes of two updates of
    # 32 episodes, every episode weighted alike (seq_mean_token_mean: failed episodes are 3x
    # longer, and a token mean let their negative advantages dominate and blow up the entropy).
    c.rl.update(
        tasks_per_iteration=16,
        minibatch_size=32,
        epochs=2,
        actor_lr=5e-4,
        aggregation="seq_mean_token_mean",
        task_pool="unseen",
    )
    # In the guide's units (a demonstration costs 10 episodes): 60 demonstrations and 20 RL
    # iterations of 64 episodes.
    c.budget = dict(total=600 + 20 * 64, sft_fraction=600 / (600 + 20 * 64))

    if arg == "step":
        # Each step's context is the goal, the last 2 turns and the new observation, so a long
        # observation (a cooking game's kitchen, a medium game's rooms) no longer ends the episode
        # after a few turns; 10 steps an episode. A step-wise update trains one row per step played
        # (about 5 an episode), so RL is 10 iterations of 32 episodes (8 tasks x 4 rollouts).
        c.env.kwargs.max_steps = 10
        c.rollout.update(max_turns=10, context_mode="step", history_turns=2)
        c.rl.tasks_per_iteration = 8
        c.budget = dict(total=600 + 10 * 32, sft_fraction=600 / (600 + 10 * 32))
    if arg == "test":
        # The test suite's run: a 1-layer model, 1 demonstration, 3 RL iterations of 2 x 2.
        c.env.num_train_tasks = 2  # 1 for the demonstration, 1 unseen for RL
        c.env.num_eval_tasks = 1
        c.env.num_report_tasks = 1  # the before/after table's test game
        c.env.eval_levels = ("simple",)
        c.env.envs_per_worker = 2
        c.env.kwargs.max_steps = 3
        # 1024 tokens: a held-out game's first observation is ~630 tokens with a 300-token
        # vocabulary, so a shorter context would end every evaluation episode before it starts.
        # Constrained decoding as in the default; 24 tokens hold the longest admissible command
        # at this vocabulary, so every turn decodes at one width (a longer command would widen
        # its turn: rollout.constrain_actions never cuts one).
        c.rollout.update(max_turns=3, max_new_tokens=24, max_seq_len=1024, group_size=2)
        c.rollout.show_admissible = False
        c.model.tokenizer_vocab = 300
        c.model.overrides = dict(
            hidden_size=32,
            intermediate_size=64,
            num_layers=1,
            num_heads=2,
            num_kv_heads=1,
            head_dim=16,
        )
        c.budget = dict(total=24, sft_fraction=0.5)
        c.rl.update(tasks_per_iteration=2, minibatch_size=4, epochs=1, actor_lr=1e-4)
        c.sft.update(batch_size=2, epochs=2)
        c.checkpoint = dict(keep_last=5, keep_best=1, every=1)
    if arg == "smoke":
        c.env.num_train_tasks = 8  # 6 for the demonstrations, 2 unseen for RL
        c.env.num_eval_tasks = 2
        c.env.num_report_tasks = 2
        c.env.envs_per_worker = 4
        c.model.tokenizer_vocab = 400
        c.budget = dict(total=120, sft_fraction=0.5)  # 6 demonstrations, 60 RL episodes
        c.rl.tasks_per_iteration = 2
        c.rl.minibatch_size = 4
        c.rollout.max_turns = 6
        c.env.kwargs.max_steps = 6
        c.checkpoint.every = 1
    return c
