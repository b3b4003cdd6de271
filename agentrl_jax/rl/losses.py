"""The learner's loss terms, their total, microbatch accumulation and the guarded optimizer step.

A loss is split in two: a forward pass ``forward(params, batch)`` -> per-row stats (every use of
the parameters; the Learner's ``sft_forward`` / ``rl_forward``), and its terms ``terms(stats,
batch)`` -> (terms, metrics) (:func:`sft_terms`, :func:`rl_terms`), where ``terms`` maps each
loss term to (coefficient, Weighted) and the loss is sum_k coefficient_k * value_k
(:func:`total`). The split lets :func:`loss_and_grads` scan microbatches through the forward
pass and still give the whole batch's loss, gradient and metrics.

Which RL terms there are is the spec's (``rl/spec.py``): the KL to the reference is evaluated
when ``spec.kl.needs_reference`` (logged as ``losses/kl_ref``) and joins the loss with weight
``spec.weights.kl`` (0 in reward mode, where the estimator took the KL as a reward penalty).

Everything here is a pure function of arrays and static settings, traced inside the Learner's
jitted steps.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from agentrl_jax import kernels
from agentrl_jax.rl.spec import RLSpec

# name -> (coefficient, Weighted): the loss is sum_k coefficient_k * value_k.
Terms = dict[str, tuple[Any, kernels.Weighted]]


def sft_terms(stats, batch) -> tuple[Terms, dict[str, Any]]:
    """The SFT loss: token-mean negative log-likelihood of the ``loss_mask`` tokens."""
    nll = kernels.aggregate(-stats["logprobs"], batch["loss_mask"], "token_mean")
    return {"sft/nll": (1.0, nll)}, {"sft/nll": nll, "sft/tokens": nll.denominator}


def rl_terms(
    spec: RLSpec, policy_loss: Callable[..., Any], stats, batch
) -> tuple[Terms, dict[str, Any]]:
    """The RL loss terms (policy, entropy bonus, KL, value, ENVRL) and metrics of ``stats``.

    Args:
      spec: the RL settings (loss config, weights, KL, ENVRL).
      policy_loss: ``spec.policy_loss``'s registered function.
      stats: the forward pass's per-row stats: "logprobs", "entropy" [B, T]; "values" [B, T]
        with a critic; "aux_sp_logprobs", "aux_id_logprobs" [N, L] with ENVRL examples.
      batch: the minibatch: "old_logprobs", "advantages", "loss_mask", "step_ids" [B, T];
        "ref_logprobs" [B, T] when ``spec.kl.needs_reference``; "old_values", "returns" with a
        critic; ENVRL's "aux_*_target_mask" and "iteration".
    """
    cfg, w = spec.loss, spec.weights
    logp, mask = stats["logprobs"], batch["loss_mask"]
    pg, pg_metrics = policy_loss(
        logp,
        batch["old_logprobs"],
        batch["advantages"],
        mask,
        step_ids=batch["step_ids"],
        config=cfg,
    )
    terms = {"losses/policy_loss": (1.0, pg)}
    metrics = {"losses/policy_loss": pg}
    metrics.update({metric_name(k): v for k, v in pg_metrics.items()})

    ent = kernels.entropy_bonus(stats["entropy"], mask, cfg.aggregation)
    metrics["losses/entropy"] = ent
    if w.entropy:
        terms["losses/entropy"] = (-w.entropy, ent)

    if spec.kl.needs_reference:
        kl = kernels.kl_loss(logp, batch["ref_logprobs"], mask, config=cfg)
        metrics["losses/kl_ref"] = kl
        if w.kl:
            terms["losses/kl_ref"] = (w.kl, kl)

    if "values" in stats:
        values = stats["values"]
        vf, vf_metrics = kernels.value_loss(
            values, batch["old_values"], batch["returns"], mask, config=cfg
        )
        terms["losses/value_loss"] = (w.value, vf)
        metrics["losses/value_loss"] = vf
        metrics.update({metric_name(k): v for k, v in vf_metrics.items()})
        metrics["losses/explained_variance"] = kernels.explained_variance(
            values, batch["returns"], mask
        )

    if "aux_sp_logprobs" in stats:
        envrl = spec.envrl
        for kind in ("sp", "id"):
            aux = kernels.aux_loss(stats[f"aux_{kind}_logprobs"], batch[f"aux_{kind}_target_mask"])
            weight = kernels.cosine_weight(
                batch["iteration"], getattr(envrl, f"{kind}_weight"), envrl.horizon
            )
            terms[f"envrl/{kind}_loss"] = (weight, aux)
            metrics[f"envrl/{kind}_loss"] = aux
            metrics[f"envrl/{kind}_weight"] = weight
    metrics["losses/total"] = total(terms)
    return terms, metrics


def total(terms: Terms, denominators=None) -> jax.Array:
    """sum_k c_k * numerator_k / denominator_k over ``terms`` (name -> (c_k, Weighted)).

    ``denominators`` (name -> scalar) replaces the terms' own, e.g. the whole batch's for a
    microbatch's numerators.
    """
    out = 0.0
    for name, (coefficient, weighted) in terms.items():
        if denominators is not None:
            weighted = kernels.Weighted(weighted.numerator, denominators[name])
        out = out + coefficient * weighted.value
    return out


def loss(forward, terms_fn, params, batch, denominators=None):
    """(loss, (stats, metrics)) of one batch: ``forward``, then ``terms_fn``, then the total."""
    stats = forward(params, batch)
    terms, metrics = terms_fn(stats, batch)
    return total(terms, denominators), (stats, metrics)


def metric_values(metrics) -> dict[str, jax.Array]:
    """The metrics as scalars (a Weighted's value)."""
    return {k: v.value if isinstance(v, kernels.Weighted) else v for k, v in metrics.items()}


def metric_name(name: str) -> str:
    return name if "/" in name else f"losses/{name}"


# ---------------------------------------------------------------- microbatches


def num_microbatches(batch, microbatch_size: int) -> int:
    """How many microbatches ``batch`` splits into (static: from the shapes).

    Raises:
      ValueError: ``microbatch_size`` does not divide the batch's rows, or an array (ENVRL's
        ``aux_*``, with rows of their own) does not split into as many microbatches.
    """
    rows = batch["tokens"].shape[0]
    size = microbatch_size or rows
    if rows % size:
        raise ValueError(
            f"Learner microbatch_size={size} does not divide the batch's {rows} rows; "
            f"expected a divisor of {rows}"
        )
    n = rows // size
    for key, x in batch.items():
        if jnp.ndim(x) and x.shape[0] % n:
            raise ValueError(
                f"Learner: batch[{key!r}] has {x.shape[0]} rows, which do not split into the "
                f"{n} microbatches of {rows} rows / microbatch_size={size}"
            )
    return n


def loss_and_grads(forward, terms_fn, params, batch, microbatch_size: int = 0):
    """The whole batch's loss, gradient and metrics, scanned over microbatches on device.

    With ``microbatch_size`` rows per microbatch (strided: microbatch i holds rows i, i + n,
    ..., so rows sharded over devices stay spread over all of them), only one microbatch's
    activations are alive at a time. Exactness: every term's denominator (masked tokens or
    non-empty rows) depends on the masks only and sums over rows (the ``Weighted``
    contract), so it is taken from the whole batch first, by evaluating the terms on zero
    stats (no forward pass runs for it). Microbatch i's loss is then sum_k c_k * num_ik /
    den_k, and its losses and gradients sum to the whole batch's. The metrics are the terms
    evaluated on the whole batch's stats, reassembled from the microbatches', so means,
    fractions and the explained variance are the whole batch's, not means of means.
    Gradients accumulate in float32.

    Args:
      forward: (params, batch) -> dict of per-row stats, [rows, ...] arrays; every use of
        the parameters is in it.
      terms_fn: (stats, batch) -> (terms, metrics): terms maps a name to (coefficient,
        Weighted), metrics a name to a Weighted or a scalar.
      params: the pytree differentiated.
      batch: [B, ...] arrays (ENVRL's ``aux_*``: [N, ...], split into as many microbatches)
        and scalars, which every microbatch sees whole.
      microbatch_size: rows per microbatch, or 0 for the whole batch at once.

    Returns:
      (loss, grads, metrics): the scalar loss, grads shaped and typed like ``params``, and
      the metrics as scalars.
    """
    grad_fn = jax.value_and_grad(functools.partial(loss, forward, terms_fn), has_aux=True)
    n = num_microbatches(batch, microbatch_size)
    if n == 1:
        (value, (_, metrics)), grads = grad_fn(params, batch)
        return value, grads, metric_values(metrics)

    shapes = jax.eval_shape(forward, params, batch)
    zero_stats = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    terms, _ = terms_fn(zero_stats, batch)
    denominators = {name: weighted.denominator for name, (_, weighted) in terms.items()}
    shared = {k: v for k, v in batch.items() if not jnp.ndim(v)}
    rows = {k: split_rows(v, n) for k, v in batch.items() if jnp.ndim(v)}

    def body(carry, micro):
        loss_sum, grads_sum = carry
        (value, (stats, _)), grads = grad_fn(params, {**shared, **micro}, denominators)
        grads_sum = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), grads_sum, grads)
        return (loss_sum + value, grads_sum), stats

    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    init = (jnp.zeros((), jnp.float32), zeros)
    (value, grads), stats = jax.lax.scan(body, init, rows)
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
    _, metrics = terms_fn(jax.tree.map(merge_rows, stats), batch)
    return value, grads, metric_values(metrics)


def split_rows(x_r: jax.Array, n: int) -> jax.Array:
    """[R, ...] -> [n, R / n, ...]: microbatch i holds rows i, i + n, i + 2n, ..."""
    return jnp.swapaxes(x_r.reshape(x_r.shape[0] // n, n, *x_r.shape[1:]), 0, 1)


def merge_rows(x_nm: jax.Array) -> jax.Array:
    """[n, R / n, ...] -> [R, ...], the inverse of :func:`split_rows`."""
    return jnp.swapaxes(x_nm, 0, 1).reshape(-1, *x_nm.shape[2:])


# ---------------------------------------------------------------- the optimizer step


def all_finite(tree) -> jax.Array:
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.asarray(True)


def apply_update(tx, loss_value, grads, params, opt_state, finite=None):
    """One optimizer update, skipped (params and moments kept) when anything is non-finite.

    Returns (params, opt_state, finite as float32, the gradients' global norm).
    """
    if finite is None:
        finite = jnp.isfinite(loss_value) & all_finite(grads)
    gnorm = optax.global_norm(grads)
    safe_grads = jax.tree.map(lambda g: jnp.where(finite, g, jnp.zeros_like(g)), grads)
    updates, new_opt = tx.update(safe_grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    keep = lambda new, old: jnp.where(finite, new, old)  # noqa: E731
    new_params = jax.tree.map(keep, new_params, params)
    new_opt = jax.tree.map(keep, new_opt, opt_state)
    return new_params, new_opt, finite.astype(jnp.float32), gnorm
