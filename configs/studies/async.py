r"""Does asynchronous RL cost the policy anything? Rollouts up to S updates old, with TIS.

    python -m launch.study --study=configs/studies/async.py --workdir=studies/async

The built-in default (``configs/tiny_textworld.py``: 60 demonstrations of SFT, then 20 GRPO
iterations of 64 episodes on simple games) on-policy (``rl.max_staleness=0``), against the
same run whose rollouts are played by the policy 1 or 2 updates old, in the background while the
learner trains (``max_staleness=1`` and ``2``), the lag corrected by truncated importance
sampling (``rl.off_policy_correction=tis``, cap 2). No step latency: this asks what the lag does
to learning; ``python -m launch.bench rollout`` measures what it saves with slow environments.

200 simple test games, constrained decoding, greedy, seeds 0, 1, 2; each difference is paired by
seed. The study reports every run's wall-clock per RL iteration too. About 65 minutes on 2 idle
cores; docs/results.md.
"""


def get_study():
    tis = {"rl.off_policy_correction": "tis"}
    return dict(
        baseline="configs/tiny_textworld.py",
        overrides={},
        variants={
            "on_policy": {},
            "stale1_tis": {"rl.max_staleness": 1, **tis},
            "stale2_tis": {"rl.max_staleness": 2, **tis},
        },
        reference="on_policy",
        seeds=(0, 1, 2),
        evaluation=dict(split="test", num_tasks=200, levels=("simple",), decoding="constrained"),
    )
