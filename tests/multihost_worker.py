"""One process of a small multi-host check, started by ``tests/test_multihost.py`` (N copies).

    python tests/multihost_worker.py MODE COORDINATOR NUM_PROCESSES PROCESS_ID

Modes:
  exchange: episode-sized payloads of a new length every "iteration" all-gathered, and the
    policy's local replica refreshed, as the trainer does; prints the XLA compilations of each
    iteration as ``compiles <it> <n>``.
"""

from __future__ import annotations

import os
import sys

import jax
import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

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
    mesh = sharding.make_mesh((jax.device_count(), 1, 1))
    local = multihost.local_mesh()
    params = jax.device_put(
        {"w": np.arange(jax.device_count() * 6, dtype=np.float32).reshape(-1, 6)},
        sharding.named_sharding(mesh, ("batch", None), (jax.device_count(), 6)),
    )
    rng = np.random.default_rng(jax.process_index())
    for it in range(6):
        with CompileCounter() as counter:
            replica = multihost.local_replica(params, mesh, local)
            whole = multihost.host_array(params["w"])
            np.testing.assert_array_equal(np.asarray(replica["w"]), whole)
            # Episodes of a new size every iteration (a pickled list of token-id arrays of about
            # 5.6-7.3 kB: new lengths, one power-of-two bucket).
            episodes = [rng.integers(0, 300, size=int(n)) for n in rng.integers(80, 100, size=8)]
            gathered = multihost.allgather_objects(episodes)
            assert len(gathered) == jax.process_count()
            for p, block in enumerate(gathered):
                assert len(block) == 8, (p, len(block))
            np.testing.assert_array_equal(gathered[jax.process_index()][3], episodes[3])
        print(f"compiles {it} {counter.count}", flush=True)


def main() -> None:
    mode, coordinator, count, index = sys.argv[1:5]
    jax.config.update("jax_threefry_partitionable", True)
    jax.distributed.initialize(coordinator, int(count), int(index))
    {"exchange": exchange}[mode]()


if __name__ == "__main__":
    main()
