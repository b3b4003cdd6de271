r"""SWE-Gym-style bug fixing with GRPO and the verified-ratio reward.

Tasks come from ``python -m launch.make_swe_tasks --package=parse --out=swe_tasks`` (real PyPI
sdists with their own pytest suites, bugs injected by AST mutation) or a SWE-Gym JSONL with the
Docker runtime (docs/swe.md). Reward: the fraction of FAIL_TO_PASS tests that pass, zero unless
every PASS_TO_PASS test still passes. Groups of 8 rollouts per instance, step-wise contexts (the
problem statement plus the last 2 turns).

    python -m launch.train --config=configs/swe_grpo.py --workdir=runs/swe_grpo \
        --config.env.kwargs.path=swe_tasks/tasks.jsonl \
        --config.model.checkpoint=/models/Qwen2.5-1.5B-Instruct
"""

import ml_collections

from agentrl_jax.run.config import base_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    del arg
    c = base_config()
    c.model.update(template="qwen", dtype="bfloat16", remat="full", scan_layers=True)
    c.env.update(
        name="swe",
        kwargs=dict(path="swe_tasks/tasks.jsonl", reward="verified_ratio", max_turns=20),
        train_levels=("all",),
        eval_levels=("all",),
        num_train_tasks=1000,
        num_eval_tasks=50,
        num_workers=8,
        envs_per_worker=4,
    )
    c.curriculum.stages = [[("all", 1.0)]]
    c.rollout.update(
        group_size=8,
        max_turns=20,
        max_new_tokens=512,
        max_seq_len=8192,
        context_mode="step",
        history_turns=2,
        system_prompt=(
            "You fix a bug in a Python repository. Reply with one action: a ```bash``` block, "
            "a file edit, or submit (see the action format in the task)."
        ),
        show_admissible=False,
    )
    c.budget = dict(total=4 * 8 * 100, sft_fraction=0.0)
    c.rl.update(
        algo="grpo",
        loss="ppo",
        tasks_per_iteration=4,
        minibatch_size=16,
        actor_lr=1e-6,
        kl_coef=0.01,
        temperature=1.0,
    )
    c.checkpoint.every = 5
    c.eval_every = 20
    return c
