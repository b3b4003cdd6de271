"""Defaults shared by every config: each ``configs/<name>.py`` starts from ``base_config()``."""

import ml_collections


def base_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    # (data, fsdp, tp); the product must equal the device count, and one size may be -1: the
    # devices the others leave, e.g. (1, -1, 1) shards parameters over every device (FSDP).
    c.mesh = (1, 1, 1)
    c.eval_every = 0  # RL iterations between held-out evaluations (0: only before and after)
    # Modules imported before validation: they register estimators, losses or envs by name
    # (docs/custom_losses.md), e.g. --config.plugins="('my_losses',)".
    c.plugins = ()

    c.model = dict(
        preset="tiny",
        checkpoint="",
        tokenizer="",
        tokenizer_vocab=1024,
        template="plain",
        dtype="float32",
        remat=False,
        # The learner runs the LM head over this many positions at a time (and recomputes them
        # in the backward pass), so its logits peak at [B, logits_chunk, V], never [B, T, V].
        logits_chunk=256,
        overrides={},
    )
    c.env = dict(
        name="textworld",
        kwargs={},
        train_levels=("simple",),
        eval_levels=("simple", "medium"),
        num_train_tasks=200,
        num_eval_tasks=50,
        num_workers=2,
        envs_per_worker=16,
    )
    c.rollout = dict(
        group_size=4,
        max_turns=12,
        max_new_tokens=12,
        max_seq_len=1536,
        context_mode="episode",
        history_turns=2,
        system_prompt="You are playing a text game. Reply with one command.",
        show_admissible=True,
        # Constrained decoding: the policy can only write an admissible command.
        constrain_actions=False,
    )
    c.curriculum = dict(stages=[], stage_iterations=(), advance_at=None, window=64)
    c.sft = dict(
        epochs=3,
        batch_size=16,
        # Rows per microbatch (gradient accumulation in the jitted step; a divisor of
        # batch_size): memory is set by the microbatch, the update is the batch's. 0: no split.
        microbatch_size=0,
        learning_rate=2e-3,
        warmup_steps=10,
        end_lr_fraction=0.1,  # cosine decay from learning_rate to this fraction of it
        group_by_length=8,  # sort windows of 8 batches by length: less padding
    )
    c.budget = dict(total=4000, sft_fraction=0.5)
    c.rl = dict(
        algo="grpo",
        loss="ppo",
        tasks_per_iteration=8,
        epochs=1,
        minibatch_size=16,
        microbatch_size=0,  # as sft.microbatch_size, a divisor of minibatch_size; 0: no split
        actor_lr=2e-4,
        critic_lr=1e-3,
        max_grad_norm=1.0,
        gamma=1.0,
        lam=0.95,
        norm_by_std=True,
        step_weight=1.0,
        kl_coef=0.0,
        kl_mode="loss",
        entropy_coef=0.0,
        value_coef=0.5,
        clip_low=0.2,
        clip_high=0.2,
        dual_clip=None,
        ratio_level="auto",
        aggregation="token_mean",
        value_clip=0.2,  # None: unclipped value loss
        kl_estimator="k3",  # KL to the reference: "k1", "k2" or "k3"
        kl_clamp=None,  # clamp of the per-token KL estimate
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        task_pool="all",  # or "unseen": only train games no SFT demonstration used
    )
    c.envrl = dict(enabled=False, sp_weight=0.1, id_weight=0.1, horizon=100)
    c.checkpoint = dict(keep_last=2, keep_best=1, every=5)
    return c
