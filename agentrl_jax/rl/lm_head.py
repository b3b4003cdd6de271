"""Per-token log-probs and entropies through the LM head without [B, T, V] logits.

With Qwen2.5's 151,936-token vocabulary, float32 logits of a [B, T] batch (and the log-softmax
and gradient of the same size) dominate the learner's memory. :func:`token_stats` instead runs
the final hidden states through the head in chunks of ``chunk`` positions (``lax.scan``), each
chunk's body under ``jax.checkpoint``: the forward pass keeps only [B, T] results, and the
backward pass recomputes one chunk's [B, chunk, V] logits at a time instead of storing them.

Constrained decoding (``allowed``) normalises over the chunk's K gathered allowed logits, so no
[B, T, V] mask is built either. The numbers are those of masking every other logit to -inf
(:func:`mask_to_allowed`) before the softmax; :func:`token_logprobs` is the plain formula of the
log-probs.

Alignment, as everywhere in the learner: column t scores token t with the logits at t - 1 (and
the allowed set of token t); column 0, which nothing predicts, is 0.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

# Masked logits: finite, so entropies stay finite (p * log p = 0 * -1e30 = 0), and far enough
# below any real logit that exp underflows to exactly 0, as the sampler's -inf does.
MASKED_LOGIT = -1e30


class TokenStats(NamedTuple):
    """Per-token quantities of the (temperature-scaled, constrained) next-token distribution.

    Attributes:
      logprobs: [B, T] float32 log pi(tokens[t] | tokens[<t]); column 0 is 0.
      entropy: [B, T] float32 entropy (nats) of the distribution token t was drawn from;
        column 0 is 0.
      lse: [B, T] float32 log-sum-exp of the logits token t was drawn from (over the allowed ids
        when constrained); column 0 is 0.
    """

    logprobs: jax.Array
    entropy: jax.Array
    lse: jax.Array


def token_stats(
    logits_fn: Callable[[jax.Array], jax.Array],
    hidden_btd: jax.Array,
    tokens_bt: jax.Array,
    *,
    temperature: float = 1.0,
    allowed_btk: jax.Array | None = None,
    chunk: int = 256,
) -> TokenStats:
    """Log-probs, entropies and log-sum-exps of ``tokens`` from hidden states, chunk by chunk.

    Args:
      logits_fn: the LM head, [B, C, D] hidden states -> [B, C, V] float32 logits (e.g.
        ``policy.logits``); called on one chunk at a time, and again in the backward pass.
      hidden_btd: [B, T, D] final hidden states (``policy.trunk(tokens)[0]``).
      tokens_bt: [B, T] int token ids; token t is scored by the logits at t - 1.
      temperature: the logits are divided by it (static; 1.0 leaves them as they are).
      allowed_btk: [B, T, K] int ids token t could be drawn from, -1 padded (duplicates count
        once, ids outside [0, V) none); a position without any keeps the whole vocabulary.
        None: unconstrained.
      chunk: positions per head call (static); the last chunk is padded.

    Returns:
      TokenStats of [B, T] float32 arrays, column 0 zero.
    """
    if chunk < 1:
        raise ValueError(f"token_stats chunk={chunk}: expected >= 1")
    b, t = tokens_bt.shape
    n = t - 1  # positions that predict a token
    if n < 1:
        zeros_bt = jnp.zeros((b, t), jnp.float32)
        return TokenStats(zeros_bt, zeros_bt, zeros_bt)
    c = min(chunk, n)
    num_chunks = -(-n // c)
    pad = num_chunks * c - n

    def chunked(x, fill):
        """[B, n, ...] -> [num_chunks, B, c, ...], the tail padded with ``fill``."""
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2), constant_values=fill)
        x = x.reshape(b, num_chunks, c, *x.shape[2:])
        return jnp.moveaxis(x, 1, 0)

    # Position i predicts token i + 1 from the logits at i, under token i + 1's allowed set.
    hidden_nbcd = chunked(hidden_btd[:, :-1], 0)
    targets_nbc = chunked(tokens_bt[:, 1:], 0)
    if allowed_btk is None:
        allowed_btk = jnp.full((b, t, 0), -1, jnp.int32)
    allowed_nbck = chunked(allowed_btk[:, 1:], -1)

    @jax.checkpoint
    def stats(h_bcd, target_bc, ids_bck):
        logits_bcv = logits_fn(h_bcd).astype(jnp.float32)
        if temperature != 1.0:
            logits_bcv = logits_bcv / temperature
        target_bc1 = target_bc[..., None]
        z_target_bc = jnp.take_along_axis(logits_bcv, target_bc1, axis=-1)[..., 0]
        lp, ent, lse = _normalise(logits_bcv, z_target_bc)
        if ids_bck.shape[-1]:
            # The distinct allowed ids: sorted, each kept where it differs from its predecessor.
            ids_bck = jnp.sort(ids_bck, axis=-1)
            new_bck = ids_bck[..., 1:] != ids_bck[..., :-1]
            new_bck = jnp.pad(new_bck, ((0, 0), (0, 0), (1, 0)), constant_values=True)
            valid_bck = (ids_bck >= 0) & (ids_bck < logits_bcv.shape[-1]) & new_bck
            gathered_bck = jnp.take_along_axis(logits_bcv, ids_bck, axis=-1, mode="clip")
            z_bck = jnp.where(valid_bck, gathered_bck, MASKED_LOGIT)
            # A target outside its allowed set has a masked logit, as under a full mask.
            in_set_bc = jnp.any(valid_bck & (ids_bck == target_bc1), axis=-1)
            z_target_k_bc = jnp.where(in_set_bc, z_target_bc, MASKED_LOGIT)
            lp_k, ent_k, lse_k = _normalise(z_bck, z_target_k_bc)
            constrained_bc = jnp.any(valid_bck, axis=-1)
            lp = jnp.where(constrained_bc, lp_k, lp)
            ent = jnp.where(constrained_bc, ent_k, ent)
            lse = jnp.where(constrained_bc, lse_k, lse)
        return lp, ent, lse

    def body(carry, xs):
        return carry, stats(*xs)

    _, out_3nbc = jax.lax.scan(body, None, (hidden_nbcd, targets_nbc, allowed_nbck))

    def unchunk(x_nbc):
        x_bn = jnp.moveaxis(x_nbc, 0, 1).reshape(b, num_chunks * c)[:, :n]
        return jnp.pad(x_bn, ((0, 0), (1, 0)))

    return TokenStats(*(unchunk(x) for x in out_3nbc))


def _normalise(z_bcv: jax.Array, z_target_bc: jax.Array):
    """(log-prob of the target, entropy, log-sum-exp) of softmax over the last axis of ``z``.

    The same formulas as ``jax.nn.log_softmax`` and ``kernels.entropy_from_logits``: everything
    is shifted by the (gradient-stopped) max, which keeps exp and the entropy's terms small.
    """
    m_bc1 = jax.lax.stop_gradient(jnp.max(z_bcv, axis=-1, keepdims=True))
    s_bcv = z_bcv - m_bc1
    e_bcv = jnp.exp(s_bcv)
    total_bc = jnp.sum(e_bcv, axis=-1)
    log_total_bc = jnp.log(total_bc)
    logprob_bc = (z_target_bc - m_bc1[..., 0]) - log_total_bc
    entropy_bc = log_total_bc - jnp.sum(e_bcv * s_bcv, axis=-1) / total_bc
    return logprob_bc, entropy_bc, m_bc1[..., 0] + log_total_bc


# ---------------------------------------------------------------- the plain formulas
#
# What token_stats computes, from full [B, T, V] logits: the reference the tests hold it to.


def token_logprobs(logits_btv: jax.Array, tokens_bt: jax.Array) -> jax.Array:
    """[B, T] log pi(tokens[t] | tokens[<t]) from logits [B, T, V]; column 0 is 0."""
    logp_btv = jax.nn.log_softmax(logits_btv[:, :-1].astype(jnp.float32), axis=-1)
    taken = jnp.take_along_axis(logp_btv, tokens_bt[:, 1:, None], axis=-1)[..., 0]
    return jnp.pad(taken, ((0, 0), (1, 0)))


def mask_to_allowed(logits_btv: jax.Array, allowed_btk: jax.Array) -> jax.Array:
    """Masks the logits at t - 1 (which predict token t) to the ids ``allowed[:, t]``.

    Args:
      logits_btv: [B, T, V] logits.
      allowed_btk: [B, T, K] int32 ids token t could be drawn from, -1 padded; a position whose
        ids are all -1 keeps the whole vocabulary.
    """
    b, t, v = logits_btv.shape
    # The set for token t applies to the logits at t - 1; the last position predicts nothing.
    ids_btk = jnp.pad(allowed_btk[:, 1:], ((0, 0), (0, 1), (0, 0)), constant_values=-1)
    keep_btv = (
        jnp.zeros((b, t, v), jnp.bool_)
        .at[
            jnp.arange(b)[:, None, None],
            jnp.arange(t)[None, :, None],
            jnp.where(ids_btk >= 0, ids_btk, v),
        ]
        .set(True, mode="drop")
    )
    constrained_bt = jnp.any(ids_btk >= 0, axis=-1)
    return jnp.where(constrained_bt[..., None] & ~keep_btv, MASKED_LOGIT, logits_btv)
