"""Orbax checkpoints of the whole training state: keep the last k and the best, asynchronously.

A checkpoint holds two items: ``state`` (a pytree of arrays: the trainer saves params, optimizer
states, the value model and the step counter) and ``meta`` (JSON: phase, RL iteration, the
checkpoint counter, curriculum state, the SFT data-iterator state, evaluations). What never
changes during a run (the frozen KL reference policy) is written once as a *frozen item* beside
the numbered checkpoints (``save_frozen``: ``directory/<name>``), and the checkpoints' meta names
it. No RNG state is saved: the trainer derives every key from (seed, iteration), so a resumed run
draws the same numbers. Orbax writes each step into ``<step>.orbax-checkpoint-tmp`` and renames it
to ``<step>`` when complete, so a crash, a SIGKILL or a failure mid-write leaves the previous
checkpoint intact and loadable: ``latest_step`` never sees the unfinished directory, and writing
that step again replaces it (``on_disk`` tells the three states apart).

A write that fails (disk full, read-only or vanished directory) raises
:class:`CheckpointWriteError` naming the checkpoint's path, from ``save`` (synchronous writes, or
the previous asynchronous write's failure) or ``wait``/``close`` (an asynchronous write).
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath  # orbax's path library: local paths and URLs alike
from orbax.checkpoint import checkpoint_managers as cm

from agentrl_jax.run import paths

# What orbax appends to a step's directory name while writing it (renamed away when complete).
TMP_SUFFIX = ".orbax-checkpoint-tmp"


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written; the message names its path and the cause."""


class Checkpointer:
    """Saves and restores training state under ``directory``.

    Args:
      directory: where step directories live (created if missing).
      keep_last: how many of the most recent checkpoints to keep.
      keep_best: how many of the best checkpoints (by ``best_metric``) to keep besides those.
      best_metric: the metric that ranks checkpoints; a checkpoint saved without it ranks last.
      best_mode: 'max' or 'min'.
      async_save: write in a background thread (``wait()`` blocks until written).
    """

    def __init__(
        self,
        directory: str,
        *,
        keep_last: int = 3,
        keep_best: int = 1,
        best_metric: str = "eval/success_rate",
        best_mode: str = "max",
        async_save: bool = True,
    ):
        if best_mode not in ("max", "min"):
            raise ValueError(f"best_mode must be 'max' or 'min', got {best_mode!r}")
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        self.directory = paths.absolute(directory)  # a gs:// URL stays one (orbax writes it)
        self.best_metric = best_metric
        self._worst = -math.inf if best_mode == "max" else math.inf
        policies = [cm.LatestN(n=keep_last)]
        if keep_best > 0:
            policies.append(
                cm.BestN(
                    get_metric_fn=lambda m: m.get(best_metric, self._worst),
                    reverse=best_mode == "min",  # BestN keeps the tail of the sorted list
                    n=keep_best,
                )
            )
        options = ocp.CheckpointManagerOptions(
            preservation_policy=cm.AnyPreservationPolicy(policies),
            # best_fn also makes orbax store each step's metrics (read by best_step()).
            best_fn=lambda m: m.get(best_metric, self._worst),
            best_mode=best_mode,
            enable_async_checkpointing=async_save,
            create=True,
        )
        self._manager = ocp.CheckpointManager(
            self.directory, options=options, item_names=("state", "meta")
        )
        self._writing: int | None = None  # the step an asynchronous write is under way for
        self._threads_before_write: set[threading.Thread] = set()

    def step_path(self, step: int) -> str:
        """The directory checkpoint ``step`` is (or would be) written to."""
        return os.path.join(self.directory, str(step))

    def on_disk(self, step: int) -> str:
        """Where checkpoint ``step`` stands on disk: ``"complete"`` (its directory is final),
        ``"writing"`` (only orbax's temporary ``<step>.orbax-checkpoint-tmp`` exists: a write
        under way, or one a killed process never finished) or ``"absent"``."""
        if epath.Path(self.step_path(step)).exists():
            return "complete"
        if any(epath.Path(self.directory).glob(f"{step}{TMP_SUFFIX}*")):
            return "writing"
        return "absent"

    def write_finished(self) -> bool:
        """Whether the last write started is complete on disk (True when none is under way)."""
        return self._writing is None or self.on_disk(self._writing) == "complete"

    def _failed(self, step: int, error: BaseException) -> CheckpointWriteError:
        previous = self.latest_step()
        kept = f"checkpoint {previous} is intact" if previous is not None else "none was complete"
        return CheckpointWriteError(
            f"cannot write checkpoint {step} to {self.step_path(step)}: "
            f"{type(error).__name__}: {error} (the previous {kept})"
        )

    def save(
        self, step: int, state: Any, meta: dict[str, Any], metrics: dict[str, float] | None = None
    ) -> None:
        """Starts writing ``state`` and ``meta`` as checkpoint ``step``.

        Raises:
          CheckpointWriteError: this write failed (synchronous), or the previous one did.
        """
        metrics = {k: float(v) for k, v in (metrics or {}).items()}
        value = metrics.get(self.best_metric, self._worst)
        if not math.isfinite(value):
            value = self._worst
        metrics[self.best_metric] = value
        self.wait()  # A failed asynchronous write surfaces here, before the next one starts.
        self._writing = step
        self._threads_before_write = set(threading.enumerate())
        try:
            self._manager.save(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)
                ),
                metrics=metrics,
            )
        except Exception as e:  # Whatever the writer raised: the run cannot go on without it.
            self._writing = None
            self._join_writers()
            raise self._failed(step, e) from e

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def best_step(self) -> int | None:
        """The kept step with the best ``best_metric``, or None when nothing is saved."""
        return self._manager.best_step()

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict[str, Any]]:
        """Restores checkpoint ``step`` into the structure, shapes and shardings given.

        ``abstract_state`` is a pytree of arrays or ``jax.ShapeDtypeStruct`` (with ``sharding``),
        e.g. from ``jax.eval_shape``; each array is read straight into its sharded layout.
        """
        abstract = jax.tree.map(_as_abstract, abstract_state)
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()
            ),
        )
        return restored.state, dict(restored.meta)

    def read_meta(self, step: int) -> dict[str, Any]:
        """Checkpoint ``step``'s JSON meta alone (no array is read)."""
        restored = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        return dict(restored.meta)

    def restore_latest(self, abstract_state: Any) -> tuple[int, Any, dict[str, Any]] | None:
        """(step, state, meta) of the newest complete checkpoint, or None when there is none."""
        step = self.latest_step()
        if step is None:
            return None
        state, meta = self.restore(step, abstract_state)
        return step, state, meta

    def frozen_path(self, name: str) -> str:
        """Where frozen item ``name`` is (or would be) written."""
        if not name or name.isdigit() or "/" in name:
            raise ValueError(f"frozen item name {name!r}: expected a non-numeric directory name")
        return os.path.join(self.directory, name)

    def save_frozen(self, name: str, state: Any) -> None:
        """Writes ``state`` once as frozen item ``name`` (synchronously; replaces an earlier one).

        Numbered checkpoints are pruned (keep last k, keep best); a frozen item is not, so the
        checkpoints that name it in their meta can all be restored.

        Raises:
          CheckpointWriteError: naming the item's path and the cause.
        """
        path = self.frozen_path(name)
        try:
            with ocp.StandardCheckpointer() as checkpointer:
                checkpointer.save(path, state, force=True)
                checkpointer.wait_until_finished()
        except Exception as e:  # Whatever the writer raised: the run cannot go on without it.
            raise CheckpointWriteError(
                f"cannot write {name} to {path}: {type(e).__name__}: {e}"
            ) from e

    def restore_frozen(self, name: str, abstract_state: Any) -> Any:
        """Frozen item ``name``, read into the structure, shapes and shardings given.

        Raises:
          FileNotFoundError: it was never written (or was deleted), naming the path.
        """
        path = self.frozen_path(name)
        if not epath.Path(path).exists():
            raise FileNotFoundError(
                f"the checkpoints in {self.directory} need {name} at {path}, which is missing; "
                "put it back, or start the run in a new workdir"
            )
        with ocp.StandardCheckpointer() as checkpointer:
            return checkpointer.restore(path, jax.tree.map(_as_abstract, abstract_state))

    def wait(self) -> None:
        """Blocks until the write under way is complete.

        Raises:
          CheckpointWriteError: it failed (reported once; the checkpointer stays usable).
        """
        step, self._writing = self._writing, None
        try:
            self._manager.wait_until_finished()
        except Exception as e:  # Whatever the background writer raised.
            self._join_writers()
            raise self._failed(step if step is not None else -1, e) from e

    def _join_writers(self, timeout_s: float = 120.0) -> None:
        """Waits for the failed write's other background threads: orbax reports the first item
        that failed while the others may still be writing into the step's temporary directory,
        which the next attempt at that step deletes."""
        deadline = time.monotonic() + timeout_s
        for thread in set(threading.enumerate()) - self._threads_before_write:
            # Only orbax's own threads: others the run started since (data loading, the
            # watchdog) are none of the checkpoint's business and may never end.
            if thread is threading.current_thread() or not _is_orbax(thread):
                continue
            # orbax's threads re-raise their own failure from join(); the first failure is
            # the one the caller reports.
            with contextlib.suppress(Exception):
                thread.join(max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        """Waits for the write under way, then releases orbax's threads (even if it failed)."""
        try:
            self.wait()
        finally:
            self._manager.close()


def _is_orbax(thread: threading.Thread) -> bool:
    """Whether orbax started ``thread`` (its futures' thread class, or a target of its code)."""
    target = getattr(thread, "_target", None)
    return any(
        (getattr(x, "__module__", None) or "").startswith("orbax") for x in (type(thread), target)
    )


def _as_abstract(x):
    if isinstance(x, jax.ShapeDtypeStruct):
        return x
    if isinstance(x, jax.Array):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
    return x
