r"""Does RL improve the tiny policy on another project's environment? TextArena's FrozenLake.

    python -m launch.study --study=configs/studies/textarena_frozenlake.py \
        --workdir=studies/textarena_frozenlake

The recipe (configs/textarena_frozenlake.py): TextArena's ``FrozenLake-v0`` through the textarena
adapter, constrained decoding among the moves the engine accepts, 40 expert demonstrations (a
shortest hole-free path, read from the engine's state; 30 epochs of SFT), then 20 GRPO
iterations of 8 boards x 8 episodes on boards no demonstration showed, rewarded 1 for a win and
0 otherwise; 1,680 units in the practitioner's guide's units (a demonstration costs 10
episodes).

- ``sft_rl`` (the reference): the recipe.
- ``sft_only``: the whole budget on SFT, 168 demonstrations, no RL.
- ``rl_only``: the whole budget on RL from the untrained policy, 26 GRPO iterations, paid the
  game's own reward (up to 0.95 for the share of the way covered before a hole, 1 for the goal):
  from a policy that wins no board, a win-only reward would pay almost nothing to learn from.

300 test boards (seeds no training or tuning read), greedy, constrained decoding, three seeds.
The bar (issue #43): a cell's RL gain, final success minus the same cell's success before RL on
the same boards, paired by seed, has a 95% interval above 0 (the results' "What RL adds" table).
``sft_only`` says whether the same budget spent on demonstrations does as well. A fixed path wins
21-28% of test boards (configs/textarena_frozenlake.py): a policy above that reads the board.
"""


def get_study():
    return dict(
        baseline="configs/textarena_frozenlake.py",
        overrides={},
        variants={
            "sft_rl": {},
            "sft_only": {"budget.sft_fraction": 1.0},
            "rl_only": {"budget.sft_fraction": 0.0, "env.kwargs.reward": "game"},
        },
        reference="sft_rl",
        seeds=(0, 1, 2),
        evaluation=dict(split="test", num_tasks=300, decoding="constrained"),
    )
