r"""The smallest study: the test suite's config, GRPO vs RLOO, 2 seeds, one test game per level.

    python -m launch.study --study=configs/studies/smoke.py --workdir=studies/smoke

It exercises the runner end to end in about a minute a cell (tests/test_study.py); its numbers
mean nothing (one demonstration, 3 RL iterations of a 1-layer model, one test game).
"""


def get_study():
    return dict(
        baseline="configs/tiny_textworld.py:test",
        overrides={},
        variants={"grpo": {}, "rloo": {"rl.algo": "rloo"}},
        reference="grpo",
        seeds=(0, 1),
        evaluation=dict(split="test", num_tasks=1, levels=("simple",), decoding="constrained"),
    )
