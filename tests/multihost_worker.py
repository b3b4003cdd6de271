"""One process of a small multi-host check, started by ``tests/test_multihost.py`` (N copies).

    python tests/multihost_worker.py MODE COORDINATOR NUM_PROCESSES PROCESS_ID

Modes:
  exchange: episode-sized payloads of a new length every "iteration" all-gathered, and the
    policy's local bf16 copy (split over the process's devices) refreshed, as the trainer does;
    prints the XLA compilations of each iteration as ``compiles <it> <n>``.
  agree: the trainer's agreement check, passed once, then failed on a process that differs in
    config, code, tasks and tokenizer; prints ``agreed`` then the error (exit status 3).
"""

from __future__ import annotations

import os
import sys

import jax
import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tests"))

from agentrl_jax import sharding  # noqa: E402
from agentrl_jax.training import multihost  # noqa: E402

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


class CompileCounter:
    """Counts XLA backend compilations (jax.monitoring) while active."""

    def __init__(self):
        self.count = 0

    def __call__(self, event: str, duration: float, **kwargs) -> None:
        if event == COMPILE_EVENT:
            self.count += 1

    def __enter__(self):
        jax.monitoring.register_event_duration_secs_listener(self)
        return self

    def __exit__(self, *exc):
        jax.monitoring.unregister_event_duration_listener(self)


def exchange() -> None:
    import jax.numpy as jnp
    from flax import nnx

    from agentrl_jax.models import Qwen2ForCausalLM
    from agentrl_jax.models.testing import TEST_CONFIG, random_model

    # FSDP over every process's devices: each process's copy gathers shards from the others.
    mesh = sharding.make_mesh((1, jax.device_count(), 1))
    cfg = TEST_CONFIG.replace(num_layers=1)
    local = multihost.local_mesh(cfg)
    assert dict(local.shape) == {"data": 1, "fsdp": 1, "tp": jax.local_device_count()}, local
    params = nnx.state(random_model(Qwen2ForCausalLM, cfg, mesh=mesh), nnx.Param)
    rng = np.random.default_rng(jax.process_index())
    copy = None
    for it in range(6):
        with CompileCounter() as counter:
            # As the trainer does: the old copy goes before the new one is made.
            if copy is not None:
                jax.tree.map(lambda x: x.delete(), copy)
            copy = multihost.local_copy(params, local, jnp.bfloat16)
            for got, want in zip(jax.tree.leaves(copy), jax.tree.leaves(params)):
                assert got.dtype == jnp.bfloat16 and got.sharding.mesh == local, got.sharding
                whole = multihost.host_array(want).astype(jnp.bfloat16)
                np.testing.assert_array_equal(np.asarray(got), whole)
            mlp = copy["trunk"]["layers"][0]["mlp"]["gate_weight_df"][...]
            tp = local.shape["tp"]  # split over the process's devices, not replicated
            assert mlp.sharding.shard_shape(mlp.shape) == (64, 96 // tp), mlp.sharding
            # Episodes of a new size every iteration (a pickled list of token-id arrays of about
            # 5.6-7.3 kB: new lengths, one power-of-two bucket).
            episodes = [rng.integers(0, 300, size=int(n)) for n in rng.integers(80, 100, size=8)]
            gathered = multihost.allgather_objects(episodes)
            assert len(gathered) == jax.process_count()
            for p, block in enumerate(gathered):
                assert len(block) == 8, (p, len(block))
            np.testing.assert_array_equal(gathered[jax.process_index()][3], episodes[3])
        print(f"compiles {it} {counter.count}", flush=True)


def agree() -> None:
    """Two checks of the trainer's run fingerprint: first identical everywhere, then with process
    1 on another learning rate, another copy of trainer.py, another eval task list and another
    vocabulary."""
    import types

    import train_cli

    from agentrl_jax.envs.base import Task
    from agentrl_jax.training.config import from_config_dict
    from agentrl_jax.training.trainer import Trainer

    def fingerprint(differ: bool):
        config = from_config_dict(train_cli.tiny_config(rl=dict(actor_lr=2e-4 if differ else 1e-4)))
        eval_ids = ["v/0", "v/9" if differ else "v/1"]
        trainer = types.SimpleNamespace(
            config=config,
            train_tasks={"simple": [Task("textworld", "train", f"simple/{i}") for i in range(3)]},
            eval_tasks={"simple": [Task("textworld", "valid", i) for i in eval_ids]},
            tokenizer=types.SimpleNamespace(
                get_vocab=lambda: {"a": 0, "b": 1, "c" if differ else "d": 2},
                all_special_tokens=["<pad>"],
            ),
        )
        out = Trainer._fingerprint(trainer)
        out["tokenizer"] = Trainer._tokenizer_fingerprint(trainer)
        if differ:
            out["code"]["agentrl_jax/training/trainer.py"] = "0" * 16
        return out

    multihost.check_agreement(fingerprint(differ=False))
    print("agreed", flush=True)
    try:
        multihost.check_agreement(fingerprint(differ=jax.process_index() == 1))
    except multihost.DisagreementError as e:
        print(f"multi-host error: {e}", flush=True)
        sys.exit(3)
    print("agreed again", flush=True)


def main() -> None:
    mode, coordinator, count, index = sys.argv[1:5]
    jax.config.update("jax_threefry_partitionable", True)
    jax.distributed.initialize(coordinator, int(count), int(index))
    {"exchange": exchange, "agree": agree}[mode]()


if __name__ == "__main__":
    main()
