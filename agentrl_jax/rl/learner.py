"""The pure, jitted update: ``train_step(state, batch) -> (state, metrics)``.

One Learner serves SFT (cross-entropy on the agent's tokens) and RL (the spec's policy loss,
value loss for critic-based estimators, KL to the frozen reference policy, entropy bonus and the
ENVRL auxiliary losses: ``rl/spec.py`` decides which, ``rl/losses.py`` computes them). Actor and
critic have separate optax optimizers and learning rates. The state is donated: its buffers are
reused for the new state, so an update never holds two copies of the parameters and optimizer
moments.

Entry points: each jitted program is a property of the Learner defined in its class body
(``sft_step``, ``rl_step``, ``rl_update``, ``score``, ``policy_logprobs``, ``values``), the jit of
the pure method of the same name with ``_fn`` (``rl_step_fn``...), which a caller's own program
may trace instead.

Temperature: RL rollouts sample from ``softmax(logits / T)``, so the RL loss, the old/reference
log-probs and the entropy are all computed from ``logits / T`` (``spec.temperature``): the policy
being optimised is the one that acted. SFT and greedy evaluation use the raw logits.

Constrained decoding: a batch with ``allowed`` [B, T, K] (the ids the sampler restricted the
draw of token t to, -1 padded; all -1: unconstrained) is normalised over that set only, as if every
other logit were masked before the softmax, so log-probs, ratios, KL and entropy are of the
distribution that acted.

Memory: the policy's [B, T, V] logits are never materialised. Log-probs and entropies go through
the LM head ``logits_chunk`` positions at a time, each chunk recomputed in the backward pass
(``lm_head.token_stats``); ``lm_head.token_logprobs`` and ``lm_head.mask_to_allowed`` are the
plain formulas it reproduces.

LoRA (a policy whose ``cfg.lora`` is set, ``models/lora.py``): ``state.policy`` still holds every
parameter (the adapters and the frozen base, each in its own dtype), but only the adapters
(``nnx.LoRAParam``) train: the steps split the policy's state into adapters and base, differentiate
the loss with respect to the adapters alone (the base enters as a constant of the traced program,
so no gradient, accumulator or Adam moment of it exists), and put the updated adapters back
beside the unchanged base. ``policy_opt`` holds the adapters' moments only. The frozen KL
reference of a LoRA policy is its base without the adapters (:meth:`base_state`, the state's own
arrays: no copy), scored with the base model's graph.

Alignment: ``logprobs[:, t]`` is log pi(tokens[t] | tokens[<t]), taken from the logits at t - 1,
and ``values[:, t]`` is the critic's value of the prefix tokens[<t] (also read at t - 1), so both
line up with the token they score; column 0 (never an action token) is 0.

Microbatches: with ``microbatch_size``, a step's batch is split into microbatches scanned on
device (``jax.lax.scan``), each one's gradient added to a float32 accumulator, so activation
memory is set by the microbatch; the loss, gradient, metrics and update are the whole batch's
(``losses.loss_and_grads``). The optimizer and the non-finite check run once, after
accumulation.

A non-finite loss or gradient leaves the parameters and optimizer states unchanged (the update is
skipped inside jit) and reports ``train/skipped_nonfinite = 1``; the trainer logs it and never
checkpoints a state whose last update was skipped for that reason.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from agentrl_jax import kernels, sharding
from agentrl_jax.models import lora as lora_lib
from agentrl_jax.models import moe
from agentrl_jax.rl import losses
from agentrl_jax.rl.lm_head import TokenStats, token_stats

# The full-logits formulas, in lm_head.py beside the chunked one; still importable from here.
from agentrl_jax.rl.lm_head import mask_to_allowed as mask_to_allowed
from agentrl_jax.rl.lm_head import token_logprobs as token_logprobs
from agentrl_jax.rl.spec import RLSpec


@flax.struct.dataclass
class TrainState:
    """Everything an update changes. Graph definitions and optimizers live in the Learner."""

    step: jax.Array
    policy: Any  # nnx.State of the policy's parameters
    policy_opt: Any
    value: Any = None  # nnx.State of the value model, or None without a critic
    value_opt: Any = None


def shift_right(x_bt: jax.Array) -> jax.Array:
    """Aligns a per-position quantity read at t - 1 with token t (column 0 becomes 0)."""
    return jnp.pad(x_bt[:, :-1], ((0, 0), (1, 0)))


class Learner:
    """Builds the jitted train steps for a policy (and optional value model).

    Args:
      policy: the policy module (its graph definition is kept; its state seeds ``init``).
      value_model: the critic module or None.
      actor_tx, critic_tx: optax transformations (separate learning rates).
      spec: the run's resolved RL settings (``RunConfig.rl_spec()``): losses, weights, KL,
        ENVRL, the rollouts' temperature. None (an SFT learner): ``RLSpec.for_losses()``, the
        default losses; a test builds one from loss settings with ``RLSpec.for_losses(...)``.
      logits_chunk: positions per LM-head call (``lm_head.token_stats``): peak logits memory is
        [B, logits_chunk, V] instead of [B, T, V].
      microbatch_size: rows per microbatch of a train step's batch (gradient accumulation
        inside the jitted step; it must divide the batch's rows), or None / 0 for the whole
        batch at once. The update is the whole batch's either way.
      mesh: the device mesh the state and batches live on, or None for the default device.
      dropout_seed: LoRA dropout (a policy whose ``cfg.lora.dropout`` > 0): the RL steps'
        masks come from this seed, folded with the state's step, then one key per microbatch
        (``dropout_keys``), so a resumed run draws the masks the uninterrupted one did.
    """

    def __init__(
        self,
        policy: nnx.Module,
        value_model: nnx.Module | None,
        actor_tx: optax.GradientTransformation,
        critic_tx: optax.GradientTransformation | None = None,
        *,
        spec: RLSpec | None = None,
        logits_chunk: int = 256,
        microbatch_size: int | None = None,
        mesh: jax.sharding.Mesh | None = None,
        dropout_seed: int = 0,
    ):
        if spec is None:
            spec = RLSpec.for_losses()
        if logits_chunk < 1:
            raise ValueError(f"Learner logits_chunk={logits_chunk}: expected >= 1")
        if microbatch_size is not None and microbatch_size < 0:
            raise ValueError(
                f"Learner microbatch_size={microbatch_size}: expected None, 0 (no split) or > 0"
            )
        self.spec = spec
        self.microbatch_size = int(microbatch_size or 0)
        self.logits_chunk = int(logits_chunk)
        self.policy_graphdef, _ = nnx.split(policy)
        # LoRA: only the adapters train; the reference is the base model, scored with its graph.
        lora_cfg = getattr(getattr(policy, "cfg", None), "lora", None)
        self.lora = lora_cfg is not None
        # LoRA dropout in the RL steps' forward passes (never in scoring or sampling).
        self.lora_dropout = self.lora and lora_cfg.dropout > 0
        self.dropout_seed = int(dropout_seed)
        # Routed experts' load-balancing loss (ModelConfig.router_aux_loss), times its coefficient.
        cfg = getattr(policy, "cfg", None)
        self.router_aux_coef = (
            float(cfg.router_aux_loss_coef) if getattr(cfg, "router_aux_loss", False) else None
        )
        self.base_graphdef = None
        if self.lora:
            self.base_graphdef = nnx.split(lora_lib.base_model(policy))[0]
        self.value_graphdef = None if value_model is None else nnx.split(value_model)[0]
        self.actor_tx = actor_tx
        self.critic_tx = critic_tx
        self.policy_loss_fn = kernels.get_policy_loss(spec.policy_loss)
        self.mesh = mesh
        # The state's layout, from its shapes alone: the train steps are compiled with exactly
        # these output shardings, and ``init`` creates the state in them.
        self.state_shardings = None
        if mesh is not None:
            self.state_shardings = self._shardings(self.abstract_state(policy, value_model))

    # ---------------------------------------------------------------- jitted entry points
    #
    # Each is the jit of the pure ``*_fn`` method of its name, made once per Learner on first
    # use: traced and called under the Learner's mesh (``sharding.MeshJit``), so the model's
    # activation constraints (batch over (data, fsdp), heads and MLP width over tp) are part of
    # every program; the steps return the state in ``state_shardings`` and take it donated, so
    # XLA writes the new parameters and moments into the old buffers.

    def _jit(self, fn, *, steps_state: bool = False, **jit_kwargs) -> sharding.MeshJit:
        if steps_state:
            jit_kwargs["donate_argnums"] = 0
            if self.mesh is not None:
                jit_kwargs["out_shardings"] = (self.state_shardings, None)
        return sharding.MeshJit(fn, mesh=self.mesh, **jit_kwargs)

    @functools.cached_property
    def sft_step(self) -> sharding.MeshJit:
        """``(state, batch) -> (state, metrics)``: jitted :meth:`sft_step_fn`, state donated."""
        return self._jit(self.sft_step_fn, steps_state=True)

    @functools.cached_property
    def rl_step(self) -> sharding.MeshJit:
        """``(state, minibatch) -> (state, metrics)``: jitted :meth:`rl_step_fn`, state donated."""
        return self._jit(self.rl_step_fn, steps_state=True)

    @functools.cached_property
    def rl_update(self) -> sharding.MeshJit:
        """``(state, batch, index_ur, per_update) -> (state, metrics)``: jitted
        :meth:`rl_update_fn` (the minibatch steps scanned), state donated."""
        return self._jit(self.rl_update_fn, steps_state=True)

    @functools.cached_property
    def score(self) -> sharding.MeshJit:
        """Jitted :meth:`score_fn` (``rows_per_chunk`` static)."""
        return self._jit(self.score_fn, static_argnames="rows_per_chunk")

    @functools.cached_property
    def policy_logprobs(self) -> sharding.MeshJit:
        """``(policy_state, batch) -> [B, T]``: jitted :meth:`policy_logprobs_fn`."""
        return self._jit(self.policy_logprobs_fn)

    @functools.cached_property
    def values(self) -> sharding.MeshJit:
        """``(value_state, batch) -> [B, T]``: jitted :meth:`values_fn`."""
        return self._jit(self.values_fn)

    # ---------------------------------------------------------------- state

    def init(self, policy: nnx.Module, value_model: nnx.Module | None = None) -> TrainState:
        """A fresh state from the modules' parameters, laid out on the Learner's mesh.

        One compiled program copies the parameters (train steps donate the state's buffers,
        and the modules must stay usable) and creates the optimizer moments, each array in its
        layout (``state_shardings``): the logical-axis rules for parameters, the same for their
        moments, scalars replicated.
        """
        return jax.jit(self._new_state, out_shardings=self._placement())(
            _params(policy), _params(value_model)
        )

    def _placement(self):
        """Where ``init`` puts the state: by ``state_shardings`` on a mesh, else committed to the
        first device, where a restored state is too (orbax places every array it reads). An
        uncommitted and a committed argument make two programs of every jitted step, so a
        resumed run would otherwise compile its programs twice."""
        if self.mesh is None:
            return jax.sharding.SingleDeviceSharding(jax.devices()[0])
        return self.state_shardings

    def abstract_state(
        self, policy: nnx.Module, value_model: nnx.Module | None = None
    ) -> TrainState:
        """The state ``init`` would make, as ``jax.ShapeDtypeStruct`` (with shardings on a mesh).

        Nothing is allocated: a restore target, or the shapes of a plan.
        """
        abstract = jax.eval_shape(self._new_state, _params(policy), _params(value_model))
        if self.mesh is None:
            return abstract
        return jax.tree.map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
            abstract,
            self._shardings(abstract),
        )

    def trainable(self, policy_state):
        """``(trainable, frozen)`` parts of a policy state: the adapters and the base of a LoRA
        policy; the whole state and None otherwise."""
        if not self.lora:
            return policy_state, None
        return nnx.split_state(policy_state, nnx.LoRAParam, ...)

    def _join(self, trainable, frozen):
        """The policy state again from :meth:`trainable`'s two parts."""
        return trainable if frozen is None else nnx.merge_state(trainable, frozen)

    def base_state(self, policy_state):
        """A LoRA policy's frozen base (its own arrays, no copy): the KL reference of a run whose
        adapters started at zero. Read it from the current state before each update: a step
        donates the state's buffers."""
        if not self.lora:
            raise ValueError("Learner.base_state: the policy has no LoRA adapters")
        return self.trainable(policy_state)[1]

    def _new_state(self, policy_params, value_params) -> TrainState:
        copy = functools.partial(jax.tree.map, jnp.copy)
        return TrainState(
            step=jnp.zeros((), jnp.int32),
            policy=copy(policy_params),
            policy_opt=self.actor_tx.init(self.trainable(policy_params)[0]),
            value=None if value_params is None else copy(value_params),
            value_opt=None if value_params is None else self.critic_tx.init(value_params),
        )

    def _shardings(self, abstract: TrainState) -> TrainState:
        """Each parameter by the logical-axis rules, its moments alike, the rest replicated."""
        replicated = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())

        def params_and_moments(params, opt, tx, split=lambda p: (p, None)):
            if params is None:
                return None, None
            # One sharding per parameter, in the parameters' own tree (Variables and all), so
            # optax can pair it with each copy of the (trained) parameters in the optimizer state.
            shardings = sharding.leaf_shardings(params, self.mesh)
            moments = optax.tree_map_params(
                tx,
                lambda _, s: s,
                opt,
                split(shardings)[0],
                transform_non_params=lambda _: replicated,
            )
            return shardings, moments

        policy, policy_opt = params_and_moments(
            abstract.policy, abstract.policy_opt, self.actor_tx, self.trainable
        )
        value, value_opt = params_and_moments(abstract.value, abstract.value_opt, self.critic_tx)
        return TrainState(
            step=replicated, policy=policy, policy_opt=policy_opt, value=value, value_opt=value_opt
        )

    def place_batch(self, batch: dict[str, Any]) -> dict[str, jax.Array]:
        """Puts a batch on the devices, rows split over the mesh's (data, fsdp) axes.

        ``batch`` is the whole global batch. On a mesh that spans several processes
        (multi-host), each process transfers only the rows its own devices hold; every process
        holds the same global batch on the host, so the resulting global array is row for row
        the one a single process with all the devices would build.
        """
        if self.mesh is None:
            return {k: jnp.asarray(v) for k, v in batch.items()}
        out = {}
        for k, v in batch.items():
            named = self._row_sharding(np.shape(v))
            if named.is_fully_addressable:
                out[k] = jax.device_put(v, named)
            else:
                host = np.asarray(v)
                out[k] = jax.make_array_from_callback(host.shape, named, lambda i, h=host: h[i])
        return out

    def abstract_batch(self, shapes: dict[str, tuple[tuple[int, ...], Any]]) -> dict[str, Any]:
        """``place_batch``'s layout for arrays of these (shape, dtype), without data.

        Returns ``jax.ShapeDtypeStruct`` per key (with the row sharding on a mesh): the inputs
        a train step or ``score`` is lowered and compiled with ahead of time (a memory plan).
        """
        return {
            k: jax.ShapeDtypeStruct(
                shape, dtype, sharding=None if self.mesh is None else self._row_sharding(shape)
            )
            for k, (shape, dtype) in shapes.items()
        }

    def _row_sharding(self, shape) -> jax.sharding.NamedSharding:
        """Rows over the mesh's (data, fsdp) axes (replicated when they do not divide)."""
        return sharding.named_sharding(self.mesh, _batch_axes(shape), shape)

    def place_replicated(self, tree: Any) -> Any:
        """Puts host arrays on the devices whole (every device a copy), e.g. a shuffle plan."""
        if self.mesh is None:
            return jax.tree.map(jnp.asarray, tree)
        replicated = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())

        def put(x):
            x = np.asarray(x)
            return jax.make_array_from_callback(x.shape, replicated, lambda i: x[i])

        return jax.tree.map(put, tree)

    def policy_module(self, state: TrainState) -> nnx.Module:
        return nnx.merge(self.policy_graphdef, state.policy)

    # ---------------------------------------------------------------- forward passes

    def _token_stats(
        self, model, tokens, mask, *, temperature=1.0, allowed=None, lora_key=None
    ) -> TokenStats:
        """The policy's per-token log-probs and entropies of ``tokens`` (chunked LM head);
        ``lora_key``: LoRA dropout's key (a training forward pass), or None."""
        hidden, _ = model.trunk(tokens, mask_bt=mask, lora_dropout_key=lora_key)
        return token_stats(
            model.logits,
            hidden,
            tokens,
            temperature=temperature,
            allowed_btk=allowed,
            chunk=self.logits_chunk,
        )

    def _rl_stats(self, model, batch, lora_key=None) -> TokenStats:
        """Stats of the distribution that acted: ``logits / T``, restricted to ``allowed``."""
        return self._token_stats(
            model,
            batch["tokens"],
            batch["mask"],
            temperature=self.spec.temperature,
            allowed=batch.get("allowed"),
            lora_key=lora_key,
        )

    def policy_logprobs_fn(self, policy_state, batch):
        """[B, T] log-probs of the distribution that acted (pure; jitted as
        :attr:`policy_logprobs`). A LoRA learner given a state without adapters (the base,
        :meth:`base_state`) scores the base model."""
        graphdef = self.policy_graphdef
        if self.lora and not lora_lib.has_adapters(policy_state):
            graphdef = self.base_graphdef
        model = nnx.merge(graphdef, policy_state)
        return self._rl_stats(model, batch).logprobs

    def values_fn(self, value_state, batch):
        """[B, T] the critic's values, aligned with the tokens (pure; jitted as :attr:`values`)."""
        model = nnx.merge(self.value_graphdef, value_state)
        return shift_right(model(batch["tokens"], mask_bt=batch["mask"]))

    def score_fn(self, policy_state, ref_state, value_state, batch, *, rows_per_chunk: int):
        """What the update needs of the rollout's models, in one program over the whole batch
        (pure; jitted as :attr:`score`).

        Returns {"old_logprobs": [R, T]} and, when their states are given, "ref_logprobs" [R, T]
        and "old_values" [R, T]; ``rows_per_chunk`` rows go through the models at a time (a
        ``lax.map`` over strided row chunks, as the microbatches of a step), so activation
        memory is a chunk's, and nothing returns to the host in between.
        """
        inputs = {k: batch[k] for k in ("tokens", "mask", "allowed") if k in batch}
        rows = inputs["tokens"].shape[0]
        size = min(rows_per_chunk, rows)
        n = rows // size
        if rows % size:
            raise ValueError(
                f"Learner.score: rows_per_chunk={rows_per_chunk} does not divide the batch's "
                f"{rows} rows"
            )

        def one(chunk):
            out = {"old_logprobs": self.policy_logprobs_fn(policy_state, chunk)}
            if ref_state is not None:
                out["ref_logprobs"] = self.policy_logprobs_fn(ref_state, chunk)
            if value_state is not None:
                out["old_values"] = self.values_fn(value_state, chunk)
            return out

        if n == 1:
            return one(inputs)
        out = jax.lax.map(one, {k: losses.split_rows(v, n) for k, v in inputs.items()})
        return jax.tree.map(losses.merge_rows, out)

    # ---------------------------------------------------------------- losses
    #
    # A loss is a forward pass (``*_forward(params, batch)`` -> per-row stats: every use of the
    # parameters) and its terms (``rl/losses.py``); ``losses.loss_and_grads`` scans
    # microbatches through the first and still gives the whole batch's loss and metrics.

    def sft_forward(self, policy_state, batch) -> dict[str, jax.Array]:
        """{"logprobs": [B, T]} of the raw (temperature 1, unconstrained) logits."""
        model = nnx.merge(self.policy_graphdef, policy_state)
        out = {"logprobs": self._token_stats(model, batch["tokens"], batch["mask"]).logprobs}
        return self._router_stats(model, batch, out)

    def _router_stats(self, model, batch, out):
        """With the router's auxiliary loss on: adds "router_aux" and "router_load_max" [B],
        on each row with real tokens (0 on the others) this (micro)batch's load-balancing loss
        (``moe.load_balancing_loss``, as transformers' over the real tokens of every sparse
        layer) and its most loaded expert's share of the routing choices times E (1 is a
        perfect balance). The router logits come from a pass of their own
        (``Trunk.router_logits``)."""
        if self.router_aux_coef is None:
            return out
        tokens, mask = batch["tokens"], batch["mask"]
        logits = model.trunk.router_logits(tokens, mask_bt=mask)
        k, e = model.cfg.num_experts_per_tok, model.cfg.num_experts
        aux = moe.load_balancing_loss(logits, mask, k)
        load = jax.lax.stop_gradient(jnp.max(moe.load_balance(logits, mask, k)) * e)
        # Rows with real tokens carry the (micro)batch's values; a padding row weighs nothing,
        # so a microbatch of padding rows adds nothing to the mean.
        has_tokens = _rows_with_tokens(mask)
        out["router_aux"] = aux * has_tokens
        out["router_load_max"] = load * has_tokens
        return out

    def _with_router_terms(self, terms, metrics, stats, batch):
        """The auxiliary term: ``router_aux_loss_coef`` times the mean over (micro)batches of
        their load-balancing loss (with microbatches, each microbatch's own, as transformers
        computes it per forward pass; weighted by their rows with real tokens), and its metrics.

        The denominator, the rows with real tokens, comes from the batch's mask, as every
        term's does: ``losses.loss_and_grads`` takes the whole batch's denominators by
        evaluating the terms on zero stats, so one read from the stats would be 0 there."""
        if "router_aux" not in stats:
            return terms, metrics
        rows = jnp.sum(_rows_with_tokens(batch["mask"]))
        aux = kernels.Weighted(jnp.sum(stats["router_aux"]), rows)
        terms = {**terms, "moe/router_aux": (self.router_aux_coef, aux)}
        metrics = {**metrics, "moe/router_aux_loss": aux}
        metrics["moe/expert_load_max"] = kernels.Weighted(jnp.sum(stats["router_load_max"]), rows)
        metrics["losses/total"] = losses.total(terms)
        return terms, metrics

    def sft_terms(self, stats, batch):
        """The SFT loss terms (``losses.sft_terms``) and, when on, the router's."""
        return self._with_router_terms(*losses.sft_terms(stats, batch), stats, batch)

    def rl_forward(self, params, batch) -> dict[str, jax.Array]:
        """Per-row stats of the current parameters: all the RL terms need of them.

        Returns:
          "logprobs", "entropy": [B, T] of the distribution that acted; "values": [B, T] with a
          critic; "aux_sp_logprobs", "aux_id_logprobs": [N, L] with ENVRL examples in the batch.
        """
        policy_state, value_state = params
        model = nnx.merge(self.policy_graphdef, policy_state)
        key = None
        if DROPOUT_KEYS in batch:  # this (micro)batch's key: its first row's
            key = jax.random.wrap_key_data(batch[DROPOUT_KEYS][0])
        stats = self._rl_stats(model, batch, key)
        out = {"logprobs": stats.logprobs, "entropy": stats.entropy}
        if value_state is not None:
            vmodel = nnx.merge(self.value_graphdef, value_state)
            out["values"] = shift_right(vmodel(batch["tokens"], mask_bt=batch["mask"]))
        if self.spec.envrl is not None and "aux_sp_tokens" in batch:
            for index, kind in enumerate(("sp", "id"), start=1):
                tokens, mask = batch[f"aux_{kind}_tokens"], batch[f"aux_{kind}_mask"]
                aux_key = None if key is None else jax.random.fold_in(key, index)
                out[f"aux_{kind}_logprobs"] = self._token_stats(
                    model, tokens, mask, lora_key=aux_key
                ).logprobs
        return self._router_stats(model, batch, out)

    def rl_terms(self, stats, batch):
        """The RL loss terms and metrics of ``stats`` (``losses.rl_terms`` of the spec)."""
        terms = losses.rl_terms(self.spec, self.policy_loss_fn, stats, batch)
        return self._with_router_terms(*terms, stats, batch)

    def sft_loss(self, policy_state, batch):
        """The whole batch's SFT loss and metrics, in one piece (no microbatches)."""
        value, (_, metrics) = losses.loss(self.sft_forward, self.sft_terms, policy_state, batch)
        return value, losses.metric_values(metrics)

    def rl_loss(self, params, batch):
        """The whole batch's RL loss and metrics in one piece; params: (policy, value or None)."""
        value, (_, metrics) = losses.loss(self.rl_forward, self.rl_terms, params, batch)
        return value, losses.metric_values(metrics)

    # ---------------------------------------------------------------- updates

    def sft_step_fn(self, state: TrainState, batch):
        """One SFT step (pure; jitted as :attr:`sft_step`)."""
        trainable, frozen = self.trainable(state.policy)
        forward = self.sft_forward
        if frozen is not None:  # LoRA: the base is a constant, the adapters are differentiated
            forward = lambda p, b: self.sft_forward(self._join(p, frozen), b)  # noqa: E731
        loss, grads, metrics = losses.loss_and_grads(
            forward, self.sft_terms, trainable, batch, self.microbatch_size
        )
        trainable, policy_opt, ok, gnorm = losses.apply_update(
            self.actor_tx, loss, grads, trainable, state.policy_opt
        )
        policy = self._join(trainable, frozen)
        metrics.update({"train/grad_norm": gnorm, "train/skipped_nonfinite": 1.0 - ok})
        new = state.replace(step=state.step + 1, policy=policy, policy_opt=policy_opt)
        return new, metrics

    def dropout_keys(self, step, rows: int) -> jax.Array:
        """[rows, 2] LoRA dropout's key data for train step ``step``: row r's key is
        ``split(fold_in(key(dropout_seed), step), rows)[r]``. A (micro)batch draws its masks
        from its first row's key, so every microbatch of a step draws its own."""
        step_key = jax.random.fold_in(jax.random.key(self.dropout_seed), step)
        return jax.random.key_data(jax.random.split(step_key, rows))

    def rl_step_fn(self, state: TrainState, batch):
        """One RL step on a minibatch (pure; jitted as :attr:`rl_step`)."""
        if self.lora_dropout:
            rows = batch["tokens"].shape[0]
            batch = {**batch, DROPOUT_KEYS: self.dropout_keys(state.step, rows)}
        trainable, frozen = self.trainable(state.policy)
        forward = self.rl_forward
        if frozen is not None:  # LoRA: the base is a constant, the adapters are differentiated
            forward = lambda p, b: self.rl_forward((self._join(p[0], frozen), p[1]), b)  # noqa: E731
        params = (trainable, state.value)
        loss, (g_pol, g_val), metrics = losses.loss_and_grads(
            forward, self.rl_terms, params, batch, self.microbatch_size
        )
        finite = jnp.isfinite(loss) & losses.all_finite(g_pol)
        if state.value is not None:
            finite = finite & losses.all_finite(g_val)
        trainable, policy_opt, _, gnorm = losses.apply_update(
            self.actor_tx, loss, g_pol, trainable, state.policy_opt, finite
        )
        policy = self._join(trainable, frozen)
        metrics["train/grad_norm"] = gnorm
        value, value_opt = state.value, state.value_opt
        if state.value is not None:
            value, value_opt, _, vnorm = losses.apply_update(
                self.critic_tx, loss, g_val, state.value, state.value_opt, finite
            )
            metrics["train/value_grad_norm"] = vnorm
        metrics["train/skipped_nonfinite"] = 1.0 - finite.astype(jnp.float32)
        new = state.replace(
            step=state.step + 1,
            policy=policy,
            policy_opt=policy_opt,
            value=value,
            value_opt=value_opt,
        )
        return new, metrics

    def rl_update_fn(self, state: TrainState, batch, index_ur, per_update):
        """One RL update: a train step per minibatch, scanned on device (pure; jitted as
        :attr:`rl_update`).

        Args:
          state: the train state (donated).
          batch: the update's whole batch, [R, ...] arrays, placed on the devices once.
          index_ur: [U, M] int32, the rows of each of the U minibatches in order (the host draws
            the shuffle, so the update is the one of U ``rl_step`` calls on ``batch[index_u]``).
          per_update: dict of [U, ...] arrays each step sees its slice of (ENVRL's examples and
            schedule step), or {}.

        Returns:
          (state, metrics): metrics of every step, [U] arrays (one transfer to the host).
        """

        def step(state, xs):
            index_r, extra = xs
            minibatch = {k: jnp.take(v, index_r, axis=0) for k, v in batch.items()}
            minibatch = self._constrain_rows({**minibatch, **extra})
            return self.rl_step_fn(state, minibatch)

        return jax.lax.scan(step, state, (index_ur, per_update))

    def _constrain_rows(self, batch):
        """On a mesh: rows split over the (data, fsdp) axes, as ``place_batch`` lays them out."""
        if self.mesh is None:
            return batch
        return {
            k: jax.lax.with_sharding_constraint(v, self._row_sharding(v.shape))
            for k, v in batch.items()
        }


def _rows_with_tokens(mask_bt: jax.Array) -> jax.Array:
    """[B] float32: 1 on a row with a real token, else 0."""
    return (jnp.sum(mask_bt, axis=1) > 0).astype(jnp.float32)


def _params(module: nnx.Module | None):
    return None if module is None else nnx.state(module, nnx.Param)


# The batch key of the LoRA dropout keys a train step adds (``Learner.dropout_keys``).
DROPOUT_KEYS = "lora_dropout_keys"


def _batch_axes(shape) -> tuple[str | None, ...]:
    """Logical axes of a batch array of ``shape``: rows are the batch, the rest is not split."""
    return ("batch",) + (None,) * (len(shape) - 1) if len(shape) else ()
