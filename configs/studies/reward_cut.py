r"""Dense vs sparse rewards on cooking games harder than the ``reward`` study's ceiling-bound ones.

    python -m launch.study --study=configs/studies/reward_cut.py --workdir=studies/reward_cut

The ``reward`` study (docs/results.md) played ``tw-cooking:recipe=1,take=1,go=1``: RL reached
0.9-1.0 sampled success within 2-3 iterations under either reward, so both ended at the ceiling
and could not differ. Here the ingredient must also be cut:
``tw-cooking:recipe=1,take=1,cut,go=1`` (take the ingredient and the knife, cut the ingredient
as the recipe says, prepare and eat the meal; scored at the ingredient, the cut, the meal and
eating it, maximum score 4). Dense rewards pay each of those four steps; sparse ones only the
win. Everything else is the ``reward`` study's: the default recipe in step-wise contexts
(``configs/tiny_textworld.py:step``: 10 steps an episode), 60 demonstrations from these games,
then 10 GRPO iterations of 32 episodes on games no demonstration used; 200 test games,
constrained decoding, greedy, seeds 0, 1, 2; docs/results.md.

Piloted 2026-12-03, not run: the 60 demonstrations (the expert's 5 steps: take the ingredient
and the knife, cut, prepare, eat; 300 step rows) leave the policy at 6.5% of 200 test games, and
under dense rewards seed 0's 10 iterations ended at 7.5% (+1.0 points [-2.8, 4.9]), its sampled
success 0.03-0.09 for 6 iterations and 0.06-0.25 in the last 4 (53-94% of the first 6
iterations' episodes ran to the 10-step limit), 17.6 min for the cell. Ten iterations leave RL
no time to learn these games under either reward, so the comparison would measure nothing; it
needs a longer RL phase (about 3 h for 6 cells at 20 iterations here).
"""

COOKING_CUT = "tw-cooking:recipe=1,take=1,cut,go=1"


def get_study():
    return dict(
        baseline="configs/tiny_textworld.py:step",
        overrides={
            "env.train_levels": (COOKING_CUT,),  # the demonstrations' games
            "curriculum.stages": [[(COOKING_CUT, 1.0)]],  # RL's games
            "env.eval_levels": (COOKING_CUT,),
            "env.num_train_tasks": 124,  # 60 for the demonstrations, 64 that RL plays
        },
        variants={"dense": {}, "sparse": {"env.kwargs.reward": "sparse"}},
        reference="dense",
        seeds=(0, 1, 2),
        evaluation=dict(split="test", num_tasks=200, levels=(COOKING_CUT,), decoding="constrained"),
    )
