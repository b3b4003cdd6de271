"""Estimators on a batch sharded over the 8 fake CPU devices give the unsharded numbers."""

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from agentrl_jax import kernels as K


def test_sharded_batch_matches_unsharded():
    rng = np.random.default_rng(0)
    b, t, s = 16, 24, 4
    step_mask = np.ones((b, s), np.int32)
    loss_mask = np.zeros((b, t), np.int32)
    step_ids = np.full((b, t), -1, np.int32)
    for k in range(s):  # env token, then a 3-token action, per step
        loss_mask[:, 6 * k + 1 : 6 * k + 4], step_ids[:, 6 * k + 1 : 6 * k + 4] = 1, k
    batch = K.make_batch(
        loss_mask=loss_mask,
        step_ids=step_ids,
        rewards=rng.integers(0, 2, (b, s)).astype(np.float32),
        step_mask=step_mask,
        group_ids=np.arange(b) // 4,
        state_keys=rng.integers(0, 3, (b, s)),
    )
    values = rng.uniform(-1, 1, (b, t)).astype(np.float32)
    mesh = Mesh(np.array(jax.devices()), ("data",))
    rows = NamedSharding(mesh, PartitionSpec("data"))
    sharded = jax.device_put(batch, rows)
    sharded_values = jax.device_put(values, rows)
    assert len(jax.devices()) == 8
    cfg = K.AdvantageConfig(gamma=0.9)
    for name in ("gae", "gagpo"):
        fn = K.get_advantage_estimator(name)
        want = fn(batch, cfg, values=values if name == "gae" else None).tokens
        got = fn(sharded, cfg, values=sharded_values if name == "gae" else None).tokens
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=1e-6)
