"""A run's bookkeeping, typed, and the checkpoint meta that carries it.

``RunState``: where a run is (its phase, the RL iterations done, the last checkpoint's number),
its evaluations so far, and the SFT data iterator's position during SFT. A checkpoint's JSON meta
(``CheckpointMeta``) is the run state with the curriculum's state and the name of the frozen KL
reference beside the numbered checkpoints::

    {"phase": "rl", "rl_iteration": 3, "evals": {"after_sft": {...}}, "checkpoint": 4,
     "curriculum": {...}, "reference": "reference"}

(``sft_iterator`` during SFT only, ``reference`` only when the KL term is on). These are the keys
the trainer's untyped meta dict had, so a checkpoint written before the run state had a type
restores, and one written now is read by the code before it. Checkpoints older still say
``"has_ref": true``: their reference sits in the state tree (item ``ref``), not beside it.

``restore_latest`` reads a run's newest checkpoint into the layout of the parts it is given; the
trainer resumes with it and ``launch.eval`` evaluates with it.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Literal

from agentrl_jax.run import build
from agentrl_jax.run.checkpoint import Checkpointer
from agentrl_jax.run.config import RunConfig

Phase = Literal["sft", "rl", "done"]
PHASES: tuple[Phase, ...] = ("sft", "rl", "done")
# The frozen KL reference policy's item beside the numbered checkpoints (written once).
REFERENCE = "reference"


@dataclasses.dataclass
class RunState:
    """Where a run is; changed by the trainer's phases, saved in every checkpoint.

    Attributes:
      phase: ``"sft"``, ``"rl"`` (SFT done, RL iterations to go) or ``"done"``.
      rl_iteration: RL iterations done.
      policy_version: RL updates applied to the policy (an iteration without a usable episode
        applies none); the steps of a rollout are tagged with it (``Step.policy_version``).
      evals: the evaluations so far, by name (``after_sft``, ``rl_4``, ``after_rl``, ...): for
        each level its ``EvalResult`` as JSON (``EvalResult.from_json`` reads it back).
      checkpoint: the number of the last checkpoint written (-1: none yet).
      sft_iterator: during SFT, the data iterator's state at the last epoch's end (None at the
        start of SFT, and after it).
      pending: asynchronous RL (``rl.max_staleness > 0``): the rollouts played for the
        iterations to come and not trained on yet, as ``PendingRollout.to_json``
        (``rollout/ahead.py``), so a resumed run trains on exactly them: none lost, none played
        twice.
    """

    phase: Phase = "sft"
    rl_iteration: int = 0
    policy_version: int = 0
    evals: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    checkpoint: int = -1
    sft_iterator: dict[str, Any] | None = None
    pending: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def __post_init__(self):
        if self.phase not in PHASES:
            raise ValueError(f"run state: phase {self.phase!r}, expected one of {PHASES}")

    def evaluation(self, name: str) -> dict[str, dict[str, Any]]:
        """Evaluation ``name``'s results per level, as JSON (``EvalResult.from_json`` each).

        Raises:
          KeyError: no evaluation of that name, naming those there are.
        """
        if name not in self.evals:
            raise KeyError(f"no evaluation {name!r}; the run has {sorted(self.evals)}")
        return self.evals[name]

    def to_json(self) -> dict[str, Any]:
        """The meta's run keys (a copy: the write may happen while the run goes on)."""
        out: dict[str, Any] = {
            "phase": self.phase,
            "rl_iteration": self.rl_iteration,
            "evals": copy.deepcopy(self.evals),
        }
        if self.policy_version:
            out["policy_version"] = self.policy_version
        if self.checkpoint >= 0:
            out["checkpoint"] = self.checkpoint
        if self.sft_iterator is not None:
            out["sft_iterator"] = copy.deepcopy(self.sft_iterator)
        if self.pending:
            out["pending"] = copy.deepcopy(self.pending)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunState:
        """The run state in ``data`` (a meta's run keys; other keys are not read)."""
        return cls(
            phase=data["phase"],
            rl_iteration=int(data["rl_iteration"]),
            policy_version=int(data.get("policy_version", 0)),
            evals=copy.deepcopy(dict(data.get("evals", {}))),
            checkpoint=int(data.get("checkpoint", -1)),
            sft_iterator=copy.deepcopy(data.get("sft_iterator")),
            pending=copy.deepcopy(list(data.get("pending", []))),
        )


RUN_KEYS = frozenset(f.name for f in dataclasses.fields(RunState))


@dataclasses.dataclass(frozen=True)
class CheckpointMeta:
    """A checkpoint's JSON meta: what its state tree holds and what goes with it.

    Attributes:
      run: the run state.
      curriculum: ``Curriculum.state_dict()`` at the checkpoint.
      reference: the frozen KL reference's item beside the checkpoints (``REFERENCE``), or None
        (the KL term is off, or the checkpoint is from SFT).
      has_ref: an old checkpoint (``"has_ref": true``) whose state tree holds the reference as
        item ``ref`` (never written now).
    """

    run: RunState
    curriculum: dict[str, Any]
    reference: str | None = None
    has_ref: bool = False

    def to_json(self) -> dict[str, Any]:
        out = dict(self.run.to_json(), curriculum=copy.deepcopy(self.curriculum))
        if self.reference is not None:
            out["reference"] = self.reference
        if self.has_ref:
            out["has_ref"] = True
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CheckpointMeta:
        """Reads a meta of any version.

        Raises:
          ValueError: a key no version wrote, or a required one missing (``phase``,
            ``rl_iteration``, ``curriculum``).
        """
        unknown = sorted(set(data) - RUN_KEYS - {"curriculum", "reference", "has_ref"})
        missing = sorted({"phase", "rl_iteration", "curriculum"} - set(data))
        if unknown or missing:
            raise ValueError(
                f"checkpoint meta: unknown keys {unknown}, missing keys {missing}; "
                f"was it written by another program?"
            )
        return cls(
            run=RunState.from_json(data),
            curriculum=copy.deepcopy(data["curriculum"]),
            reference=data.get("reference") or None,
            has_ref=bool(data.get("has_ref", False)),
        )


@dataclasses.dataclass(frozen=True)
class Restored:
    """A checkpoint read back (``restore_latest``).

    Attributes:
      step: its number.
      meta: its meta.
      train: the state of its phase: the SFT learner's during SFT, else the RL learner's.
      reference: the frozen KL reference (None: not asked for, the KL term is off, or SFT).
    """

    step: int
    meta: CheckpointMeta
    train: Any
    reference: Any = None


def restore_latest(
    checkpointer: Checkpointer,
    config: RunConfig,
    *,
    policy: Any,
    critic: Any,
    learner: Any,
    mesh: Any = None,
    reference: bool = True,
) -> Restored | None:
    """The newest checkpoint, read straight into the layout of the run's state; None if none.

    The JSON meta says what the state tree holds (the SFT phase's state, or the RL state) and
    which frozen reference goes with it, so the abstract tree is built first: shapes and
    shardings only, each array then read straight into its layout. (The SFT optimizer's structure
    does not depend on the schedule's length.)

    Args:
      checkpointer: the run's checkpoints.
      config: the run's config.
      policy, critic: the run's models (their shapes and layouts; critic None without one).
      learner: the run's RL learner (``build.rl_learner``): the RL state's structure.
      mesh: the learner's mesh (the SFT state's layout).
      reference: read the frozen KL reference too (an evaluation needs none).
    """
    step = checkpointer.latest_step()
    if step is None:
        return None
    saved = CheckpointMeta.from_json(checkpointer.read_meta(step))
    if saved.run.phase == "sft":
        sft = build.sft_learner(config, policy, 1, mesh)
        template = {"train": sft.abstract_state(policy)}
    else:
        # With LoRA the RL state holds the adapters too (build.rl_policy: fresh ones, shapes only).
        template = {"train": learner.abstract_state(build.rl_policy(config, policy), critic)}
        if saved.has_ref:  # written before the reference was saved once
            template["ref"] = template["train"].policy
    state, raw = checkpointer.restore(step, template)
    meta = CheckpointMeta.from_json(raw)
    ref = None
    if meta.run.phase != "sft":
        ref = state.get("ref")
        if meta.reference and reference:
            ref = checkpointer.restore_frozen(
                meta.reference,
                build.reference_copy(template["train"].policy, learner.spec.kl.reference_dtype),
            )
    return Restored(step, meta, state["train"], ref)


def restore_to_play(
    checkpointer: Checkpointer, config: RunConfig, *, policy: Any, mesh: Any = None
):
    """``(restored, learner)``: the newest checkpoint (None if none) as ``launch.eval`` and
    ``launch.export`` read it, to play or write its policy: no KL reference, and the run's RL
    learner (``build.rl_learner`` of ``build.rl_policy``), whose ``policy_graphdef`` an RL-phase
    policy state is of.

    Args:
      checkpointer: the run's checkpoints.
      config: the run's config.
      policy: the run's policy (its shapes and layouts).
      mesh: the learner's mesh.
    """
    critic = build.critic(config, policy)  # the RL state's structure holds it
    learner = build.rl_learner(config, build.rl_policy(config, policy), critic, mesh)
    restored = restore_latest(
        checkpointer,
        config,
        policy=policy,
        critic=critic,
        learner=learner,
        mesh=mesh,
        reference=False,  # not played
    )
    return restored, learner
