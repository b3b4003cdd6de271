r"""PPO with a critic (token-level GAE), GRPO, RLOO, GiGPO and GAGPO at the same recipe and budget.

    python -m launch.study --study=configs/studies/algorithms.py --workdir=studies/algorithms \
        --reuse=docs/results/cells/algorithms

The practitioner's guide finds PPO best on TextWorld (88%); GAGPO reports faster early learning
and higher success than GiGPO (../shared/PAPERS.md). Here every estimator gets the built-in
default's recipe: 60 demonstrations, then 20 iterations of 64 episodes (16 tasks x 4 rollouts,
the group each critic-free estimator compares within) on unseen simple games, whole-episode
contexts (the critic reads them: ``gae`` needs ``context_mode='episode'``), each estimator with
its own ratio level (GAGPO one ratio per action, the others per token). The ``grpo`` cells are
the default's own (``rl_learns``' ``sft_rl``, ``envrl``'s ``grpo``: ``--reuse`` takes them from
those studies' workdirs too when the code is the same). 200 simple and 200 medium test games,
constrained decoding, greedy, three seeds; docs/results.md.

Fifteen cells of about 8 minutes each (PPO's 14-16): run it a few variants at a time into one
workdir, each part under 90 minutes on 2 cores (``--variants=gigpo,gagpo``); the results cover
every finished cell. Ran 2026-12-02 in full (two sessions, 15 cells); the cells are kept in
docs/results/cells/algorithms, and ``--reuse=docs/results/cells/algorithms`` fills them while
the package code is unchanged (docs/results.md).

Simple games, not medium: at this model size RL wins almost no medium game (``rl_learns``:
0.5-2.5% on medium whichever way the budget went), and an estimator cannot assign credit
without a success to assign it from; a simple game still takes two commands in up to six steps.
"""


def get_study():
    return dict(
        baseline="configs/tiny_textworld.py",
        overrides={},
        variants={
            "grpo": {},
            "ppo": {"rl.algo": "gae"},
            "rloo": {"rl.algo": "rloo"},
            "gigpo": {"rl.algo": "gigpo"},
            "gagpo": {"rl.algo": "gagpo"},
        },
        reference="grpo",
        seeds=(0, 1, 2),
        evaluation=dict(
            split="test", num_tasks=200, levels=("simple", "medium"), decoding="constrained"
        ),
    )
