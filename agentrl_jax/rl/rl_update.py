"""One RL update, from an iteration's trajectories to the new train state.

    trajectories -> token rows (host) -> devices, once
      -> old / reference log-probs and values (``Learner.score``: one program, stays on device)
      -> advantages (host: they need the trajectories' structure; one transfer each way)
      -> ``spec.epochs`` shuffles of minibatches (``Learner.rl_update``: one program, steps
         scanned)
      -> metrics (one transfer)

The host draws every shuffle (and ENVRL's example draws) from the iteration's numpy generator in
the order the steps take them, so an update is exactly the sequence of ``Learner.rl_step`` calls
on host-sliced minibatches it replaces, without a host round trip per minibatch.

Every setting is read from the run's resolved ``RLSpec`` (``rl/spec.py``), the one the Learner
was built with: whether a reference policy is scored, whether its KL becomes a reward penalty
(and with which estimator), the estimator and its config, rows, epochs and minibatches.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from agentrl_jax import chaos, kernels, sharding, timing
from agentrl_jax.rl import envrl_data, rl_batch
from agentrl_jax.rl.learner import Learner, TrainState
from agentrl_jax.rl.spec import RLSpec
from agentrl_jax.rollout.trajectory import Trajectory


class RLUpdate:
    """The RL update of a run: ``update(state, ref_policy, trajs, np_rng)``.

    Args:
      spec: the run's RL settings (``RunConfig.rl_spec()``), the learner's own spec.
      learner: the Learner whose ``score`` and ``rl_update`` programs it runs.
      pad_id: the tokenizer's padding id.
      envrl_examples: with ENVRL, ``(trajs, max_len=...) -> {"sp": ..., "id": ...}``
        (``rl/envrl_data.py:examples`` bound to the run's tokenizer and template).
    """

    def __init__(
        self,
        spec: RLSpec,
        learner: Learner,
        pad_id: int,
        envrl_examples: Callable[..., dict[str, Any]] | None = None,
    ):
        if spec != learner.spec:
            raise ValueError(
                "RLUpdate: the spec is not the one the learner was built with; build both from "
                "one RunConfig.rl_spec()"
            )
        if spec.envrl is not None and envrl_examples is None:
            raise ValueError("RLUpdate: the learner has ENVRL losses; pass envrl_examples")
        self.spec = spec
        self.learner = learner
        self.pad_id = pad_id
        self.envrl_examples = envrl_examples

    def __call__(
        self, state: TrainState, ref_policy: Any, trajs: list[Trajectory], np_rng, iteration: int
    ) -> tuple[TrainState, dict[str, float]]:
        """Updates ``state`` (donated) on RL iteration ``iteration``'s ``trajs``.

        Returns the new state and the metrics.
        """
        batch, aux, metrics = self.batch(state, ref_policy, trajs)
        state, update_metrics = self.update(state, batch, aux, np_rng, iteration)
        return state, {**metrics, **update_metrics}

    def batch(
        self, state: TrainState, ref_policy: Any, trajs: list[Trajectory]
    ) -> tuple[dict[str, jax.Array], dict[str, Any], dict[str, float]]:
        """The update's batch on the devices, ENVRL's examples (or {}) and rollout metrics.

        The rows go to the devices once; the old and reference log-probs and the values are
        computed there in one program and stay there, and come to the host once, for the
        advantages.
        """
        spec = self.spec
        if spec.kl.needs_reference and ref_policy is None:
            raise ValueError(
                f"RLUpdate: the spec's KL (coef {spec.kl.coef}, {spec.kl.mode} mode) needs the "
                "frozen reference policy; got ref_policy=None"
            )
        critic = self.learner.value_graphdef is not None
        with timing.phase("batch"):
            rows_ = rl_batch.build_rows(
                trajs,
                spec.context_mode,
                self.pad_id,
                spec.minibatch_size,
                bootstrap=critic,  # truncated episodes' rows also hold the state after them
                invalid_action_reward=spec.invalid_action_reward,
            )
            rows = rows_.rows
            loss_mask = rows.loss_mask
            if spec.loss.aggregation == "episode_mean":  # a row's weight rides in its loss mask
                loss_mask = loss_mask * rl_batch.episode_row_weights(rows.traj_index)[:, None]
            host = {
                "tokens": rows.tokens,
                "mask": rows.mask,
                "loss_mask": loss_mask,
                "step_ids": rows.step_ids,
            }
            if rows.allowed.shape[2]:  # constrained decoding: normalise over the allowed ids
                host["allowed"] = rows.allowed
        with timing.phase("transfer"):
            batch = self.learner.place_batch(host)
        with timing.phase("score"):
            scored = self.learner.score(
                state.policy,
                ref_policy if spec.kl.needs_reference else None,
                state.value,
                batch,
                rows_per_chunk=spec.score_rows,
            )
            jax.block_until_ready(scored)  # read next: ``score`` times the program
        batch.update(scored)
        with timing.phase("transfer"):
            scored = {k: sharding.host_array(v) for k, v in scored.items()}
        old, ref, values = (scored.get(k) for k in ("old_logprobs", "ref_logprobs", "old_values"))
        with timing.phase("advantages"):
            on = rows.loss_mask > 0
            mismatch = float(np.abs(old - rows.old_logprobs)[on].max())
            metrics = {"rollout/logprob_mismatch": mismatch}
            kl = None
            if spec.kl.mode == "reward" and spec.kl.needs_reference:  # the loss mode's estimator
                kl = np.asarray(
                    kernels.kl_penalty(
                        old, ref, rows.loss_mask, kind=spec.kl.estimator, clamp=spec.kl.clamp
                    )
                )
            adv, returns = rl_batch.advantages(
                rows_, len(trajs), spec.algo, spec.advantage, values=values, kl=kl
            )
            targets = {"advantages": adv}
            if values is not None:
                targets["returns"] = returns if returns is not None else adv + values
            metrics["rollout/advantage_abs_mean"] = (
                float(np.abs(adv)[on].mean()) if on.any() else 0.0
            )
            if spec.off_policy_correction != "none":
                # The sampler's log-probs (behaviour) against the trained policy's: each token's
                # advantage, so its loss, weighted (the critic's returns are left unweighted).
                weights, is_metrics = kernels.importance_weights(
                    old,
                    rows.old_logprobs,
                    rows.loss_mask,
                    mode=spec.off_policy_correction,
                    cap=spec.is_cap,
                    step_ids=rows.step_ids,
                    ratio_level=spec.loss.ratio_level,
                )
                targets["advantages"] = (adv * np.asarray(weights)).astype(adv.dtype)
                metrics.update({k: float(v) for k, v in is_metrics.items()})
        with timing.phase("transfer"):
            batch.update(self.learner.place_batch(targets))
        aux = {}
        if spec.envrl is not None:
            with timing.phase("batch"):
                aux = self.envrl_examples(trajs, max_len=rows.tokens.shape[1])
        return batch, aux, metrics

    def update(
        self,
        state: TrainState,
        batch: dict[str, jax.Array],
        aux: dict[str, Any],
        np_rng,
        iteration: int,
    ) -> tuple[TrainState, dict[str, float]]:
        """``spec.epochs`` shuffles of whole minibatches over ``batch``: one program, one sync.

        Rows past the last whole minibatch of a shuffle are left out of that epoch.

        ENVRL's weights decay over ``envrl_data.schedule_step``: the RL updates so far
        (``spec.envrl_by_updates``: ``envrl.horizon`` set), else the RL phase's progress
        (``iteration`` and the fraction done).
        """
        spec = self.spec
        size = spec.minibatch_size
        num_rows = batch["tokens"].shape[0]
        num_updates = spec.epochs * (num_rows // size)
        envrl = spec.envrl is not None
        first = int(state.step) if envrl else 0  # RL updates so far (ENVRL's schedule)
        horizon = spec.envrl.horizon if envrl and spec.envrl_by_updates else 0
        plan, per_update = [], []
        with timing.phase("batch"):
            for _ in range(spec.epochs):
                order = np_rng.permutation(num_rows)
                for i in range(0, num_rows - size + 1, size):
                    if envrl:
                        step = envrl_data.schedule_step(
                            horizon, iteration, first, len(plan), num_updates
                        )
                        per_update.append(aux_minibatch(aux, np_rng, size, step))
                    plan.append(order[i : i + size])
        if not plan:
            return state, {"train/skipped_nonfinite": 0.0, "train/updates": 0.0}
        with timing.phase("transfer"):
            stacked = jax.tree.map(lambda *xs: np.stack(xs), *per_update) if per_update else {}
            order = self.learner.place_replicated(np.stack(plan).astype(np.int32))
            stacked = self.learner.place_replicated(stacked)
        with timing.phase("update"):
            state, metrics = self.learner.rl_update(state, batch, order, stacked)
            chaos.maybe_kill("update")  # dispatched; its state and metrics not yet back
            jax.block_until_ready(metrics)
        with timing.phase("transfer"):
            metrics = jax.device_get(metrics)
        out = {k: float(np.mean(v)) for k, v in metrics.items()}
        out["train/skipped_nonfinite"] = float(np.sum(metrics["train/skipped_nonfinite"]))
        out["train/updates"] = float(len(plan))
        return state, out


def aux_minibatch(aux: dict[str, Any], np_rng, size: int, step: float) -> dict[str, np.ndarray]:
    """A fixed-size random draw of ENVRL examples for one update (fixed shapes).

    ``step`` is the ENVRL weights' schedule step of that update (``batch["iteration"]``).
    """
    out = {"iteration": np.asarray(step, np.float32)}
    for kind, ex in aux.items():
        n, length = ex.input_ids.shape
        if n:
            idx = np_rng.integers(n, size=size)
            tokens, mask, target = ex.input_ids[idx], ex.attention_mask[idx], ex.target_mask[idx]
        else:  # No step has a next state (one-step episodes): an all-masked draw.
            tokens = np.zeros((size, length), np.int32)
            mask = target = np.zeros((size, length), np.float32)
        out[f"aux_{kind}_tokens"] = tokens
        out[f"aux_{kind}_mask"] = mask
        out[f"aux_{kind}_target_mask"] = target
    return out
