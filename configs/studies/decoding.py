r"""Free decoding (the policy writes its command) vs constrained (one of the admissible commands).

    python -m launch.study --study=configs/studies/decoding.py --workdir=studies/decoding

The built-in default's recipe (60 demonstrations, then 20 GRPO iterations of 64 episodes on
unseen simple games), trained and evaluated with one decoding mode each (the study leaves each
variant's own: ``evaluation.decoding`` unset). The constrained cells are the default's own:
``rl_learns``' ``sft_rl`` cells (``--reuse=studies/rl_learns`` copies them when the code is the
same), and ``envrl`` and ``algorithms`` reuse them from here. 200 simple and 200 medium test
games, greedy, three seeds; docs/results.md.
"""


def get_study():
    return dict(
        baseline="configs/tiny_textworld.py",
        overrides={},
        variants={"constrained": {}, "free": {"rollout.constrain_actions": False}},
        reference="constrained",
        seeds=(0, 1, 2),
        evaluation=dict(split="test", num_tasks=200, levels=("simple", "medium")),
    )
