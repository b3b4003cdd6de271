r"""TextWorld with Qwen2.5-1.5B-Instruct and the multi-turn practitioner's guide's PPO recipe.

Actor lr 1e-6, critic lr 1e-5, gamma 1.0, lambda 0.95, temperature 0.75, KL 0.01, 256 episodes per
iteration, token-level GAE over the whole episode with a critic initialised from the policy.
Trains on simple and medium games 50/50 and evaluates on hard, as the guide recommends. Point
``model.checkpoint`` at a local Hugging Face directory (nothing is downloaded):

    python -m launch.train --config=configs/textworld_qwen2_5_1_5b_ppo.py --workdir=runs/tw_ppo \
        --config.model.checkpoint=/models/Qwen2.5-1.5B-Instruct --config.mesh='(1,4,2)'

Memory (``launch.plan``, docs/performance.md): the train steps accumulate gradients one row of
8,192 tokens at a time (``microbatch_size=1``; the update is the whole minibatch's), and the 256
episodes of an iteration play in two waves of 128 (16 workers x 8 environments), so that the
sampler's 8,192-slot cache (3.5 GiB a chip) fits beside the resident train state. On a v5e 2x4
slice as (1, 4, 2) the TPU compiler puts every program within 14 GiB a chip (peak 11.6 GiB,
the RL update):

    python -m launch.plan --config=configs/textworld_qwen2_5_1_5b_ppo.py \
        --config.model.preset=qwen2.5-1.5b --config.mesh='(1,4,2)' --devices=8 --topology=v5e:2x4
"""

import ml_collections

from agentrl_jax.run.config import base_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    del arg
    c = base_config()
    c.model.update(template="qwen", dtype="bfloat16", remat="full", scan_layers=True)
    c.env.kwargs = dict(reward="dense", max_steps=30, admissible_commands=False)
    c.env.update(
        train_levels=("simple", "medium"),
        eval_levels=("hard", "medium"),
        num_train_tasks=2000,
        num_eval_tasks=100,
        num_workers=16,
        envs_per_worker=8,  # waves of 128 episodes: the sampler's cache fits a 16 GiB chip
    )
    c.curriculum.stages = [[("simple", 0.5), ("medium", 0.5)]]
    c.rollout.update(
        group_size=1,
        max_turns=30,
        max_new_tokens=64,
        max_seq_len=8192,
        context_mode="episode",
        show_admissible=False,
    )
    c.budget = dict(total=256 * 200 + 10 * 2000, sft_fraction=10 * 2000 / (256 * 200 + 10 * 2000))
    c.sft.update(epochs=2, batch_size=64, microbatch_size=1, learning_rate=1e-5, warmup_steps=50)
    c.rl.update(
        algo="gae",
        loss="ppo",
        tasks_per_iteration=256,
        epochs=1,
        minibatch_size=64,
        microbatch_size=1,
        actor_lr=1e-6,
        critic_lr=1e-5,
        gamma=1.0,
        lam=0.95,
        temperature=0.75,
        kl_coef=0.01,
        kl_mode="loss",
        reference_dtype="bfloat16",  # the frozen reference: 0.36 GiB a chip instead of 0.72
        clip_low=0.2,
        clip_high=0.2,
    )
    c.checkpoint.every = 10
    c.eval_every = 20
    return c
