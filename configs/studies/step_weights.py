r"""Step-wise rows weighted alike vs every episode weighted alike, on medium games.

    python -m launch.study --study=configs/studies/step_weights.py --workdir=studies/step_weights

In step-wise contexts each step of an episode is its own training row. The default aggregation
(``seq_mean_token_mean``) weighs rows alike, so an episode counts by its number of steps: a
failure that runs to the 10-step limit carries 10 rows of negative advantage against the 4-5
rows of a win in its group, and an update mostly pushes down the steps both share. The
``reward`` study's seed 1 and the ``curriculum`` study's ``medium`` seed 2 collapsed after
their first updates in such contexts (docs/results.md). ``episode_mean`` gives each row 1 / its
episode's rows, so every episode weighs the same (docs/algorithms.md#losses).

- ``rows``: the ``curriculum`` study's ``medium`` arm as it is (60 medium demonstrations, then
  10 GRPO iterations of 32 episodes on unseen medium games; step-wise contexts, 10 steps);
- ``episodes``: the same with ``rl.aggregation=episode_mean``.
200 medium and 200 hard test games, constrained decoding, greedy, seeds 0, 1, 2; docs/results.md.
"""


def get_study():
    return dict(
        baseline="configs/tiny_textworld.py:step",
        overrides={
            "env.train_levels": ("medium",),
            "curriculum.stages": [[("medium", 1.0)]],
            "env.eval_levels": ("medium",),  # valid games select on the target level
        },
        variants={"rows": {}, "episodes": {"rl.aggregation": "episode_mean"}},
        reference="rows",
        seeds=(0, 1, 2),
        evaluation=dict(
            split="test", num_tasks=200, levels=("medium", "hard"), decoding="constrained"
        ),
    )
