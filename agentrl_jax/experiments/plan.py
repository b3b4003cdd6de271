"""The memory plan of a run, before it runs: every program it executes, compiled ahead of time.

``memory_plan(config)`` builds the run's models abstractly (``nnx.eval_shape``: shapes, dtypes and
shardings, no parameter is allocated), lowers each device program a run of ``config`` executes
with abstract inputs (``jax.ShapeDtypeStruct`` with the shardings the run gives them), compiles
it for the current devices and reads XLA's compiled memory analysis, per device:

- ``sampler_turn``: one rollout turn (prefill of ``prompt_tokens`` new tokens, then decode up to
  ``rollout.max_new_tokens``) for the rollout batch (a wave of the actor pool, as the trainer
  plays it) over a KV cache of ``rollout.max_seq_len`` slots, the whole cache in use (an
  episode's last turns, the largest turn program), on the sampler's copy of the policy
  (``sampler_copy``: the run's mesh, or with ``local_devices`` one host's mesh);
- ``sft_step`` (runs with SFT demonstrations only): one SFT step at ``sft.batch_size`` rows of
  ``rollout.max_seq_len`` tokens, with its Adam moments;
- ``score``: old (and reference) log-probs and values of one iteration's rows;
- ``rl_update``: ``rl.epochs`` shuffles of minibatches over those rows (policy, critic when the
  estimator needs one, Adam), the train state donated.

Bytes per device: ``arguments``, ``outputs``, ``temporaries`` (XLA's buffer assignment),
``aliased`` (outputs written into donated arguments) and ``total = arguments + outputs +
temporaries - aliased`` (less ``shared``: a LoRA run's score gets the policy's base twice, as
the policy's and as the KL reference, the same buffers). ``resident`` is what the run holds
outside the program's arguments while it runs (e.g. the reference policy during the update, the
optimizer moments during a rollout), from the state's shapes; ``peak = total + resident`` is the
figure to hold against a chip. Asynchronous RL (``rl.max_staleness`` > 0) plays a rollout
while the learner scores and updates: unless ``config.rollout_mesh`` gives the sampler devices of
its own, the sampler's turn (its own copy of the policy, its KV cache, the turn's temporaries:
the turn's ``total``) is resident beside ``score`` and ``rl_update`` (``rollout``).
``analytic`` cross-checks the arguments: parameter bytes (each array's shard on one device) and
Adam's two moments per trainable parameter.

A LoRA run (``model.lora.rank`` > 0) is planned as it runs: the RL state's policy carries
adapters on the targeted projections (``build.rl_policy``; laid out on their base's logical axes)
and Adam moments for the adapters alone (``Learner.trainable``); the KL reference is the
policy's frozen base, no copy (``Learner.base_state``); the sampler's copy is the merged weights
in the compute dtype (``build.sync_sampler``), held beside the train state. SFT stays a full
fine-tune of the plain policy.

One iteration's rows are the most it can produce: one per episode (``episode`` contexts) or one
per step (``step``), ``rollout.max_seq_len`` tokens each, padded to whole minibatches.

The figures are those of the CPU compiler's buffer assignment on fake devices: the program and
its shardings are the accelerator's, the temporaries an estimate of them (fusion and scheduling
differ by backend).
"""

from __future__ import annotations

import math
import os
import pathlib
import sys
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import nnx

from agentrl_jax import sharding
from agentrl_jax.models import registry
from agentrl_jax.rl import rl_batch, sft_data
from agentrl_jax.run import budget as budget_lib
from agentrl_jax.run import multihost
from agentrl_jax.run.build import (
    DTYPES,
    kl_reference,
    model_config,
    rl_learner,
    rl_sampling,
    rollout_device_mesh,
    sampler_weights,
    sft_learner,
)
from agentrl_jax.run.config import RunConfig
from agentrl_jax.sampling import Sampler, StopConfig

GIB = 1 << 30
PROGRAMS = ("sampler_turn", "sft_step", "score", "rl_update")
# Prompt tokens a planned turn prefills: a long observation (the prefill's attention is
# [rows, heads, prompt, slots], so a longer prompt costs proportionally more).
PROMPT_TOKENS = 512
# Constrained decoding: choices per turn, and allowed ids per action token in the RL rows.
NUM_CHOICES = 32


def memory_plan(
    config: RunConfig,
    *,
    prompt_tokens: int = PROMPT_TOKENS,
    num_choices: int = NUM_CHOICES,
    programs: tuple[str, ...] | None = None,
    local_devices: int | None = None,
    devices: Sequence[jax.Device] | None = None,
) -> dict[str, Any]:
    """Compiles every program of a run of ``config`` on the current devices; returns the plan.

    The devices are ``math.prod(config.mesh)`` of ``devices`` (default ``jax.devices()``; the
    first ones), laid out as ``config.mesh``; with fake CPU devices
    (``--xla_force_host_platform_device_count``) this plans any mesh on one machine. A TPU
    slice's devices from ``jax.experimental.topologies.get_topology_desc`` (``tpu_devices``)
    compile with the TPU compiler itself, ahead of time, on a machine without a TPU.

    ``programs`` names the ones to compile (default: all the run executes, ``PROGRAMS``).
    ``local_devices``: plan a multi-host layout, hosts of this many devices each: the learner's
    programs on the whole mesh, the sampler's turn on one host's mesh
    (``multihost.local_mesh``) with that host's copy of the policy. None: one host.

    Returns:
      {"devices", "mesh", "mesh_axes", "model", "sampler": {"mesh", "mesh_axes", "dtype",
      "owned", "params_bytes", "f32_replica_bytes"}, "programs": [{"name", "shapes",
      "compile_s", "per_device_bytes": {"arguments", "outputs", "temporaries", "aliased",
      "total", "resident", "peak"}, "analytic_bytes": {"params", "optimizer"}}], "largest"}.
      ``mesh`` and ``mesh_axes``: (data, fsdp, tp), and expert when ``config.mesh`` gives a
      fourth size (the sampler's: ``config.rollout_mesh``'s where it gives one, expert too
      with a fourth size). ``sampler`` is the sampler's copy of the policy
      (``build.sync_sampler``): its mesh, dtype, whether it is a copy of its own beside the
      train state, and its bytes per device, next to the whole policy in float32 on every
      device (the replica multi-host runs used to hold); ``background``: asynchronous RL's
      turn is resident beside ``score`` and ``rl_update``, whose ``per_device_bytes`` then
      hold its bytes as ``rollout`` (in ``resident``).

    Raises:
      ValueError: the mesh needs more devices than there are, an unknown program name, or
        ``local_devices`` that does not divide the mesh's devices.
    """
    unknown = sorted(set(programs or ()) - set(PROGRAMS))
    if unknown:
        raise ValueError(f"programs {unknown}: expected names from {list(PROGRAMS)}")
    mesh_shape = tuple(config.mesh)
    devices = list(devices) if devices is not None else jax.devices()
    if math.prod(mesh_shape) > len(devices) or -1 in mesh_shape:
        raise ValueError(
            f"config.mesh={mesh_shape} needs {abs(math.prod(mesh_shape))} devices; "
            f"{len(devices)} are visible"
        )
    mesh = sharding.make_mesh(mesh_shape, devices[: math.prod(mesh_shape)])
    check_local_devices(local_devices, mesh.size)
    if config.rollout_mesh and local_devices is not None:
        raise ValueError(
            f"local_devices={local_devices} plans a multi-host run, and "
            f"config.rollout_mesh={config.rollout_mesh} is for one host: give one of them"
        )
    # Disaggregated: the sampler on the devices after the learner's (the run's own rule).
    rollout_mesh = rollout_device_mesh(config, devices)
    model_cfg = model_config(config)
    family = registry.family(model_cfg)
    policy = nnx.eval_shape(lambda: family.policy(model_cfg, rngs=nnx.Rngs(0)))
    # The policy as RL trains it (``build.rl_policy``): with LoRA, adapters on the targeted
    # projections (their base's logical axes, so laid out like it), the base frozen.
    lora_cfg = config.model.lora.lora_config()
    rl_pol = policy
    if config.model.lora.enabled:
        rl_cfg = model_cfg.replace(lora=lora_cfg, param_dtype=DTYPES[config.model.lora.base_dtype])
        rl_pol = nnx.eval_shape(lambda: family.policy(rl_cfg, rngs=nnx.Rngs(0)))
    critic = None
    if config.needs_critic:
        critic = nnx.eval_shape(lambda: family.critic(model_cfg, rngs=nnx.Rngs(0)))
    learner = rl_learner(config, rl_pol, critic, mesh)
    state = learner.abstract_state(rl_pol, critic)
    # The trainer's (``build.kl_reference``): a frozen copy, or LoRA's base, the train state's
    # own arrays (shared: not counted twice).
    ref, frozen = kl_reference(learner, state.policy)
    ref_shared = ref is not None and not frozen
    rows, seq = iteration_rows(config), rl_batch.length_bucket(config.rollout.max_seq_len)
    # Asynchronous RL on the learner's devices: a rollout plays beside score and rl_update,
    # on a copy of its own (``build.sync_sampler(copy=True)``: the update donates the state's).
    background = config.rl.max_staleness > 0 and rollout_mesh is None
    sampler_mesh, sampler_params, owned = sampler_copy(
        model_cfg,
        state.policy,
        mesh if rollout_mesh is None else rollout_mesh,
        local_devices,
        lora=config.model.lora.enabled,
        rollout=rollout_mesh is not None,
        copy=background,
    )

    def turn():
        return _sampler_turn(
            config,
            policy,
            state,
            None if ref_shared else ref,
            sampler_mesh,
            sampler_params,
            owned,
            prompt_tokens,
            num_choices,
            apart=rollout_mesh is not None,
        )

    runs = [name for name in PROGRAMS if programs is None or name in programs]
    if not budget_lib.from_config(config.budget).num_demos:
        runs = [name for name in runs if name != "sft_step"]  # a run without SFT
    played = turn() if background and {"score", "rl_update"} & set(runs) else None
    # What the background turn holds beside the learner's programs: its copy of the policy,
    # its KV cache and its temporaries (its total; the train state it does not read is theirs).
    beside = played["per_device_bytes"]["total"] if played else 0
    build = {
        "sampler_turn": (lambda: played) if played else turn,
        "sft_step": lambda: _sft_step(config, policy, mesh, seq),
        "score": lambda: _score(
            config, learner, state, ref, rows, seq, num_choices, ref_shared, beside=beside
        ),
        "rl_update": lambda: _rl_update(
            config, learner, state, None if ref_shared else ref, rows, seq, num_choices, beside
        ),
    }
    programs = [build[name]() for name in runs]
    largest = max(programs, key=lambda p: p["per_device_bytes"]["peak"])
    return {
        "devices": mesh.size,
        "rollout_devices": 0 if rollout_mesh is None else rollout_mesh.size,
        "platform": devices[0].platform,
        "device_kind": devices[0].device_kind,
        "mesh": [int(mesh.shape[a]) for a in mesh.axis_names],
        "mesh_axes": list(mesh.axis_names),
        "model": {
            "source": config.model.checkpoint or config.model.preset,
            "params": model_cfg.num_params,
            "layers": model_cfg.num_layers,
            "vocab": model_cfg.vocab_size,
            "dtype": config.model.dtype,
            "remat": bool(config.model.remat),
            "lora": None
            if not config.model.lora.enabled
            else {
                "rank": lora_cfg.rank,
                "targets": list(lora_cfg.targets),
                "base_dtype": config.model.lora.base_dtype,
            },
        },
        "sampler": {
            "mesh": [int(sampler_mesh.shape[a]) for a in sampler_mesh.axis_names],
            "mesh_axes": list(sampler_mesh.axis_names),
            "own_devices": rollout_mesh is not None,
            "background": background,
            "dtype": np.dtype(model_cfg.dtype).name,
            "owned": owned,
            "params_bytes": device_bytes(sampler_params),
            "f32_replica_bytes": 4 * model_cfg.num_params,
        },
        "programs": programs,
        "largest": largest["name"],
    }


def tpu_devices(topology: str) -> list[jax.Device]:
    """The chips of a TPU slice, e.g. ``"v5e:2x4"``, to compile for without one (libtpu must be
    importable: ``pip install -e '.[tpu_plan]'``; nothing is allocated on them).

    Raises:
      ValueError: libtpu is missing or does not know the topology.
    """
    from jax.experimental import topologies  # noqa: PLC0415

    # libtpu where scripts/test.sh installs it, beside the venv (the tpu_plan extra puts it in
    # the venv instead, where it is found anyway); read when the TPU plugin first loads.
    beside = pathlib.Path(__file__).resolve().parents[2] / ".venv" / "tpu_plan"
    if (beside / "libtpu").is_dir() and str(beside) not in sys.path:
        sys.path.append(str(beside))
    # libtpu looks for this host's TPU workers first: naming this host keeps it from printing
    # errors about them. Only compiling, several plans may load it at once (it otherwise locks
    # the chips it would drive).
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    try:
        return list(topologies.get_topology_desc(topology_name=topology, platform="tpu").devices)
    except Exception as e:  # noqa: BLE001 - libtpu's own errors (missing, unknown name) vary
        raise ValueError(
            f"topology={topology!r}: no TPU compiler for it ({type(e).__name__}: {e}). Expected a "
            f"slice such as v5e:2x4, v4:2x2x2 or v5p:2x2x2, with libtpu installed "
            f"(pip install -e '.[tpu_plan]')"
        ) from e


def sampler_copy(
    model_cfg, policy, mesh, local_devices=None, *, lora=False, rollout=False, copy=False
):
    """``(mesh, params, owned)``: where the sampler runs and its copy of the policy, abstract.

    What ``build.sync_sampler`` gives the sampler, by the same decision
    (``build.sampler_weights``): on one host (``local_devices`` None) the run's ``mesh`` (with
    ``rollout``: the rollout's own) and the train state's ``policy`` (abstract, float32
    parameters), borrowed, or a copy of its own (``owned``) in the compute dtype; multi-host,
    the first host's ``multihost.local_mesh`` and the policy there in the compute dtype, split
    by the rules. With ``lora`` (``policy`` holds adapters): the merged weights, a plain
    model's state in the compute dtype in the base's layout (``lora.merge``). ``copy``: the
    sampler must own its weights (asynchronous RL).
    """
    dtype = np.dtype(model_cfg.dtype)
    kind = sampler_weights(
        multihost=local_devices is not None,
        rollout=rollout,
        lora=lora,
        casts=sharding.casts(policy, dtype),
        copy=copy,
    )
    if lora:
        policy = nnx.split_state(policy, nnx.LoRAParam, ...)[1]  # the base, merged into
    if kind == "borrowed":
        return mesh, policy, False
    if local_devices is not None:
        local = list(mesh.devices.flat)[:local_devices]
        mesh = sharding.make_mesh(multihost.sampler_mesh_shape(model_cfg, local_devices), local)
    targets = sharding.leaf_shardings(policy, mesh)

    def cast(x, target):
        kept = x.dtype if not jnp.issubdtype(x.dtype, jnp.floating) else dtype
        return jax.ShapeDtypeStruct(x.shape, kept, sharding=target)

    return mesh, jax.tree.map(cast, policy, targets), True


def check_local_devices(local_devices: int | None, num_devices: int) -> None:
    """Raises ValueError unless ``local_devices`` is None or divides ``num_devices``."""
    if local_devices is not None and (local_devices < 1 or num_devices % local_devices):
        raise ValueError(
            f"local_devices={local_devices}: expected a divisor of the mesh's {num_devices} devices"
        )


def iteration_rows(config: RunConfig) -> int:
    """The most RL rows one iteration makes, padded to whole minibatches (``build_rows``)."""
    episodes = config.rl.tasks_per_iteration * config.rollout.group_size
    per_episode = config.rollout.max_turns if config.rollout.context_mode == "step" else 1
    return rl_batch.round_up(episodes * per_episode, config.rl_spec().minibatch_size)


def rollout_batch(config: RunConfig) -> int:
    """Episodes one sampler turn plays: a wave of the actor pool (``RolloutWorker.run``)."""
    group, tasks = config.rollout.group_size, config.rl.tasks_per_iteration
    capacity = config.env.num_workers * config.env.envs_per_worker
    return min(max(1, capacity // group), tasks) * group


# ------------------------------------------------------------------ programs


def _sampler_turn(
    config, policy, state, ref, mesh, params, owned, prompt_tokens, num_choices, *, apart=False
):
    rollout = config.rollout
    sampler = Sampler(policy, stop=StopConfig(eos_ids=(0,)), mesh=mesh)
    sampler.set_state(params)  # the trainer's: the train state's policy, or a copy of it
    batch = rollout_batch(config)
    cache = sampler.abstract_cache(batch, rollout.max_seq_len)
    choices = num_choices if rollout.constrain_actions else 0
    prompt = min(prompt_tokens, cache.size - rollout.max_new_tokens)
    shapes = {
        "batch": batch,
        "cache_slots": cache.size,
        "prompt_tokens": prompt,
        "max_new_tokens": rollout.max_new_tokens,
        "choices": choices,
    }
    lowered = lambda: sampler.lower_turn(  # noqa: E731
        cache, prompt, rollout.max_new_tokens, sampling=rl_sampling(config), num_choices=choices
    )
    # Alive beside it: the optimizer moments, the critic and the reference (and the train
    # state's policy, when the sampler's is a copy); nothing of the learner's on devices
    # of the rollout's own (``apart``: config.rollout_mesh).
    resident = [] if apart else [state.policy_opt, state.value, state.value_opt, ref]
    if owned and not apart:
        resident.append(state.policy)
    return _program("sampler_turn", shapes, lowered, resident, params=[params])


def _sft_step(config, policy, mesh, seq):
    learner = sft_learner(config, policy, 1, mesh)
    state = learner.abstract_state(policy)
    rows = config.sft.batch_size
    dtypes = {"tokens": jnp.int32, "mask": jnp.float32, "loss_mask": jnp.float32}
    batch = learner.abstract_batch({k: ((rows, seq), dtypes[k]) for k in sft_data.BATCH_KEYS})
    shapes = {"rows": rows, "seq": seq, "microbatch": config.sft.microbatch_size or rows}
    lowered = lambda: learner.sft_step.lower(state, batch)  # noqa: E731
    return _program("sft_step", shapes, lowered, [], params=[state.policy], trained=[state.policy])


def _score(config, learner, state, ref, rows, seq, num_choices, ref_shared=False, *, beside=0):
    batch = learner.abstract_batch(_row_shapes(config, learner, rows, seq, num_choices, False))
    chunk = learner.spec.score_rows
    shapes = {"rows": rows, "seq": seq, "rows_per_chunk": chunk}
    lowered = lambda: learner.score.lower(  # noqa: E731
        state.policy, ref, state.value, batch, rows_per_chunk=chunk
    )
    resident = [state.policy_opt, state.value_opt]
    # A LoRA run's reference is the policy's own base: the same buffers passed twice, which
    # XLA's arguments count twice.
    shared = ref if ref_shared else None
    params = [state.policy, state.value] if ref_shared else [state.policy, ref, state.value]
    return _program("score", shapes, lowered, resident, params=params, shared=shared, beside=beside)


def _rl_update(config, learner, state, ref, rows, seq, num_choices, beside=0):
    rl = learner.spec
    batch = learner.abstract_batch(_row_shapes(config, learner, rows, seq, num_choices, True))
    steps = rl.epochs * (rows // rl.minibatch_size)
    replicated = jax.sharding.NamedSharding(learner.mesh, jax.sharding.PartitionSpec())
    index = jax.ShapeDtypeStruct((steps, rl.minibatch_size), jnp.int32, sharding=replicated)
    per_update = {}
    if rl.envrl is not None:
        per_update = {"iteration": jax.ShapeDtypeStruct((steps,), jnp.int32, sharding=replicated)}
        for kind in ("sp", "id"):
            for name, dtype in (("tokens", jnp.int32), ("mask", jnp.float32)):
                per_update[f"aux_{kind}_{name}"] = jax.ShapeDtypeStruct(
                    (steps, rl.minibatch_size, seq), dtype, sharding=replicated
                )
            per_update[f"aux_{kind}_target_mask"] = per_update[f"aux_{kind}_mask"]
    shapes = {
        "rows": rows,
        "seq": seq,
        "minibatch": rl.minibatch_size,
        "microbatch": rl.microbatch_size or rl.minibatch_size,
        "steps": steps,
    }
    lowered = lambda: learner.rl_update.lower(state, batch, index, per_update)  # noqa: E731
    return _program(
        "rl_update",
        shapes,
        lowered,
        [ref],
        params=[state.policy, state.value],
        trained=[learner.trainable(state.policy)[0], state.value],
        beside=beside,
    )


def _row_shapes(config, learner, rows, seq, num_choices, scored):
    """(shape, dtype) of the RL batch's arrays: what ``RLUpdate.batch`` places on the mesh."""
    spec = learner.spec
    per_token = {"tokens": jnp.int32, "mask": jnp.float32}
    if scored:
        per_token.update(loss_mask=jnp.float32, step_ids=jnp.int32, old_logprobs=jnp.float32)
        per_token["advantages"] = jnp.float32
        if spec.kl.needs_reference:
            per_token["ref_logprobs"] = jnp.float32
        if spec.needs_critic:
            per_token.update(old_values=jnp.float32, returns=jnp.float32)
    out = {k: ((rows, seq), dtype) for k, dtype in per_token.items()}
    if config.rollout.constrain_actions:
        out["allowed"] = ((rows, seq, num_choices), jnp.int32)
    return out


# ------------------------------------------------------------------ measuring


def _program(
    name, shapes, lowered, resident, *, params, trained=None, shared=None, beside=0
) -> dict[str, Any]:
    """Lowers and compiles one program (timed) and reads its memory analysis.

    ``resident``: what the run holds beside the program's arguments; ``params``: the parameter
    states among its arguments; ``trained``: those Adam trains (the adapters alone with LoRA);
    ``shared``: arguments passed twice (the same buffers), counted once in ``total``;
    ``beside``: bytes per device of a program running at the same time (asynchronous RL's
    sampler turn), added to ``resident`` and reported as ``rollout``.
    """
    start = time.perf_counter()
    compiled = lowered().compile()
    compile_s = time.perf_counter() - start
    stats = compiled.memory_analysis()
    b = {
        "arguments": int(stats.argument_size_in_bytes),
        "outputs": int(stats.output_size_in_bytes),
        "temporaries": int(stats.temp_size_in_bytes),
        "aliased": int(stats.alias_size_in_bytes),
    }
    b["total"] = b["arguments"] + b["outputs"] + b["temporaries"] - b["aliased"]
    if shared is not None:
        b["shared"] = device_bytes(shared)
        b["total"] -= b["shared"]
    b["resident"] = device_bytes(resident) + beside
    if beside:
        b["rollout"] = beside
    b["peak"] = b["total"] + b["resident"]
    logging.info(
        "plan: %s compiled in %.1f s, peak %.2f GiB per device", name, compile_s, b["peak"] / GIB
    )
    return {
        "name": name,
        "shapes": shapes,
        "compile_s": round(compile_s, 2),
        "per_device_bytes": b,
        "analytic_bytes": {
            "params": device_bytes(params),
            # Adam: two float32 moments per trained parameter.
            "optimizer": 2 * 4 * device_bytes(trained, itemsize=1) if trained else 0,
        },
    }


def device_bytes(tree: Any, itemsize: int | None = None) -> int:
    """Bytes of one device's shards of an abstract pytree (elements x ``itemsize`` if given)."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        shape = leaf.shape
        if getattr(leaf, "sharding", None) is not None:
            shape = leaf.sharding.shard_shape(leaf.shape)
        total += math.prod(shape) * (itemsize or np.dtype(leaf.dtype).itemsize)
    return total


def format_table(plan: dict[str, Any]) -> str:
    """The plan as a markdown table of bytes per device (GiB, or MiB for a small model)."""
    largest = next(p for p in plan["programs"] if p["name"] == plan["largest"])
    peak = largest["per_device_bytes"]["peak"]
    unit, scale = ("GiB", GIB) if peak >= GIB else ("MiB", 1 << 20)
    gib = lambda n: f"{n / scale:.2f}"  # noqa: E731
    apart = f" (+ {plan['rollout_devices']} for rollouts)" if plan.get("rollout_devices") else ""
    lines = [
        f"devices: {plan['devices']}{apart}, mesh {dict(zip(plan['mesh_axes'], plan['mesh']))}, "
        "model "
        f"{plan['model']['source']} ({plan['model']['params'] / 1e9:.2f}B params, "
        f"{plan['model']['dtype']}, remat={plan['model']['remat']})",
        "",
        "| program | shapes | args | outputs | temps | aliased | total | resident | peak "
        "| params (analytic) | Adam (analytic) | compile s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in plan["programs"]:
        b, a = p["per_device_bytes"], p["analytic_bytes"]
        shapes = ", ".join(f"{k}={v}" for k, v in p["shapes"].items())
        cells = [b[k] for k in ("arguments", "outputs", "temporaries", "aliased", "total")]
        cells += [b["resident"], b["peak"], a["params"], a["optimizer"]]
        lines.append(
            f"| {p['name']} | {shapes} | "
            + " | ".join(gib(c) for c in cells)
            + f" | {p['compile_s']:.1f} |"
        )
    s = plan["sampler"]
    copy = "a copy of its own" if s["owned"] else "the train state's arrays"
    if s.get("own_devices"):
        copy += ", on devices of its own (config.rollout_mesh)"
    lines += [
        "",
        f"sampler: mesh {dict(zip(s.get('mesh_axes', plan['mesh_axes']), s['mesh']))}, "
        f"{s['dtype']} parameters "
        f"({copy}): {gib(s['params_bytes'])} {unit} per device (the policy in float32 on every "
        f"device: {gib(s['f32_replica_bytes'])} {unit})",
    ]
    background = [p for p in plan["programs"] if p["per_device_bytes"].get("rollout")]
    if background:
        lines.append(
            f"asynchronous RL (rl.max_staleness > 0): the rollout played ahead, its copy of "
            f"the policy, KV cache and turn temporaries "
            f"({gib(background[0]['per_device_bytes']['rollout'])} {unit} per device), is "
            "resident beside score and rl_update on the learner's devices."
        )
    lora = plan["model"].get("lora")
    if lora:
        lines.append(
            f"LoRA: rank {lora['rank']} on {','.join(lora['targets'])}, the frozen base in "
            f"{lora.get('base_dtype', 'float32')}; Adam moments for the adapters alone; the KL "
            "reference is the policy's own base (no copy); the sampler's copy is the merged "
            "weights."
        )
    shared = [p for p in plan["programs"] if p["per_device_bytes"].get("shared")]
    lines += [
        "",
        f"{unit} per device; total = args + outputs + temps - aliased; peak = total + resident "
        "(arrays the run holds outside the program's arguments).",
        *(
            f"{p['name']}: total less {gib(p['per_device_bytes']['shared'])} {unit}, the base "
            "passed twice (as the policy's and as the KL reference), the same buffers."
            for p in shared
        ),
        f"largest program: {plan['largest']} ({gib(peak)} {unit} per device at its peak)",
    ]
    return "\n".join(lines)


__all__ = [
    "check_local_devices",
    "device_bytes",
    "format_table",
    "iteration_rows",
    "memory_plan",
    "rollout_batch",
    "sampler_copy",
]
