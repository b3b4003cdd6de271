r"""ALFWorld (the real json_2.1.1 tasks) with GAGPO, step-wise contexts, groups of 8.

Each step's prompt is the objective plus the last 2 turns; rollouts of the same task form a group
(and, for GiGPO / GAGPO, identical states across them form step-level groups). Evaluates on
valid_seen (in-distribution) and valid_unseen (out-of-distribution, the number papers report).
Data from --config.env.kwargs.data_dir=DIR, or $ALFWORLD_DATA without it (the standard
alfworld-download layout, or the pack in ../shared/data/alfworld):

    python -m launch.train --config=configs/alfworld_gagpo.py --workdir=runs/alfworld_gagpo \
        --config.model.checkpoint=/models/Qwen2.5-1.5B-Instruct \
        --config.env.kwargs.data_dir=../shared/data/alfworld

Mesh (``launch.plan``, docs/training.md "Choosing the mesh"): the resolved default is one device;
Qwen2.5-7B on 16 devices takes ``--config.mesh='(1,4,4)'`` on a TPU slice or ``'(2,2,4)'`` on
2 GPU nodes of 8, with ``--config.rl.microbatch_size=16`` (update peak 29.6 / 36.9 GiB per
device); never ``(16,1,1)``, which replicates the 85 GiB float32 state on every device.
"""

import ml_collections
from ml_collections import config_dict

from agentrl_jax.run.config import base_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    del arg
    c = base_config()
    c.model.update(template="qwen", dtype="bfloat16", remat="full", scan_layers=True)
    c.env.update(
        name="alfworld",
        # data_dir: the data root, its json_2.1.1 folder or the pack (a str placeholder, so that
        # --config.env.kwargs.data_dir=DIR parses); None reads $ALFWORLD_DATA.
        kwargs=dict(max_steps=50, admissible_commands=True, data_dir=config_dict.placeholder(str)),
        train_levels=("all",),
        eval_levels=("all@valid_seen", "all@valid_unseen"),
        num_train_tasks=3553,
        num_eval_tasks=140,
        num_workers=16,
        envs_per_worker=8,
    )
    c.curriculum.stages = [[("all", 1.0)]]
    c.rollout.update(
        group_size=8,
        max_turns=50,
        max_new_tokens=128,
        max_seq_len=4096,
        context_mode="step",
        history_turns=2,
        system_prompt="You are an agent in a household. Reply with one admissible action.",
    )
    c.budget = dict(total=16 * 8 * 150, sft_fraction=0.0)
    c.rl.update(
        algo="gagpo",
        loss="ppo",
        tasks_per_iteration=16,
        epochs=1,
        minibatch_size=64,
        actor_lr=1e-6,
        gamma=0.95,
        lam=0.95,
        step_weight=1.0,
        kl_coef=0.01,
        ratio_level="action",
        temperature=1.0,
    )
    c.checkpoint.every = 10
    c.eval_every = 25
    return c
