"""The RL update: the trainer's real path against the same arithmetic as one device program.

    python -m launch.bench learner --out bench_learner.json

Workload: one RL update of the built-in default (``configs/tiny_textworld.py``: its model, GRPO,
minibatches, epochs, constrained decoding) on 16 tasks x 4 rollouts of synthetic episodes shaped
like its TextWorld games (a first observation of 200-260 tokens, then 30-70 tokens an
observation and 4-12 a command, each command token drawn from 2-8 allowed ids; won episodes take
2-3 steps, lost ones the 6 allowed). Tokens/s counts the episodes' real tokens once per epoch.

- ours: ``RLUpdate`` exactly as the trainer calls it: rows built on the host, placed on the
  devices, old (and reference) log-probs and values, advantages on the host, then the shuffled
  minibatch steps and the metrics on the host.
- reference: the same arithmetic with nothing else: the rows and advantages already on the
  device, and one jitted program that computes the old log-probs and runs the same number of
  minibatch steps on contiguous slices (no shuffle, no host round trip).

The two sides alternate, 3 timed runs each after a warm-up that compiles both; medians.

Workload ``lora_rl_update_tokens_per_s``: the same update, the same episodes and shapes, trained
as a LoRA run trains it (``config.model.lora``; rank ``LORA_RANK`` on every projection when the
config has none), against the full fine-tune:

- ours: ``RLUpdate`` of the LoRA policy (``build.rl_policy``): the adapters alone differentiated
  and updated, Adam moments for them only, the KL reference the policy's own base
  (``Learner.base_state``);
- reference: ``RLUpdate`` of the full fine-tune (every parameter, its moments, a reference copy).

Workload ``long_teacher_forcing_tokens_per_s``: ALFWorld's learner passes (``LONG_CONFIG``,
``configs/alfworld_tiny.py``'s model: the tiny preset, 4 layers of 256, over its 1,024-id
tokenizer), the forward and backward pass of the next-token loss over ``LONG_ROWS`` whole-episode
rows of 3,072 tokens (``--quick``: one of 2,048), attention's query chunks run in causal bands
against in one pass:

- ours: the decoder as it is: each band of a row's queries attends to the keys up to its own end
  (``models/decoder.py`` ``_CAUSAL_BANDS``; ``keys_attended_ratio`` of the (query, key) pairs);
- reference: the same program traced with ``_CAUSAL_BANDS = 1``: every query chunk over all keys.

Both compiled first, then alternated (3 timed runs each; medians); ``max_abs_grad_diff``: the two
sides' gradients apart (f32 rounding only).
"""

from __future__ import annotations

import contextlib
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from agentrl_jax.benchmarks.report import Report, peak_rss_mb
from agentrl_jax.benchmarks.sampler import _row, interleaved
from agentrl_jax.envs.base import Task
from agentrl_jax.models import CausalLM, decoder, preset, registry
from agentrl_jax.models.testing import random_model
from agentrl_jax.rl import rl_batch
from agentrl_jax.rl.lm_head import token_logprobs
from agentrl_jax.rl.rl_update import RLUpdate
from agentrl_jax.rollout.trajectory import Step, Trajectory
from agentrl_jax.run.build import rl_learner, rl_policy
from agentrl_jax.run.config import from_config_dict, load_config_file

# The adapters' rank when the config has no LoRA of its own (its projections: all of them).
LORA_RANK = 8
CONFIG = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "tiny_textworld.py")
PAD = 0
# ALFWorld's model (configs/alfworld_tiny.py: the tiny preset over its tokenizer's 1,024 ids)
# and its whole-episode rows (``rollout.max_seq_len``); --quick: one row of 2,048 tokens.
LONG_CONFIG = preset("tiny", vocab_size=1024)
LONG_ROWS, LONG_LENGTH = 2, 3072
QUICK_LONG_ROWS, QUICK_LONG_LENGTH = 1, 2048


def synthetic_episodes(
    num_tasks: int, group_size: int, vocab: int, max_steps: int, seed: int = 0
) -> list[Trajectory]:
    """GRPO groups of constrained-decoding episodes with the default run's token counts."""
    rng = np.random.default_rng(seed)
    trajs = []
    for task in range(num_tasks):
        for _ in range(group_size):
            won = bool(rng.random() < 0.6)
            num_steps = int(rng.integers(2, 4)) if won else max_steps
            steps = []
            for s in range(num_steps):
                prompt = int(rng.integers(200, 261)) if s == 0 else int(rng.integers(30, 71))
                action = int(rng.integers(4, 13))
                ids = rng.integers(1, vocab, action)
                allowed = []
                for token in ids:
                    others = rng.integers(1, vocab, int(rng.integers(1, 8)))
                    allowed.append(sorted({int(token), *others.tolist()}))
                steps.append(
                    Step(
                        prompt_ids=rng.integers(1, vocab, prompt).tolist(),
                        action_ids=ids.tolist(),
                        action_logprobs=(-rng.random(action)).tolist(),
                        action_allowed=allowed,
                        reward=float(won and s == num_steps - 1),
                        state_key=int(rng.integers(1 << 30)),
                        done=won and s == num_steps - 1,
                    )
                )
            trajs.append(
                Trajectory(Task("synthetic", "train", str(task)), task, steps=steps, won=won)
            )
    return trajs


def run(quick: bool) -> Report:
    config_dict = load_config_file(CONFIG + (":test" if quick else ""))
    config = from_config_dict(config_dict)
    cfg = preset(
        config.model.preset, vocab_size=config.model.tokenizer_vocab, **dict(config.model.overrides)
    )
    family = registry.family(cfg)
    policy = family.policy(cfg, rngs=nnx.Rngs(0))
    critic = family.critic.from_policy(policy, rngs=nnx.Rngs(1)) if config.needs_critic else None
    learner = rl_learner(config, policy, critic)
    spec = learner.spec
    update = RLUpdate(spec, learner, PAD)
    trajs = synthetic_episodes(
        config.rl.tasks_per_iteration,
        config.rollout.group_size,
        cfg.vocab_size,
        config.rollout.max_turns,
    )
    tokens = sum(t.num_tokens for t in trajs) * spec.epochs
    ref_policy = nnx.state(policy, nnx.Param)
    state = {"ours": learner.init(policy, critic), "ref": learner.init(policy, critic)}

    def ours():
        state["ours"], state["metrics"] = update(
            state["ours"], ref_policy, trajs, np.random.default_rng(0), 0
        )
        jax.block_until_ready(state["ours"])

    # The reference's inputs, built untimed: the same rows and advantages, on the device.
    batch, _, _ = update.batch(state["ref"], ref_policy, trajs)
    batch = {k: v for k, v in batch.items() if k not in ("old_logprobs", "ref_logprobs")}
    rows = batch["tokens"].shape[0]
    size = spec.minibatch_size
    num_steps = spec.epochs * (rows // size)

    @functools.partial(jax.jit, donate_argnums=0)
    def program(train_state, batch):
        scored = learner.score_fn(  # the pure functions, traced into this one program
            train_state.policy,
            ref_policy if spec.kl.needs_reference else None,
            None,
            batch,
            rows_per_chunk=rows,
        )
        batch = {**batch, **scored}
        for i in range(num_steps):
            lo = (i * size) % rows
            minibatch = {k: v[lo : lo + size] for k, v in batch.items()}
            train_state, _ = learner.rl_step_fn(train_state, minibatch)
        return train_state

    def reference():
        state["ref"] = jax.block_until_ready(program(state["ref"], batch))

    ours_runs, ref_runs = interleaved(ours, reference, 1 if quick else 3)
    report = Report("learner")
    report.add(
        _row(
            "rl_update_tokens_per_s",
            tokens,
            ours_runs,
            ref_runs,
            "tokens/s",
            episodes=len(trajs),
            real_tokens=tokens // spec.epochs,
            padded_tokens=int(rows * batch["tokens"].shape[1]),
            rows=rows,
            minibatch_steps=num_steps,
            updates=state["metrics"]["train/updates"],
        )
    )
    if not config_dict.model.lora.rank:
        config_dict.model.lora.rank = LORA_RANK
    lora_config = from_config_dict(config_dict)
    report.add(_lora_row(lora_config, policy, critic, trajs, tokens, 1 if quick else 3))
    report.add(_long_row(quick))
    report.facts.update(
        config="configs/tiny_textworld.py" + (":test" if quick else ""),
        algo=spec.algo,
        load_average=os.getloadavg(),
        peak_rss_mb=peak_rss_mb(),
        padded_length=int(rl_batch.length_bucket(max(t.num_tokens for t in trajs))),
    )
    return report


def _lora_row(config, policy, critic, trajs, tokens, repeats):
    """The LoRA update (``config.model.lora``) against the full one, interleaved, on the same
    episodes."""
    lora_policy = rl_policy(config, policy)  # the base shared with ``policy``, not copied
    sides = {}
    for name, model in (("lora", lora_policy), ("full", policy)):
        learner = rl_learner(config, model, critic)
        sides[name] = {
            "learner": learner,
            "update": RLUpdate(learner.spec, learner, PAD),
            "state": learner.init(model, critic),  # copies: the updates donate their own
        }
    full_ref = nnx.state(policy, nnx.Param)

    def step(name):
        side = sides[name]
        learner = side["learner"]
        ref = full_ref
        if learner.lora:
            ref = learner.base_state(side["state"].policy)  # the trainer's reference
        side["state"], side["metrics"] = side["update"](
            side["state"], ref, trajs, np.random.default_rng(0), 0
        )
        jax.block_until_ready(side["state"])

    ours_runs, ref_runs = interleaved(lambda: step("lora"), lambda: step("full"), repeats)
    lora = sides["lora"]
    count = lambda tree: sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))  # noqa: E731
    trained = lora["learner"].trainable(lora["state"].policy)[0]
    return _row(
        "lora_rl_update_tokens_per_s",
        tokens,
        ours_runs,
        ref_runs,
        "tokens/s",
        lora_rank=config.model.lora.rank,
        lora_targets=config.model.lora.targets,
        trained_params=count(trained),
        full_params=count(sides["full"]["state"].policy),
        updates=lora["metrics"]["train/updates"],
        full_updates=sides["full"]["metrics"]["train/updates"],
    )


@contextlib.contextmanager
def _causal_bands(count: int):
    """Traces the decoder with ``count`` causal bands (1: every query chunk over all keys)."""
    saved = decoder._CAUSAL_BANDS
    decoder._CAUSAL_BANDS = count
    try:
        yield
    finally:
        decoder._CAUSAL_BANDS = saved


def _long_row(quick: bool):
    """The next-token loss's forward and backward pass over long rows, attention in causal bands
    (ours) against in one pass (the reference), each compiled under its setting."""
    rows, length = (QUICK_LONG_ROWS, QUICK_LONG_LENGTH) if quick else (LONG_ROWS, LONG_LENGTH)
    graphdef, params = nnx.split(random_model(CausalLM, LONG_CONFIG, std=0.02))
    tokens = jnp.asarray(
        np.random.default_rng(0).integers(1, LONG_CONFIG.vocab_size, (rows, length))
    )

    def loss(params, tokens):
        logits, _ = nnx.merge(graphdef, params)(tokens)
        return -jnp.mean(token_logprobs(logits, tokens)[:, 1:])

    step = jax.jit(jax.value_and_grad(loss))
    compiled, out = {}, {}
    for name, bands in (("ours", decoder._CAUSAL_BANDS), ("reference", 1)):
        with _causal_bands(bands):
            compiled[name] = step.lower(params, tokens).compile()

    def side(name):
        def call():
            out[name] = jax.block_until_ready(compiled[name](params, tokens))

        return call

    ours_runs, ref_runs = interleaved(side("ours"), side("reference"), 1 if quick else 3)
    bands = decoder.causal_bands(LONG_CONFIG, rows, length)
    (ours_loss, ours_grads), (ref_loss, ref_grads) = out["ours"], out["reference"]
    grad_diff = max(
        float(jnp.max(jnp.abs(a - b)))
        for a, b in zip(jax.tree.leaves(ours_grads), jax.tree.leaves(ref_grads), strict=True)
    )
    return _row(
        "long_teacher_forcing_tokens_per_s",
        rows * length,
        ours_runs,
        ref_runs,
        "tokens/s",
        rows=rows,
        row_length=length,
        layers=LONG_CONFIG.num_layers,
        hidden_size=LONG_CONFIG.hidden_size,
        causal_bands=bands,
        keys_attended_ratio=(bands + 1) / (2 * bands),
        loss_diff=abs(float(ours_loss) - float(ref_loss)),
        max_abs_grad_diff=grad_diff,
    )
