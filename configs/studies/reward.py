r"""Dense turn-level rewards (score increments) vs sparse ones (1 on a win), same recipe and budget.

    python -m launch.study --study=configs/studies/reward.py --workdir=studies/reward \
        --reuse=studies/rl_learns

The practitioner's guide reports 58% with dense rewards against 41% with sparse ones (TextWorld,
PPO; ../shared/PAPERS.md). Here the built-in default (60 demonstrations, then 20 GRPO iterations
of 64 episodes on unseen simple games) with either reward; the dense cells are the default's own,
so ``--reuse`` copies them from ``rl_learns`` (its ``sft_rl`` cells: the same config and code).
200 simple and 200 medium test games, constrained decoding, greedy, three seeds; docs/results.md.
"""


def get_study():
    return dict(
        baseline="configs/tiny_textworld.py",
        overrides={},
        variants={"dense": {}, "sparse": {"env.kwargs.reward": "sparse"}},
        reference="dense",
        seeds=(0, 1, 2),
        evaluation=dict(
            split="test", num_tasks=200, levels=("simple", "medium"), decoding="constrained"
        ),
    )
