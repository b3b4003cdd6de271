r"""Simple then medium games in stages vs medium games alone, at one budget; evaluated on medium
and hard.

    python -m launch.study --study=configs/studies/curriculum.py --workdir=studies/curriculum

The practitioner's guide (../shared/PAPERS.md) finds a curriculum from simple to complex tasks
beats training at one complexity on the harder tasks. Both arms get the built-in default's
budget in the guide's units: 60 demonstrations, then 20 GRPO iterations of 64 episodes on games
no demonstration used, whole-episode contexts.
- ``medium``: the demonstrations and every RL iteration on medium games (4 rooms, 8 objects, a
  4-step quest).
- ``simple_medium``: the demonstrations on simple games (2 rooms, 3 objects, 2 steps), then 10
  RL iterations on simple games and 10 on medium ones.
200 medium and 200 hard (8 rooms, 12 objects, 6 steps) test games, constrained decoding, greedy,
three seeds; docs/results.md.

Medium games end after 6 steps as every game of the default does (walkthroughs are 4 steps:
the first 12 test games checked), so a policy has 2 steps to spare; a hard game's walkthrough
(6 steps) leaves none, so hard success measures near-perfect play. Not yet run.
"""


def get_study():
    return dict(
        baseline="configs/tiny_textworld.py",
        overrides={"env.eval_levels": ("medium",)},  # valid games select on the target level
        variants={
            "medium": {
                "env.train_levels": ("medium",),
                "curriculum.stages": [[("medium", 1.0)]],
            },
            "simple_medium": {
                "curriculum.stages": [[("simple", 1.0)], [("medium", 1.0)]],
                "curriculum.stage_iterations": (10, 10),
            },
        },
        reference="medium",
        seeds=(0, 1, 2),
        evaluation=dict(
            split="test", num_tasks=200, levels=("medium", "hard"), decoding="constrained"
        ),
    )
