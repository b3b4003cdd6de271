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

300 test boards (seeds no training or tuning read), greedy, constrained decoding, three seeds.
The bar (issue #43): the ``sft_rl`` cells' RL gain, final success minus the same cell's success
after SFT on the same boards, paired by seed, has a 95% interval above 0 (the results' "What RL
adds" table). ``sft_only`` says whether the same budget spent on demonstrations does as well.
"""


def get_study():
    return dict(
        baseline="configs/textarena_frozenlake.py",
        overrides={},
        variants={"sft_rl": {}, "sft_only": {"budget.sft_fraction": 1.0}},
        reference="sft_rl",
        seeds=(0, 1, 2),
        evaluation=dict(split="test", num_tasks=300, decoding="constrained"),
    )
