r"""Simple then medium games in stages vs medium games alone, at one budget; evaluated on medium
and hard.

    python -m launch.study --study=configs/studies/curriculum.py --workdir=studies/curriculum

The practitioner's guide (../shared/PAPERS.md) finds a curriculum from simple to complex tasks
beats training at one complexity on the harder tasks. Both arms get one budget in the guide's
units: 60 demonstrations, then 10 GRPO iterations of 32 episodes (8 tasks x 4 rollouts) on
games no demonstration used.
- ``medium``: the demonstrations and every RL iteration on medium games (4 rooms, 8 objects, a
  4-step quest).
- ``simple_medium``: the demonstrations on simple games (2 rooms, 3 objects, 2 steps), then 5
  RL iterations on simple games and 5 on medium ones.
200 medium and 200 hard (8 rooms, 12 objects, 6 steps) test games, constrained decoding, greedy,
three seeds; docs/results.md.

Step-wise contexts (the goal, the last 2 turns, the new observation) and 10 steps an episode,
as in the ``reward`` study, not the default's whole-episode 768-token rows and 6 steps: under
those, a medium episode runs out of context after about 4 turns (the ``algorithms`` study's
grpo seed 0: 3.9 steps an episode on 200 medium test games after SFT, every one cut short, 0
won), so a 4-step quest had to be played without one wrong step, and a hard one (6 steps)
could not fit.

Ran 2026-12-03 alone on the 2-core VM: 12-17 min a cell (a medium iteration's update 45-63 s),
1 h 27 min for the six. No difference between the arms (medium test games 15.7% with the
curriculum vs 18.0%, -2.3 points [-35.1, 30.4]; hard 9.0% vs 8.2%); the finished cells are kept
in docs/results/cells/curriculum (``--reuse`` refills them).
"""


def get_study():
    return dict(
        baseline="configs/tiny_textworld.py:step",
        overrides={"env.eval_levels": ("medium",)},  # valid games select on the target level
        variants={
            "medium": {
                "env.train_levels": ("medium",),
                "curriculum.stages": [[("medium", 1.0)]],
            },
            "simple_medium": {
                "curriculum.stages": [[("simple", 1.0)], [("medium", 1.0)]],
                "curriculum.stage_iterations": (5, 5),
            },
        },
        reference="medium",
        seeds=(0, 1, 2),
        evaluation=dict(
            split="test", num_tasks=200, levels=("medium", "hard"), decoding="constrained"
        ),
    )
