r"""GRPO with and without ENVRL's auxiliary losses (state prediction, inverse dynamics).

    python -m launch.study --study=configs/studies/envrl.py --workdir=studies/envrl \
        --reuse=studies/decoding

ENVRL (../shared/PAPERS.md) adds two self-supervised losses on the rollouts' own transitions:
predict the next observation from (s_t, a_t), and the action from (s_t, s_{t+1}), each weighted
0.1 at the start of RL and decayed to 0 on a cosine over the RL phase. The paper reports GRPO
72.8 -> 77.4 on ALFWorld (1.5B) and better out-of-distribution success. Here: the built-in
default's recipe (60 demonstrations, then 20 GRPO iterations of 64 episodes on unseen simple
games, whole-episode contexts), with ENVRL off (``grpo``, the default's own cells: ``--reuse``
copies them from the ``decoding`` study's ``constrained`` cells when the code is the same) and
on (``grpo_envrl``). 200 simple (in-domain) and 200 medium (out-of-distribution) test games,
constrained decoding, greedy, three seeds; docs/results.md.
"""


def get_study():
    return dict(
        baseline="configs/tiny_textworld.py",
        overrides={},
        variants={"grpo": {}, "grpo_envrl": {"envrl.enabled": True}},
        reference="grpo",
        seeds=(0, 1, 2),
        evaluation=dict(
            split="test", num_tasks=200, levels=("simple", "medium"), decoding="constrained"
        ),
    )
