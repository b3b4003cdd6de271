"""The Weights & Biases writer (agentrl_jax/run/writers.py), offline (no network): it holds the
same scalars as the run's TensorBoard files, read back with tensorboard's event reader and from
the W&B run's own ``.wandb`` protobuf records, and the learning curve as an image."""

import os

import numpy as np
import pytest
import train_cli

from agentrl_jax.run import writers
from agentrl_jax.run.config import (
    ConfigError,
    WandbSection,
    base_config,
    from_config_dict,
)
from agentrl_jax.run.metric_writer import MultiWriter
from agentrl_jax.run.tensorboard import SummaryWriter, png_of_figure, read_scalars

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


def _same(wandb_scalars, tb_scalars):
    """Equal tags, steps and values (TensorBoard keeps float32; W&B the float64 written)."""
    assert sorted(wandb_scalars) == sorted(tb_scalars)
    for tag, rows in tb_scalars.items():
        got = [(s, np.float32(v)) for s, v in wandb_scalars[tag]]
        assert got == [(s, np.float32(v)) for s, v in rows], tag


def test_wandb_writer_holds_what_tensorboard_holds(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tb = SummaryWriter(str(tmp_path / "tensorboard"))
    wb = writers.WandbWriter(WandbSection(enabled=True, name="unit"), str(tmp_path), {"seed": 0})
    writer = MultiWriter([tb, wb])
    writer.scalars({"sft/nll": 2.5, "skip": np.ones(3)}, 1)
    writer.scalars({"sft/nll": 1.25}, 2)
    # Steps restart in the RL phase (0 after SFT) and a resumed run writes a step again.
    writer.scalars({"rollout/return": np.float32(0.1), "eval/success_rate": 0}, 0)
    writer.scalars({"rollout/return": 0.3}, 1)
    writer.scalars({"rollout/return": 0.35}, 1)
    fig = plt.figure(figsize=(2, 1))
    png, height, width = png_of_figure(fig)
    plt.close(fig)
    writer.image_png("learning_curve", png, 1, height, width)
    writer.close()
    writer.close()  # twice is fine
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    scalars = writers.read_wandb_scalars(str(run_dir))
    _same(scalars, read_scalars(str(tmp_path / "tensorboard")))
    assert scalars["rollout/return"] == [(0, pytest.approx(0.1)), (1, 0.3), (1, 0.35)]
    (image,) = writers.read_wandb_media(str(run_dir))["learning_curve"]
    with open(image, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_wandb_is_off_by_default_and_checked():
    cfg = from_config_dict(base_config())
    assert cfg.logging.wandb.enabled is False
    cd = base_config()
    cd.logging.wandb.mode = "cloud"
    with pytest.raises(ConfigError, match=r"config.logging.wandb.mode is 'cloud'; expected one"):
        from_config_dict(cd)
    cd = base_config()
    cd.logging.wandb.projct = "x"
    with pytest.raises(ConfigError, match=r"config.logging.wandb: unknown field\(s\) \['projct'\]"):
        from_config_dict(cd)


@pytest.mark.slow
def test_a_training_run_logs_the_same_scalars_to_wandb_and_tensorboard(tmp_path):
    """launch.train with config.logging.wandb on, offline: every scalar of the run's
    TensorBoard files, at every step, is in the W&B run, and the learning curve is its media."""
    workdir = tmp_path / "run"
    env = dict(
        PYTHONPATH=os.pathsep.join([REPO, TESTS, os.environ.get("PYTHONPATH", "")]),
        JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax_cache"),
        WANDB_MODE="offline",
    )
    cmd = train_cli.train_cmd(
        workdir,
        "--config.plugins=('toy_env_family',)",
        "--config.logging.wandb.enabled=True",
        config=os.path.join("tests", "toy_family_config.py"),
    )
    train_cli.finish(train_cli.start(cmd, tmp_path / "cache", tmp_path / "log", **env))
    (run_dir,) = (workdir / "wandb").glob("offline-run-*")
    tb = read_scalars(str(workdir / "tensorboard"))
    assert "rollout/return" in tb and "losses/policy_loss" in tb
    _same(writers.read_wandb_scalars(str(run_dir)), tb)
    (image,) = writers.read_wandb_media(str(run_dir))["learning_curve"]
    assert os.path.getsize(image) > 1000
