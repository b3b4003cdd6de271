"""The high-level sampler the trainer and the demos call: episodes, turns, buckets, checks.

See ``agentrl_jax.sampling`` for the API overview and ``loop.run_turn`` for what a turn does.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from agentrl_jax import sharding
from agentrl_jax.models.kv_cache import KVCache
from agentrl_jax.sampling import buckets as bk
from agentrl_jax.sampling.logits import as_typed_key
from agentrl_jax.sampling.loop import TurnArrays, prefill_starts, run_turn
from agentrl_jax.sampling.params import SamplingParams, StopConfig

_DEFAULT_SAMPLING = SamplingParams()
_NO_STOP = StopConfig()


@flax.struct.dataclass
class TurnOutput:
    """One turn's generations and the episode's cache after it.

    Attributes:
      tokens: [B, W] int32 generated ids, ``pad_id`` at and beyond ``lengths[b]``; W is the
        turn's bucketed new-token width (>= every row's max_new_tokens).
      logprobs: [B, W] float32 log-probs under the processed distribution actually sampled from
        (temperature, top-k, top-p; 0 for greedy). 0 beyond ``lengths[b]``.
      policy_logprobs: [B, W] float32 log-probs under the raw policy, log_softmax(logits) at
        temperature 1 (what a teacher-forced forward pass gives). 0 beyond ``lengths[b]``.
      lengths: [B] int32 tokens generated per row this turn.
      done_reason: [B] int32 ``DoneReason`` per row.
      allowed: [B, W, C] int32 with ``choices``: the distinct ids each draw was restricted to
        (-1 padded; all -1 for an unconstrained row). C is 0 for a turn without choices.
      cache: the episode's KVCache holding the whole conversation so far (every generated
        token included); pass it to the next ``step_turn``.
    """

    tokens: jax.Array
    logprobs: jax.Array
    policy_logprobs: jax.Array
    lengths: jax.Array
    done_reason: jax.Array
    cache: KVCache
    allowed: jax.Array | None = None

    def token_lists(self) -> list[list[int]]:
        """The generated ids per row on the host, without padding."""
        tokens, lengths = np.asarray(self.tokens), np.asarray(self.lengths)
        return [tokens[b, : lengths[b]].tolist() for b in range(tokens.shape[0])]

    def allowed_lists(self) -> list[list[list[int]] | None]:
        """Per row, per generated token, the ids its draw was restricted to (None: any id)."""
        b = int(self.tokens.shape[0])
        if self.allowed is None or self.allowed.shape[2] == 0:
            return [None] * b
        allowed, lengths = np.asarray(self.allowed), np.asarray(self.lengths)
        out = []
        for r in range(b):
            ids = [[int(i) for i in a if i >= 0] for a in allowed[r, : lengths[r]]]
            out.append(ids if any(ids) else None)
        return out


@dataclasses.dataclass
class TurnShapes:
    """Shape floors of one batch's turns: ``step_turn(..., shapes=...)`` runs every turn at
    least this large, and raises the floors to what it ran.

    Continuous batching's cohorts (``rollout.batching="continuous"``) play rows that stand at
    different turns of different episodes, together in an order set by when each env answers.
    A turn sized to its own rows (the default) would then compile a program for each new mix
    of chunk length, width and choice count, and which mixes a play meets depends on the order
    of the replies. Floors that only grow size each turn by the largest of every row it has run
    so far: once a play has run every row of its episodes, the next play of them runs that one
    program, in whatever order the replies come (each field is a maximum over rows, and the
    rows are the same episodes).

    Attributes:
      chunk: new-token chunk length of the turn program (a chunk bucket; 0: none yet).
      width: output width, the largest ``max_new_tokens`` (a width bucket).
      choices: choices per row (a count bucket; 0: no constrained row yet).
      starts: rows of the start prefill, the distinct new conversations one turn prefills
        before it decodes (a count bucket). Set it up front to the most a turn can hold (a
        cohort's groups), or it grows with the most that ever started together.
      start_chunk: the start prefill's chunk length (a chunk bucket).
    """

    chunk: int = 0
    width: int = 0
    choices: int = 0
    starts: int = 0
    start_chunk: int = 0


class Sampler:
    """Jitted multi-turn generation over a KV cache kept between turns.

    Args:
      model: a ``CausalLM`` or its ``nnx.split`` pair ``(graphdef, state)``.
      sampling: the default sampling settings (a ``step_turn`` may override them).
      stop: EOS ids and stop sequences.
      pad_id: the id written after each row's generated tokens in ``TurnOutput.tokens``.
      chunk_buckets: allowed lengths of a turn's new-token chunk (default: powers of two and
        their midpoints from 16).
      cache_buckets: allowed cache sizes (default: the same rule from 64).
      width_buckets: allowed widths of a turn's output, i.e. its largest max_new_tokens
        (default: the same rule from 1).
      mesh: the device mesh the policy is sharded on (``agentrl_jax.sharding``); caches are
        then created sharded by its rules (batch over data and fsdp, kv heads over tp) and each
        turn is traced under the mesh. None: everything on the default device.
      share_prefixes: group prefix sharing. Rows that start a conversation (empty cache row)
        with the same tokens, such as the G rollouts of one task, are prefilled once and every
        one of them continues from that one prefill.

    Attributes:
      num_traces: compilations of the turn programs so far, the start prefill's included
        (tests and ``launch.bench rollout`` count them).
      prefilled_rows: rows prefilled so far, counted once per distinct shared prefix.
    """

    def __init__(
        self,
        model: nnx.Module | tuple[nnx.GraphDef, nnx.State],
        *,
        sampling: SamplingParams = _DEFAULT_SAMPLING,
        stop: StopConfig = _NO_STOP,
        pad_id: int = 0,
        chunk_buckets: Sequence[int] | None = None,
        cache_buckets: Sequence[int] | None = None,
        width_buckets: Sequence[int] | None = None,
        mesh: Mesh | None = None,
        share_prefixes: bool = True,
    ):
        if isinstance(model, nnx.Module):
            self.cfg = model.cfg
            self.graphdef, self.state = nnx.split(model)
        else:
            self.graphdef, self.state = model
            self.cfg = nnx.merge(self.graphdef, self.state).cfg
        self.sampling = sampling
        self.stop = stop
        self.mesh = mesh
        self.pad_id = int(pad_id)
        self.chunk_buckets = bk.check_buckets(
            chunk_buckets or bk.default_buckets(16), what="chunk_buckets"
        )
        self.cache_buckets = bk.check_buckets(
            cache_buckets or bk.default_buckets(64), what="cache_buckets"
        )
        self.width_buckets = bk.check_buckets(
            width_buckets or bk.default_buckets(1), what="width_buckets"
        )
        # Incremented each time a turn function is traced, i.e. compiled for a new shape bucket
        # or setting; tests assert on it to catch recompiles.
        self.num_traces = 0
        self.share_prefixes = share_prefixes
        self.prefilled_rows = 0
        self._jitted: dict[tuple, object] = {}
        self._owned = False  # the weights are the caller's (see set_state)

    @property
    def platform(self) -> str:
        """Where the turns run ("cpu", "tpu", "gpu"): the mesh's devices', else JAX's default
        backend. The cache's key layout follows it (``KVCache``)."""
        if self.mesh is None:
            return jax.default_backend()
        return self.mesh.devices.flat[0].platform

    def set_state(self, state: nnx.State, *, owned: bool = False) -> None:
        """Swaps in new weights (same structure, shapes and dtypes: no recompilation).

        ``owned``: the state is the sampler's own copy (e.g. ``multihost.local_copy``), which
        nothing else refers to, so ``release`` may delete its arrays; by default the arrays are
        someone else's (the train state's) and are only dropped.
        """
        self.state = state
        self._owned = owned

    def release(self) -> None:
        """Lets go of the weights before new ones are built: deletes an owned copy's arrays
        (their device memory is free when this returns), drops a borrowed one.

        The sampler has no weights until the next ``set_state``.
        """
        if self._owned and self.state is not None:
            for x in jax.tree.leaves(self.state):
                x.delete()
        self.state = None
        self._owned = False

    def start(self, batch: int, cache_size: int, *, all_slots: bool = False) -> KVCache:
        """An empty cache for ``batch`` episodes of up to ``cache_size`` tokens each.

        ``cache_size`` is rounded up to a cache bucket so episodes of similar length share
        compilations. It must hold every episode's prompts and actions of all turns. Slots are
        allocated as the conversations grow (``step_turn``), a power of two at a time; with
        ``all_slots`` all of them at once (the one cache shape of turns run with ``shapes``).
        """
        if batch < 1:
            raise ValueError(f"batch={batch}: expected >= 1")
        size = bk.round_up(cache_size, self.cache_buckets, what="cache_size")
        slots = size if all_slots else min(self.cache_buckets[0], size)
        key = ("start", batch, size, slots)
        if key not in self._jitted:
            create = functools.partial(
                KVCache.create, self.cfg, batch, size, slots=slots, platform=self.platform
            )
            # One program makes every layer's arrays; on a mesh, in place, each device holding
            # only its shard.
            shardings = None
            if self.mesh is not None:
                shardings = sharding.kv_cache_shardings(jax.eval_shape(create), self.mesh)
            self._jitted[key] = jax.jit(create, out_shardings=shardings)
        return self._jitted[key]()

    def abstract_cache(self, batch: int, cache_size: int) -> KVCache:
        """A cache ``start`` makes, as ``jax.ShapeDtypeStruct`` (with shardings on a mesh), with
        every slot allocated: the cache of the longest turn."""
        size = bk.round_up(cache_size, self.cache_buckets, what="cache_size")
        abstract = jax.eval_shape(
            functools.partial(KVCache.create, self.cfg, batch, size, platform=self.platform)
        )
        if self.mesh is None:
            return abstract
        return jax.tree.map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
            abstract,
            sharding.kv_cache_shardings(abstract, self.mesh),
        )

    def lower_turn(
        self,
        cache: KVCache,
        chunk_len: int,
        max_new_tokens: int,
        *,
        sampling: SamplingParams | None = None,
        num_choices: int = 0,
    ) -> jax.stages.Lowered:
        """The turn program ``step_turn`` runs for these shapes, lowered without running it.

        Args:
          cache: the cache, real or abstract (``abstract_cache``): only shapes and shardings
            are read, as of the sampler's state. The turn attends over its allocated slots.
          chunk_len: new prompt tokens per row (rounded up to a chunk bucket).
          max_new_tokens: tokens to generate (rounded up to a width bucket).
          sampling: as in ``step_turn``.
          num_choices: constrained decoding: choices per row (rounded up to a count bucket), or
            0 for free decoding.

        Returns:
          ``jax.stages.Lowered``; ``.compile().memory_analysis()`` gives its per-device bytes.
        """
        b = cache.batch
        width = bk.round_up(max(max_new_tokens, 1), self.width_buckets, what="max_new_tokens")
        chunk = bk.round_up(max(chunk_len, 1), self.chunk_buckets, what="prompt chunk length")
        choices = None
        if num_choices:
            count = bk.round_up(num_choices, bk.COUNT_BUCKETS, what="choices per row")
            choices = jax.ShapeDtypeStruct((b, count, width), jnp.int32)
        rows = lambda *shape: jax.ShapeDtypeStruct((b, *shape), jnp.int32)  # noqa: E731
        fn = self._turn_fn(sampling or self.sampling, width, False)
        # One key per row, as rollouts pass them (``rollout.episode_keys``).
        rng = jax.eval_shape(lambda: jax.random.split(jax.random.key(0), b))
        with sharding.mesh_context(self.mesh):
            return fn.lower(self.state, cache, rows(chunk), rows(), rows(), rng, choices, None)

    def grow(self, cache: KVCache, cache_size: int) -> KVCache:
        """``cache`` with room for ``cache_size`` tokens per row (rounded up to a bucket).

        Only the reservation changes: slots are allocated when a turn needs them.
        """
        size = bk.round_up(cache_size, self.cache_buckets, what="cache_size")
        if size < cache.size:
            raise ValueError(
                f"grow: cache_size={cache_size} is smaller than the cache ({cache.size})"
            )
        return cache.replace(capacity=size)

    def clear_rows(self, cache: KVCache, rows: Sequence[int]) -> KVCache:
        """``cache`` with ``rows`` emptied (length 0) for new conversations; the other rows
        are untouched. A row's old keys and values stay in its slots, unread: attention reads
        a row's first ``lengths`` slots, and the new conversation overwrites them."""
        lengths = np.array(cache.lengths)
        lengths[np.asarray(rows, np.int64)] = 0
        return cache.replace(lengths=jax.device_put(lengths, cache.lengths.sharding))

    def _allocate(self, cache: KVCache, need: int) -> KVCache:
        """``cache`` with at least ``need`` slots allocated: the next power of two (at least the
        first cache bucket, at most the reserved size), or the cache itself when it has them.

        Each allocated size is a compilation of the turn; a turn's decode steps read the
        allocated slots, so they cost about what the conversation fills.
        """
        slots = min(max(1 << (max(need, 1) - 1).bit_length(), self.cache_buckets[0]), cache.size)
        if slots <= cache.slots:
            return cache
        key = ("allocate", slots)
        if key not in self._jitted:

            def allocate(cache: KVCache) -> KVCache:
                grown = cache.with_slots(slots)
                if self.mesh is None:
                    return grown
                layout = sharding.kv_cache_shardings(grown, self.mesh)
                return jax.lax.with_sharding_constraint(grown, layout)

            # Not donated: the grown arrays are larger, so XLA could not reuse the old ones.
            self._jitted[key] = jax.jit(allocate)
        return self._jitted[key](cache)

    def step_turn(
        self,
        cache: KVCache,
        new_tokens: Sequence[Sequence[int]],
        max_new_tokens: int | Sequence[int],
        rng: jax.Array,
        *,
        sampling: SamplingParams | None = None,
        choices: Sequence[Sequence[Sequence[int]] | None] | None = None,
        shapes: TurnShapes | None = None,
    ) -> TurnOutput:
        """Appends each row's new tokens to its conversation and generates its next action.

        Args:
          cache: the episode's cache from ``start`` or the previous turn's ``TurnOutput.cache``.
            It is donated: do not use it after this call (use the returned one).
          new_tokens: B sequences of token ids: the first prompt, or the environment's reply
            after the previous action (the action itself is already in the cache). A row with no
            new tokens is inactive this turn: its cache is untouched and it generates nothing.
          max_new_tokens: tokens to generate, for all rows or per row (0: only prefill).
          rng: PRNG key for this turn (fold in the turn index for a fresh one each turn), or
            [B] keys, one per row: each row then draws with its own key, whatever else the
            batch holds (the rollout's episodes are keyed so, by their place in the task list).
          sampling: overrides the sampler's default settings for this turn.
          choices: constrained decoding: per row, the token sequences it may generate (each
            should end with a stop token), or None for a free row. The row draws from the
            policy masked to the tokens that continue a choice (see ``loop.run_turn``); the
            allowed ids of every draw come back in ``TurnOutput.allowed``.
          shapes: fixed shapes (continuous batching's cohorts): the turn runs at least the
            ``TurnShapes`` floors and raises them to what it ran, on the cache with all its
            slots allocated. Rows that start a conversation (an empty cache row, more than one
            new token) are prefilled first, all but their last token, by a start prefill of
            their distinct prompts only (``loop.prefill_starts``: one per group when
            ``share_prefixes``); the turn then feeds each its last token beside the other rows'
            chunks, so a long first prompt does not widen every row's chunk. The tokens drawn
            are the same as without ``shapes``.

        Returns:
          TurnOutput with the generated ids, both log-probs, lengths, done reasons, new cache.

        Raises:
          ValueError: on a batch-size mismatch (of the rows or the per-row keys), an id outside
            the vocabulary, or when a row's conversation so far + new tokens + max_new_tokens
            does not fit in the cache.
        """
        if self.state is None:
            raise RuntimeError("the sampler holds no weights (released): set_state first")
        sampling = sampling or self.sampling
        rng = as_typed_key(rng)
        if rng.shape not in ((), (cache.batch,)):
            raise ValueError(
                f"rng has shape {rng.shape}: expected one key or {cache.batch} per-row keys "
                f"(the cache's batch)"
            )
        # Waits for the previous turn, whose ids the caller has read anyway.
        lengths_b = np.asarray(cache.lengths)
        started = np.zeros(cache.batch, bool)  # rows whose prompt the start prefill took
        if shapes is not None:
            self._check_and_pad(cache, lengths_b, new_tokens, max_new_tokens)  # checks first
            cache = self._allocate(cache, cache.size)
            cache, lengths_b, new_tokens, started = self._prefill_starts(
                cache, lengths_b, new_tokens, shapes
            )
        floor = shapes if shapes is not None else TurnShapes()  # no floors without shapes
        chunk_bt, num_new_b, max_new_b, need = self._check_and_pad(
            cache, lengths_b, new_tokens, max_new_tokens, min_chunk=floor.chunk
        )
        width = bk.round_up(max(int(max_new_b.max()), 1), self.width_buckets, what="max_new_tokens")
        if shapes is not None:
            width = shapes.width = max(width, shapes.width)
            shapes.chunk = chunk_bt.shape[1]
        choices_bcl = self._choices_array(choices, cache.batch, width, min_count=floor.choices)
        if shapes is not None and choices_bcl is not None:
            shapes.choices = choices_bcl.shape[1]
        share = None if shapes is not None else self._share_plan(lengths_b, new_tokens, num_new_b)
        prefilled = range(cache.batch) if share is None else set(share[0].tolist())
        self.prefilled_rows += sum(1 for b in prefilled if num_new_b[b] > 0 and not started[b])
        fn = self._turn_fn(sampling, width, share is not None)
        cache = self._allocate(cache, need)
        with sharding.mesh_context(self.mesh):
            out, cache = fn(
                self.state, cache, chunk_bt, num_new_b, max_new_b, rng, choices_bcl, share
            )
        return TurnOutput(
            tokens=out.tokens,
            logprobs=out.logprobs,
            policy_logprobs=out.policy_logprobs,
            lengths=out.lengths,
            done_reason=out.done_reason,
            cache=cache,
            allowed=out.allowed,
        )

    def _choices_array(
        self, choices, batch: int, width: int, min_count: int = 0
    ) -> np.ndarray | None:
        """[B, C, W] int32 choices, -1 padded, C rounded up to a count bucket and at least
        ``min_count`` (None: no row has choices and ``min_count`` is 0; a row of -1 is a free
        row). Ids past the turn's width are cut (the row stops at max_new_tokens anyway)."""
        if choices is None or not any(choices):
            if not min_count:
                return None
            choices = [None] * batch
        if len(choices) != batch:
            raise ValueError(f"choices has {len(choices)} rows; the cache has batch {batch}")
        vocab = self.cfg.vocab_size
        most = max((len(c) for c in choices if c), default=1)
        num = max(bk.round_up(most, bk.COUNT_BUCKETS, what="choices per row"), min_count)
        out = np.full((batch, num, width), -1, np.int32)
        for r, row in enumerate(choices):
            for c, seq in enumerate(row or ()):
                seq = np.asarray(seq, np.int64).reshape(-1)[:width]
                if not seq.size or seq.min() < 0 or seq.max() >= vocab:
                    raise ValueError(
                        f"choices[{r}][{c}] = {seq.tolist()}: expected a non-empty sequence of "
                        f"ids in [0, {vocab})"
                    )
                out[r, c, : seq.size] = seq
        return out

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int | Sequence[int],
        rng: jax.Array,
        *,
        cache_size: int | None = None,
        sampling: SamplingParams | None = None,
    ) -> TurnOutput:
        """Single-turn generation: ``start`` a cache that fits, then one ``step_turn``."""
        if cache_size is None:
            longest = max(len(p) for p in prompts)
            cache_size = longest + int(np.max(max_new_tokens))
        cache = self.start(len(prompts), cache_size)
        return self.step_turn(cache, prompts, max_new_tokens, rng, sampling=sampling)

    def _prefill_starts(self, cache: KVCache, lengths_b: np.ndarray, new_tokens, shapes):
        """``step_turn(..., shapes=...)``: the start prefill of the rows that start a conversation
        (an empty cache row, more than one new token): all but their last token, one prefill
        per distinct prompt (per row without ``share_prefixes``), at the ``shapes`` floors.

        Returns:
          (the cache with their prompts in, their rows' lengths, the new tokens with each of
          their rows cut to its last token, [B] bool: the rows started).
        """
        batch = cache.batch
        started = np.zeros(batch, bool)
        source_b = np.full(batch, -1, np.int32)  # the distinct prompt each row starts from
        first: dict[object, int] = {}
        prompts: list[list[int]] = []
        for b, row in enumerate(new_tokens):
            if lengths_b[b] or len(row) < 2:
                continue
            prompt = [int(i) for i in row[:-1]]
            key = tuple(prompt) if self.share_prefixes else b
            if key not in first:
                first[key] = len(prompts)
                prompts.append(prompt)
            source_b[b], started[b] = first[key], True
        if not prompts:
            return cache, lengths_b, new_tokens, started
        rows = bk.round_up(len(prompts), bk.COUNT_BUCKETS, what="new conversations")
        shapes.starts = rows = max(rows, shapes.starts)
        longest = max(map(len, prompts))
        chunk = bk.round_up(longest, self.chunk_buckets, what="prompt chunk length")
        shapes.start_chunk = chunk = max(chunk, shapes.start_chunk)
        chunk_ut = np.full((rows, chunk), self.pad_id, np.int32)
        num_new_u = np.zeros(rows, np.int32)  # padding rows: nothing written
        for u, prompt in enumerate(prompts):
            chunk_ut[u, : len(prompt)] = prompt
            num_new_u[u] = len(prompt)
        self.prefilled_rows += len(prompts)
        with sharding.mesh_context(self.mesh):
            cache = self._start_fn()(self.state, cache, chunk_ut, num_new_u, source_b)
        lengths_b = lengths_b + np.where(started, num_new_u[np.maximum(source_b, 0)], 0)
        cut = [row[-1:] if started[b] else row for b, row in enumerate(new_tokens)]
        return cache, lengths_b.astype(np.int32), cut, started

    def _start_fn(self):
        """The jitted start prefill (``loop.prefill_starts``), the cache donated."""
        key = ("start_prefill",)
        if key not in self._jitted:

            def start_prefill(state, cache, chunk_ut, num_new_u, source_b):
                self.num_traces += 1  # Python side effect: runs only while tracing.
                new_cache = prefill_starts(
                    self.graphdef, state, cache, chunk_ut, num_new_u, source_b
                )
                if self.mesh is not None:
                    layout = sharding.kv_cache_shardings(cache, self.mesh)
                    new_cache = jax.lax.with_sharding_constraint(new_cache, layout)
                return new_cache

            self._jitted[key] = jax.jit(start_prefill, donate_argnames=("cache",))
        return self._jitted[key]

    def _share_plan(self, lengths_b: np.ndarray, new_tokens, num_new_b: np.ndarray):
        """``(unique_u, source_b)`` for ``run_turn``, or None when no two rows share a prefix.

        Rows share when both start a conversation (cache length 0) with the same new tokens.
        The distinct rows are padded to a count bucket by repeating the last one (a duplicate
        prefill that no row reads), so group sizes share compilations.
        """
        if not self.share_prefixes:
            return None
        batch = len(lengths_b)
        first: dict[tuple[int, ...], int] = {}
        unique, source = [], np.arange(batch, dtype=np.int32)
        for b, row in enumerate(new_tokens):
            key = tuple(int(i) for i in row) if lengths_b[b] == 0 and num_new_b[b] else None
            if key is not None and key in first:
                source[b] = first[key]
                continue
            if key is not None:
                first[key] = len(unique)
            source[b] = len(unique)
            unique.append(b)
        if len(unique) == batch:
            return None
        num = bk.round_up(len(unique), bk.COUNT_BUCKETS, what="distinct prefixes")
        unique_u = np.asarray(unique + unique[-1:] * (num - len(unique)), np.int32)
        return unique_u, source

    def _turn_fn(self, sampling: SamplingParams, width: int, shared: bool):
        key = (sampling, width, shared)
        if key not in self._jitted:

            def turn(state, cache, chunk_bt, num_new_b, max_new_b, rng, choices_bcl, share):
                self.num_traces += 1  # Python side effect: runs only while tracing.
                out, new_cache = run_turn(
                    self.graphdef,
                    state,
                    cache,
                    chunk_bt,
                    num_new_b,
                    max_new_b,
                    rng,
                    choices_bcl,
                    share,
                    width=width,
                    sampling=sampling,
                    stop=self.stop,
                    pad_id=self.pad_id,
                )
                if self.mesh is not None:
                    # The new cache keeps the donated one's layout, so its buffers can be reused.
                    layout = sharding.kv_cache_shardings(cache, self.mesh)
                    new_cache = jax.lax.with_sharding_constraint(new_cache, layout)
                return out, new_cache

            # The cache is donated: it is the largest buffer (layers x batch x slots) and each
            # turn returns it updated, so XLA writes the new keys/values in place instead of
            # allocating and copying a second cache every turn.
            self._jitted[key] = jax.jit(turn, donate_argnames=("cache",))
        return self._jitted[key]

    def _check_and_pad(
        self,
        cache: KVCache,
        lengths_b: np.ndarray,
        new_tokens: Sequence[Sequence[int]],
        max_new_tokens: int | Sequence[int],
        min_chunk: int = 0,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """Host-side validation (``lengths_b``: the cache's lengths on the host), then the chunk
        padded to its bucket (at least ``min_chunk``).

        Returns:
          (chunk [B, T] int32, num_new [B] int32, max_new [B] int32, the most slots a row fills
          by the end of the turn) with T a chunk bucket.
        """
        b = cache.batch
        if len(new_tokens) != b:
            raise ValueError(f"new_tokens has {len(new_tokens)} rows; the cache has batch {b}")
        rows = [np.asarray(t, dtype=np.int64).reshape(-1) for t in new_tokens]
        num_new_b = np.array([len(r) for r in rows], np.int32)
        max_new_b = np.broadcast_to(np.asarray(max_new_tokens, np.int64), (b,)).astype(np.int32)
        if (max_new_b < 0).any():
            raise ValueError(f"max_new_tokens={max_new_tokens}: expected >= 0")
        max_new_b = np.where(num_new_b > 0, max_new_b, 0).astype(np.int32)
        vocab = self.cfg.vocab_size
        for i, r in enumerate(rows):
            if r.size and (r.min() < 0 or r.max() >= vocab):
                bad = int(r[(r < 0) | (r >= vocab)][0])
                raise ValueError(
                    f"new_tokens[{i}] holds id {bad}, outside the vocabulary [0, {vocab})"
                )
        need_b = lengths_b + num_new_b + max_new_b
        if (need_b > cache.size).any():
            i = int(np.argmax(need_b - cache.size))
            raise ValueError(
                f"row {i} does not fit in the KV cache: {int(lengths_b[i])} tokens already in the "
                f"cache + {int(num_new_b[i])} new prompt tokens + max_new_tokens "
                f"{int(max_new_b[i])} = {int(need_b[i])} > cache size {cache.size}. Start the "
                f"episode with a larger cache_size (Sampler.start(batch, cache_size>="
                f"{int(need_b.max())})) or Sampler.grow the cache"
            )
        t = bk.round_up(
            max(int(num_new_b.max()), 1), self.chunk_buckets, what="prompt chunk length"
        )
        t = max(t, min_chunk)
        chunk_bt = np.full((b, t), self.pad_id, np.int32)
        for i, r in enumerate(rows):
            chunk_bt[i, : r.size] = r
        return chunk_bt, num_new_b, max_new_b, int(need_b.max())


__all__ = ["Sampler", "TurnArrays", "TurnOutput", "TurnShapes"]
