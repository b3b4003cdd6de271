"""One turn of generation as a pure function: prefill the new tokens, then a while_loop decode.

``run_turn(graphdef, state, cache, chunk_bt, num_new_b, max_new_b, rng)`` is what
``Sampler`` jits (once per shape bucket and sampling setting). Per row b:

1. Prefill: the right-padded chunk's ``num_new_b[b]`` tokens are appended after the row's cached
   history in one forward pass; its last valid position gives the next-token logits.
2. Decode (``lax.while_loop``): each iteration draws a token for every row still generating
   and feeds it straight back through the model (one token per row; finished rows feed
   nothing), which writes its keys/values and gives the next logits. A row stops on EOS, on a
   stop sequence or at ``max_new_b[b]`` tokens; the loop ends when every row has stopped.
   Because a drawn token is fed in the same iteration, the final token is in the cache too:
   after the turn the cache holds the whole conversation, ``cache.lengths`` is its length, and
   the next turn prefills only the environment's reply. (The logits of the very last feed are
   unused; that one extra single-token step buys a next turn with no pending-token bookkeeping
   and no chunk padded one past its bucket.)
3. Rows with ``num_new_b[b] == 0`` are inactive: nothing is written to their cache slots and
   their length does not move (the model drops writes of padding positions).

Choices (constrained decoding): a row given ``choices_bcl[b]`` (C token sequences, -1 padded,
each ending with the stop token) can only generate one of them. Before each draw the logits of
every token that no choice consistent with the row's tokens so far continues with are set to
-inf, so both log-probs are of that masked distribution; the token ids each draw allowed are
returned (``TurnArrays.allowed``) so a learner can normalise over exactly the same set.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from agentrl_jax.models import registry
from agentrl_jax.models.kv_cache import KVCache
from agentrl_jax.sampling.logits import draw, fold_in
from agentrl_jax.sampling.params import DoneReason, SamplingParams, StopConfig


@flax.struct.dataclass
class TurnArrays:
    """What one turn generated, padded to the turn's new-token width W.

    Attributes:
      tokens: [B, W] int32 generated ids; ``pad_id`` at and beyond ``lengths[b]``.
      logprobs: [B, W] float32 log-probs under the processed (sampled-from) distribution.
      policy_logprobs: [B, W] float32 log-probs under the raw policy at temperature 1.
      lengths: [B] int32 tokens generated per row.
      done_reason: [B] int32 ``DoneReason`` per row.
      allowed: [B, W, C] int32 the distinct token ids the draw of each generated token was
        restricted to, -1 padded; all -1 for a row without choices (the whole vocabulary).
        C is 0 when the turn had no choices at all.
    """

    tokens: jax.Array
    logprobs: jax.Array
    policy_logprobs: jax.Array
    lengths: jax.Array
    done_reason: jax.Array
    allowed: jax.Array


@flax.struct.dataclass
class _Carry:
    step: jax.Array  # [] int32 decode iterations done
    cache: KVCache  # the episode's cache, written in place
    logits_bv: jax.Array  # [B, V] float32 next-token logits after the row's last fed token
    last_b: jax.Array  # [B] int32 the row's last drawn token
    unfed_b: jax.Array  # [B] bool the row drew last_b this iteration: feed it to the model
    done_b: jax.Array  # [B] bool the row draws no more tokens this turn
    alive_bc: jax.Array  # [B, C] bool choice c matches every token the row drew so far
    out: TurnArrays


def run_turn(
    graphdef: nnx.GraphDef,
    state: nnx.State,
    cache: KVCache,
    chunk_bt: jax.Array,
    num_new_b: jax.Array,
    max_new_b: jax.Array,
    rng: jax.Array,
    choices_bcl: jax.Array | None = None,
    share: tuple[jax.Array, jax.Array] | None = None,
    *,
    width: int,
    sampling: SamplingParams,
    stop: StopConfig,
    pad_id: int,
) -> tuple[TurnArrays, KVCache]:
    """Appends a chunk of new tokens to each row and generates up to ``max_new_b`` tokens.

    Args:
      graphdef, state: ``nnx.split`` of a ``CausalLM``.
      cache: the episode's cache; rows hold their conversation so far in ``[0, lengths[b])``,
        and it has ``lengths + num_new + max_new`` slots allocated (``KVCache.with_slots``).
      chunk_bt: [B, T] int32 new tokens, right-padded.
      num_new_b: [B] int32 valid tokens in each chunk row (0: the row is inactive).
      max_new_b: [B] int32 tokens to generate per row, <= width (the caller checked that the
        cache has room for ``lengths + num_new + max_new`` tokens).
      rng: PRNG key for this turn, or [B] keys, one per row (``logits.draw``).
      choices_bcl: None, or [B, C, L] int32 (L >= 1) the sequences each row may generate,
        -1 padded; a row whose choices are all -1 is unconstrained.
      share: group prefix sharing: None, or ``(unique_u, source_b)`` [U], [B] int32: only rows
        ``unique_u`` are prefilled, and row b continues from the prefill of row
        ``source_b[b]`` (the caller checked that the two rows' histories and chunks are equal).
      width: static output width W.
      sampling, stop, pad_id: static settings.

    Returns:
      (TurnArrays, the cache with the chunk and every generated token appended).
    """
    b = chunk_bt.shape[0]
    rows_b = jnp.arange(b)
    active_b = num_new_b > 0
    max_new_b = jnp.where(active_b, max_new_b, 0)
    eos_e = jnp.asarray(stop.eos_ids, jnp.int32)
    stop_qw, stop_len_q = (jnp.asarray(a) for a in stop.stop_table())

    num_choices = 0 if choices_bcl is None else choices_bcl.shape[1]
    if num_choices:
        constrained_b = jnp.any(choices_bcl[:, :, 0] >= 0, axis=1)

    def record(carry: _Carry, logits_bv: jax.Array, key: jax.Array) -> _Carry:
        """Draws a token for every row still generating and checks its stop conditions."""
        drawing_b = ~carry.done_b
        out = carry.out
        alive_bc = carry.alive_bc
        if num_choices:
            # The next token of every choice still consistent with what the row drew.
            pos_b = jnp.minimum(out.lengths, choices_bcl.shape[2] - 1)
            next_bc = jnp.take_along_axis(choices_bcl, pos_b[:, None, None], axis=2)[..., 0]
            next_bc = jnp.where(out.lengths[:, None] < choices_bcl.shape[2], next_bc, -1)
            valid_bc = alive_bc & (next_bc >= 0)
            # A row whose choices are spent (none continues) draws unconstrained.
            limit_b = constrained_b & jnp.any(valid_bc, axis=1)
            vocab = logits_bv.shape[-1]
            allowed_bv = (
                jnp.zeros(logits_bv.shape, jnp.bool_)
                .at[rows_b[:, None], jnp.where(valid_bc, next_bc, vocab)]
                .set(True, mode="drop")
            )
            logits_bv = jnp.where(limit_b[:, None] & ~allowed_bv, -jnp.inf, logits_bv)
            # The distinct allowed ids (the first choice holding each one), -1 elsewhere.
            same_bcc = (next_bc[:, :, None] == next_bc[:, None, :]) & valid_bc[:, None, :]
            earlier_cc = jnp.tril(jnp.ones((num_choices, num_choices), jnp.bool_), k=-1)
            first_bc = valid_bc & ~jnp.any(same_bcc & earlier_cc[None], axis=2)
            ids_bc = jnp.where(first_bc & limit_b[:, None], next_bc, -1)
        tok_b, lp_b, plp_b = draw(key, logits_bv, sampling)
        # Rows not drawing write to column W (out of bounds), which is dropped.
        col_b = jnp.where(drawing_b, out.lengths, width)
        tokens = out.tokens.at[rows_b, col_b].set(tok_b, mode="drop")
        lengths = out.lengths + drawing_b
        eos_b = drawing_b & jnp.isin(tok_b, eos_e) if stop.eos_ids else jnp.zeros_like(drawing_b)
        stop_b = drawing_b & _ends_with_stop(tokens, lengths, stop_qw, stop_len_q)
        full_b = drawing_b & (lengths >= max_new_b)
        reason_b = jnp.where(
            eos_b,
            DoneReason.EOS,
            jnp.where(stop_b, DoneReason.STOP_SEQUENCE, out.done_reason),
        ).astype(jnp.int32)
        allowed = out.allowed
        if num_choices:
            allowed = allowed.at[rows_b, col_b].set(ids_bc, mode="drop")
            alive_bc = alive_bc & ~(drawing_b[:, None] & (next_bc != tok_b[:, None]))
        out = TurnArrays(
            tokens=tokens,
            logprobs=out.logprobs.at[rows_b, col_b].set(lp_b, mode="drop"),
            policy_logprobs=out.policy_logprobs.at[rows_b, col_b].set(plp_b, mode="drop"),
            lengths=lengths,
            done_reason=reason_b,
            allowed=allowed,
        )
        return carry.replace(
            last_b=jnp.where(drawing_b, tok_b, carry.last_b),
            unfed_b=drawing_b,
            done_b=carry.done_b | eos_b | stop_b | full_b,
            alive_bc=alive_bc,
            out=out,
        )

    # Prefill: one forward pass over the chunk; only the last valid position needs logits.
    # A scanned model's stacked layer parameters are sliced into per-layer arrays once per turn:
    # the decode loop then reads each layer's weights in place.
    model = nnx.merge(graphdef, state)
    model = registry.family(model.cfg).unroll_layers(model)
    graphdef, state = nnx.split(model)
    if share is None:
        hidden_b1d, cache = model.trunk(chunk_bt, cache=cache, num_new_b=num_new_b, last_only=True)
        logits_bv = model.logits(hidden_b1d)[:, 0]
    else:
        # Only the distinct prefixes (rows unique_u) are prefilled; every row then continues
        # from its source row's cache and logits.
        unique_u, source_b = share
        num_new_u = num_new_b[unique_u]
        hidden_u1d, prefilled = model.trunk(
            chunk_bt[unique_u], cache=cache.gather(unique_u), num_new_b=num_new_u, last_only=True
        )
        logits_uv = model.logits(hidden_u1d)[:, 0]
        cache, logits_bv = prefilled.gather(source_b), logits_uv[source_b]
    reason_b = jnp.where(active_b, DoneReason.MAX_NEW_TOKENS, DoneReason.INACTIVE)
    carry = _Carry(
        step=jnp.zeros((), jnp.int32),
        cache=cache,
        logits_bv=logits_bv,
        last_b=jnp.zeros((b,), jnp.int32),
        unfed_b=jnp.zeros((b,), jnp.bool_),
        done_b=max_new_b <= 0,
        alive_bc=jnp.ones((b, num_choices), jnp.bool_),
        out=TurnArrays(
            tokens=jnp.full((b, width), pad_id, jnp.int32),
            logprobs=jnp.zeros((b, width), jnp.float32),
            policy_logprobs=jnp.zeros((b, width), jnp.float32),
            lengths=jnp.zeros((b,), jnp.int32),
            done_reason=reason_b.astype(jnp.int32),
            allowed=jnp.full((b, width, num_choices), -1, jnp.int32),
        ),
    )

    def cond(carry: _Carry) -> jax.Array:
        # A row draws at most max_new_b <= width tokens, one per iteration, so the bound on
        # step is a guard that is never reached.
        return jnp.any(~carry.done_b) & (carry.step < width)

    def body(carry: _Carry) -> _Carry:
        # Draw for the rows still generating, then feed the drawn tokens right away: a row
        # that just finished has its last token written to the cache in this same step.
        carry = record(carry, carry.logits_bv, fold_in(rng, carry.step))
        model = nnx.merge(graphdef, state)
        logits_b1v, cache = model(
            carry.last_b[:, None], cache=carry.cache, num_new_b=carry.unfed_b.astype(jnp.int32)
        )
        return carry.replace(step=carry.step + 1, cache=cache, logits_bv=logits_b1v[:, 0])

    carry = jax.lax.while_loop(cond, body, carry)
    return carry.out, carry.cache


def prefill_starts(
    graphdef: nnx.GraphDef,
    state: nnx.State,
    cache: KVCache,
    chunk_ut: jax.Array,
    num_new_u: jax.Array,
    source_b: jax.Array,
) -> KVCache:
    """The start prefill: U new conversations prefilled on their own, then given to their rows.

    Continuous batching starts a group's conversations in a turn where other rows are midway
    through theirs; prefilled there, every row of the batch would pay for the longest first
    prompt. Here only the distinct prompts are run (one row each, on an empty cache of the
    batch's slots), and each row that starts from one takes its keys, values and length; the
    turn then feeds the row the prompt's last token (``Sampler.step_turn(..., shapes=...)``).

    Args:
      graphdef, state: ``nnx.split`` of a ``CausalLM``.
      cache: the batch's cache; the rows that start are empty (their length is 0).
      chunk_ut: [U, T] int32 the distinct prompts, right-padded.
      num_new_u: [U] int32 valid tokens of each prompt (0: a padding row, never read).
      source_b: [B] int32 the prompt each row starts from; -1: the row is left as it is.

    Returns:
      The cache with each starting row holding its prompt.
    """
    model = nnx.merge(graphdef, state)
    model = registry.family(model.cfg).unroll_layers(model)
    u = chunk_ut.shape[0]
    empty = jax.tree.map(lambda x: jnp.zeros((u, *x.shape[1:]), x.dtype), cache)
    _, filled = model.trunk(chunk_ut, cache=empty, num_new_b=num_new_u, last_only=True)
    take_b = source_b >= 0
    from_b = jnp.maximum(source_b, 0)

    def pick(new, old):
        take = take_b.reshape((-1,) + (1,) * (old.ndim - 1))
        return jnp.where(take, new[from_b], old)

    return jax.tree.map(pick, filled, cache)


def _ends_with_stop(
    tokens_bw: jax.Array, lengths_b: jax.Array, stop_qw: jax.Array, stop_len_q: jax.Array
) -> jax.Array:
    """[B] bool: the first ``lengths_b`` generated tokens end with one of the stop sequences."""
    q, w = stop_qw.shape
    if q == 0:
        return jnp.zeros(lengths_b.shape, jnp.bool_)
    cols_bw = lengths_b[:, None] - w + jnp.arange(w)[None]
    tail_bw = jnp.take_along_axis(tokens_bw, jnp.clip(cols_bw, 0, tokens_bw.shape[1] - 1), axis=1)
    tail_bw = jnp.where(cols_bw >= 0, tail_bw, -2)  # before the turn's first token: no match
    match_bqw = (stop_qw[None] == -1) | (tail_bw[:, None, :] == stop_qw[None])
    long_enough_bq = lengths_b[:, None] >= stop_len_q[None]
    return jnp.any(jnp.all(match_bqw, axis=-1) & long_enough_bq, axis=-1)
