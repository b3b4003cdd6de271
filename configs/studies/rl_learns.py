r"""Where should a fixed budget go: SFT only, a small SFT warm start then RL, or RL only?

    python -m launch.study --study=configs/studies/rl_learns.py --workdir=studies/rl_learns

The practitioner's guide's budget finding (../shared/PAPERS.md), at one fixed budget in its units
(a demonstration costs 10 episodes, an RL episode 1): 1,880 units, the built-in default's.

- ``sft_rl`` (the default, the reference): 60 demonstrations (600 units), then 20 GRPO
  iterations of 64 episodes on simple games no demonstration used (1,280 units).
- ``sft_only``: the whole budget on SFT, 188 demonstrations.
- ``rl_only``: the whole budget on RL from the untrained model, 29 iterations of 64 episodes.

In-domain success on 200 simple test games, generalisation on 200 medium ones, constrained
decoding, greedy, three seeds. The bar (issue #13): SFT + RL beats SFT alone on the same 60
demonstrations (the ``sft_rl`` cells' own after-SFT evaluation, paired by seed) by at least 20
points on simple, with the interval excluding 0. About 80 minutes on 2 cores; docs/results.md.
"""


def get_study():
    return dict(
        baseline="configs/tiny_textworld.py",
        overrides={},
        variants={
            "sft_rl": {},
            "sft_only": {"budget.sft_fraction": 1.0},
            "rl_only": {"budget.sft_fraction": 0.0},
        },
        reference="sft_rl",
        seeds=(0, 1, 2),
        evaluation=dict(
            split="test", num_tasks=200, levels=("simple", "medium"), decoding="constrained"
        ),
    )
