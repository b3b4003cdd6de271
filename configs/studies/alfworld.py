r"""ALFWorld from scratch: does RL improve on its SFT start, and do GiGPO and GAGPO beat GRPO?

    python -m launch.study --study=configs/studies/alfworld.py --workdir=studies/alfworld

The papers' own benchmark (../shared/PAPERS.md: GiGPO 86.7% with Qwen2.5-1.5B, GAGPO 95.6% with
7B), learned here by the tiny policy trained from scratch on 2 cores (``configs/alfworld_tiny.py``,
issue #40). The arms:

- ``grpo``, ``gigpo``, ``gagpo``: the recipe's SFT on expert demonstrations, then RL with each
  estimator (GiGPO and GAGPO group the steps of a task's rollouts by ALFWorld's state key). The
  three share one SFT run a seed (``shared_sft``: ``WORKDIR/starts/seed-<s>``), so their RL
  begins from the same policy, and each RL gain is paired with that policy's own evaluation.
- ``sft_only``: the same budget spent on demonstrations alone (a demonstration costs 10 units,
  an RL episode 1), no RL.

Greedy evaluation with constrained decoding on valid_unseen (134 tasks in rooms no training
saw: the split that reports) and valid_seen (140: the split the recipe was tuned on), overall
and per task type; three seeds. One seed's cells run one after another (SFT start, then each
RL arm, then ``sft_only``); run it a few variants at a time (``--variants=grpo,gigpo``) and it
resumes where it stopped. docs/results.md ``alfworld``.
"""


def get_study():
    return dict(
        baseline="configs/alfworld_tiny.py",
        # The valid_seen evaluation is the report's valid_seen set (played once).
        overrides={"env.eval_levels": ("all@valid_seen",)},
        variants={
            "grpo": {},
            "gigpo": {"rl.algo": "gigpo"},
            "gagpo": {"rl.algo": "gagpo"},
            "sft_only": {"budget.sft_fraction": 1.0},
        },
        reference="grpo",
        seeds=(0, 1, 2),
        evaluation=dict(
            split="valid_unseen",
            num_tasks=140,  # valid_unseen holds 134
            levels=("all", "all@valid_seen"),
            decoding="constrained",
        ),
        shared_sft=("grpo", "gigpo", "gagpo"),
    )
