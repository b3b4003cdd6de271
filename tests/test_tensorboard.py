"""TensorBoard event files are real: tensorboard's own loader reads back what was written."""

import math

from agentrl_jax.run.tensorboard import SummaryWriter, read_scalars


def test_scalars_round_trip_through_tensorboard_loader(tmp_path):
    writer = SummaryWriter(str(tmp_path))
    for step in range(3):
        writer.scalars({"rollout/return": step * 0.5, "losses/approx_kl": 0.01 * step}, step)
    writer.scalar("losses/value_loss", float("nan"), 3)
    writer.close()
    scalars = read_scalars(str(tmp_path))
    assert scalars["rollout/return"] == [(0, 0.0), (1, 0.5), (2, 1.0)]
    assert [s for s, _ in scalars["losses/approx_kl"]] == [0, 1, 2]
    assert math.isnan(scalars["losses/value_loss"][0][1])


def test_disabled_writer_writes_nothing(tmp_path):
    writer = SummaryWriter(str(tmp_path / "tb"), enabled=False)
    writer.scalar("x", 1.0, 0)
    writer.close()
    assert not (tmp_path / "tb").exists()
