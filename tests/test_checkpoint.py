"""Orbax checkpoints: round trip, keep-last-and-best, resume, and failure mid-write."""

import errno
import json
import os
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.run.checkpoint import Checkpointer, CheckpointWriteError


def _state(seed: int):
    key = jax.random.key(seed)
    return {
        "params": {"w": jax.random.normal(key, (4, 3)), "b": jnp.arange(3.0)},
        "step": jnp.asarray(seed, jnp.int32),
    }


def test_round_trip_restores_arrays_and_meta(tmp_path):
    ckpt = Checkpointer(str(tmp_path / "ckpt"))
    state = _state(7)
    meta = {"curriculum": {"level": "medium", "successes": [1, 0, 1]}, "data_iter": {"pos": 12}}
    ckpt.save(7, state, meta, metrics={"eval/success_rate": 0.5})
    ckpt.wait()
    step, restored, restored_meta = ckpt.restore_latest(jax.eval_shape(lambda: _state(0)))
    assert step == 7
    assert restored_meta == meta
    np.testing.assert_array_equal(restored["params"]["w"], state["params"]["w"])
    np.testing.assert_array_equal(restored["step"], 7)
    ckpt.close()


def test_keeps_last_k_and_the_best(tmp_path):
    ckpt = Checkpointer(str(tmp_path / "ckpt"), keep_last=2, keep_best=1, async_save=False)
    scores = {1: 0.1, 2: 0.9, 3: 0.2, 4: 0.3, 5: 0.25}
    for step, score in scores.items():
        ckpt.save(step, _state(step), {}, metrics={"eval/success_rate": score})
    ckpt.wait()
    assert sorted(ckpt.all_steps()) == [2, 4, 5]
    assert ckpt.best_step() == 2
    ckpt.close()


def test_checkpoint_without_metric_ranks_last(tmp_path):
    ckpt = Checkpointer(str(tmp_path / "ckpt"), keep_last=1, keep_best=1, async_save=False)
    ckpt.save(1, _state(1), {}, metrics={"eval/success_rate": 0.4})
    ckpt.save(2, _state(2), {}, metrics=None)
    ckpt.save(3, _state(3), {}, metrics={"eval/success_rate": float("nan")})
    ckpt.wait()
    assert sorted(ckpt.all_steps()) == [1, 3]
    ckpt.close()


def test_fresh_directory_has_nothing_to_resume(tmp_path):
    ckpt = Checkpointer(str(tmp_path / "ckpt"))
    assert ckpt.restore_latest(jax.eval_shape(lambda: _state(0))) is None
    ckpt.close()


def test_failure_while_writing_leaves_previous_checkpoint_loadable(tmp_path):
    directory = str(tmp_path / "ckpt")
    ckpt = Checkpointer(directory, async_save=False)
    ckpt.save(1, _state(1), {"it": 1})
    ckpt.wait()

    class Unserialisable:
        pass

    with pytest.raises(Exception):  # noqa: B017 - any failure inside the writer will do
        ckpt.save(2, {**_state(2), "bad": Unserialisable()}, {"it": 2})
        ckpt.wait()
    ckpt.close()

    # A new process (a resumed run) sees only the complete checkpoint.
    reopened = Checkpointer(directory)
    step, restored, meta = reopened.restore_latest(jax.eval_shape(lambda: _state(0)))
    assert step == 1 and meta == {"it": 1}
    np.testing.assert_array_equal(restored["params"]["w"], _state(1)["params"]["w"])
    assert not any(name.startswith("2") and "tmp" not in name for name in os.listdir(directory))
    reopened.close()


def test_a_write_cut_short_is_ignored_and_replaced(tmp_path):
    """What a SIGKILL mid-write leaves (orbax's temporary directory, partly written) is never
    restored; writing that step again replaces it. (The real kill: tests/test_train.py.)"""
    directory = tmp_path / "ckpt"
    ckpt = Checkpointer(str(directory))
    assert ckpt.write_finished() and ckpt.on_disk(2) == "absent"
    ckpt.save(2, _state(2), {"n": 2})
    ckpt.wait()
    assert ckpt.write_finished() and ckpt.on_disk(2) == "complete"
    ckpt.close()
    cut = directory / "3.orbax-checkpoint-tmp" / "state.orbax-checkpoint-tmp"
    cut.mkdir(parents=True)
    (cut / "partial").write_bytes(b"\0" * 10)

    resumed = Checkpointer(str(directory))
    assert resumed.on_disk(3) == "writing" and resumed.latest_step() == 2
    step, state, meta = resumed.restore_latest(jax.eval_shape(lambda: _state(0)))
    assert (step, meta) == (2, {"n": 2})
    resumed.save(3, _state(3), {"n": 3})
    resumed.wait()
    assert resumed.on_disk(3) == "complete" and resumed.latest_step() == 3
    assert not (directory / "3.orbax-checkpoint-tmp").exists()
    np.testing.assert_array_equal(
        resumed.restore(3, jax.eval_shape(lambda: _state(0)))[0]["step"], 3
    )
    resumed.close()


def test_meta_is_plain_json(tmp_path):
    ckpt = Checkpointer(str(tmp_path / "ckpt"), async_save=False)
    ckpt.save(3, _state(3), {"a": [1, 2]})
    ckpt.wait()
    with open(tmp_path / "ckpt" / "3" / "meta" / "metadata") as f:
        assert json.load(f) == {"a": [1, 2]}
    ckpt.close()


def _fail_writes(monkeypatch, code: int):
    """Every JSON item write (the meta) fails with OSError ``code``, as a full disk or a
    read-only filesystem makes it fail (orbax's writer itself raises)."""
    from orbax.checkpoint._src.handlers import json_checkpoint_handler

    async def failing(self, x, directory):
        raise OSError(code, os.strerror(code), str(directory))

    monkeypatch.setattr(json_checkpoint_handler.JsonCheckpointHandler, "_save_fn", failing)


@pytest.mark.parametrize("async_save", [False, True])
@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS])
def test_failed_write_names_the_path_and_the_previous_checkpoint_restores(
    tmp_path, monkeypatch, async_save, code
):
    directory = str(tmp_path / "ckpt")
    ckpt = Checkpointer(directory, async_save=async_save)
    ckpt.save(1, _state(1), {"it": 1})
    ckpt.wait()
    with monkeypatch.context() as m:
        _fail_writes(m, code)
        with pytest.raises(CheckpointWriteError) as e:
            ckpt.save(2, _state(2), {"it": 2})
            ckpt.wait()  # an asynchronous write fails here
    message = str(e.value)
    assert f"cannot write checkpoint 2 to {os.path.join(directory, '2')}: OSError" in message
    assert os.strerror(code) in message and "the previous checkpoint 1 is intact" in message
    assert "\n" not in message
    ckpt.close()  # the failure was reported once: closing does not raise it again

    # The resumed run (a new process) restores step 1 intact and can write step 2 after all.
    reopened = Checkpointer(directory, async_save=async_save)
    step, restored, meta = reopened.restore_latest(jax.eval_shape(lambda: _state(0)))
    assert step == 1 and meta == {"it": 1}
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(_state(1))):
        np.testing.assert_array_equal(got, want)
    reopened.save(2, _state(2), {"it": 2})
    reopened.wait()
    assert reopened.restore(2, jax.eval_shape(lambda: _state(0)))[1] == {"it": 2}
    reopened.close()


def test_failed_write_waits_only_for_its_own_writer_threads(tmp_path, monkeypatch):
    ckpt = Checkpointer(str(tmp_path / "ckpt"), async_save=True)
    ckpt.save(1, _state(1), {"it": 1})
    ckpt.wait()
    _fail_writes(monkeypatch, errno.ENOSPC)
    ckpt.save(2, _state(2), {"it": 2})
    # A thread the run starts while the write is under way (data loading, say) never ends soon.
    done = threading.Event()
    threading.Thread(target=done.wait, args=(60,), daemon=True).start()
    t0 = time.monotonic()
    with pytest.raises(CheckpointWriteError, match="checkpoint 2"):
        ckpt.wait()
    assert time.monotonic() - t0 < 10, "the failure waited for a thread that is not orbax's"
    done.set()
    ckpt.close()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through file permissions")
def test_read_only_directory_fails_naming_the_path(tmp_path):
    directory = tmp_path / "ckpt"
    ckpt = Checkpointer(str(directory), async_save=False)
    ckpt.save(1, _state(1), {"it": 1})
    os.chmod(directory, 0o555)
    try:
        with pytest.raises(CheckpointWriteError, match=f"checkpoint 2 to {directory / '2'}"):
            ckpt.save(2, _state(2), {"it": 2})
    finally:
        os.chmod(directory, 0o755)
        ckpt.close()


# ---------------------------------------------------------------- frozen items, URLs


def test_frozen_item_is_written_once_kept_through_pruning_and_restored(tmp_path):
    ckpt = Checkpointer(str(tmp_path / "ckpt"), keep_last=1, keep_best=0, async_save=False)
    frozen = _state(3)
    ckpt.save_frozen("reference", frozen)
    for step in range(1, 4):  # pruning keeps only the last numbered checkpoint
        ckpt.save(step, _state(step), {"reference": "reference"})
    assert ckpt.all_steps() == [3]
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["3", "reference"]
    got = ckpt.restore_frozen("reference", jax.eval_shape(lambda: _state(0)))
    np.testing.assert_array_equal(got["params"]["w"], frozen["params"]["w"])
    # Written again (a resumed SFT phase ending again): replaced, not an error.
    ckpt.save_frozen("reference", _state(4))
    got = ckpt.restore_frozen("reference", jax.eval_shape(lambda: _state(0)))
    np.testing.assert_array_equal(got["step"], 4)
    ckpt.close()


def test_missing_or_misnamed_frozen_item_fails_naming_it(tmp_path):
    ckpt = Checkpointer(str(tmp_path / "ckpt"), async_save=False)
    with pytest.raises(FileNotFoundError, match=r"need reference at .*ckpt/reference, which is"):
        ckpt.restore_frozen("reference", jax.eval_shape(lambda: _state(0)))
    for name in ("", "3", "a/b"):
        with pytest.raises(ValueError, match="expected a non-numeric directory name"):
            ckpt.frozen_path(name)
    ckpt.close()


def test_paths_leave_urls_unchanged():
    from agentrl_jax.run import paths

    assert paths.is_url("gs://bucket/runs/x") and paths.is_url("s3://b/k")
    assert not paths.is_url("runs/x") and not paths.is_url("/abs/gs://x")
    assert paths.absolute("gs://bucket/runs/x") == "gs://bucket/runs/x"
    assert paths.absolute("runs/x") == os.path.join(os.getcwd(), "runs", "x")


def test_checkpointer_hands_a_url_directory_to_orbax_unchanged(monkeypatch):
    """No network: orbax's manager is replaced by a recorder of the directory it is given."""
    import orbax.checkpoint as ocp

    seen = []
    monkeypatch.setattr(ocp, "CheckpointManager", lambda directory, **kw: seen.append(directory))
    ckpt = Checkpointer("gs://bucket/runs/x/checkpoints")
    assert seen == ["gs://bucket/runs/x/checkpoints"]
    assert ckpt.step_path(4) == "gs://bucket/runs/x/checkpoints/4"
    assert ckpt.frozen_path("reference") == "gs://bucket/runs/x/checkpoints/reference"
