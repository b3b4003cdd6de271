"""docs/custom_losses.md's example: a user's estimator and loss, registered from their own module
(docs/examples/custom_rl.py), checked by hand and then trained with through the CLI alone."""

import json
import logging
import math
import os
import sys

import numpy as np
import pytest
import train_cli
from flax import nnx

from agentrl_jax import kernels
from agentrl_jax.benchmarks.learner import synthetic_episodes
from agentrl_jax.models import CausalLM, preset
from agentrl_jax.rl.rl_update import RLUpdate
from agentrl_jax.run.build import rl_learner
from agentrl_jax.run.config import from_config_dict, load_config_file
from agentrl_jax.run.tensorboard import read_scalars

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(REPO, "docs", "examples")
NAMES = ("batch_mean_baseline", "truncated_is_pg")


@pytest.fixture
def custom_rl(monkeypatch):
    """The example module imported as a user would (on sys.path); unregistered afterwards."""
    monkeypatch.syspath_prepend(EXAMPLES)
    sys.modules.pop("custom_rl", None)
    import custom_rl

    yield custom_rl
    for name in NAMES:
        kernels.registry.unregister(name)
    sys.modules.pop("custom_rl", None)


def test_the_example_registers_both_names(custom_rl):
    assert kernels.get_advantage_estimator("batch_mean_baseline") is custom_rl.batch_mean_baseline
    assert not kernels.get_advantage_spec("batch_mean_baseline").needs_values
    assert kernels.get_policy_loss("truncated_is_pg") is custom_rl.truncated_is_pg


def test_batch_mean_baseline_by_hand(custom_rl):
    # Three episodes with returns 3, 0 and 1 (two, one and two steps) and a padding row.
    batch = kernels.make_batch(
        loss_mask=np.array([[0, 1, 0, 1], [0, 1, 1, 0], [0, 1, 0, 1], [0, 0, 0, 0]]),
        step_ids=np.array([[-1, 0, -1, 1], [-1, 0, 0, -1], [-1, 0, -1, 1], [-1, -1, -1, -1]]),
        rewards=np.array([[1.0, 2.0], [0.0, 0.0], [0.0, 1.0], [0.0, 0.0]]),
        step_mask=np.array([[1, 1], [1, 0], [1, 1], [0, 0]]),
        group_ids=np.array([0, 1, 2, 3]),
    )
    out = kernels.get_advantage_estimator("batch_mean_baseline")(batch, kernels.AdvantageConfig())
    # Baseline (3 + 0 + 1) / 3 over the real rows; the padding row gets nothing.
    b = 4 / 3
    want = [[0, 3 - b, 0, 3 - b], [0, -b, -b, 0], [0, 1 - b, 0, 1 - b], [0, 0, 0, 0]]
    np.testing.assert_allclose(np.asarray(out.tokens), want, atol=1e-6)
    assert out.steps is None and out.returns is None


def test_truncated_is_pg_by_hand(custom_rl):
    import jax

    logp = np.log(np.array([[0.5, 0.2, 0.9]], np.float32))
    old = np.log(np.array([[0.5, 0.05, 0.3]], np.float32))  # ratios 1, 4, 3
    adv = np.array([[1.0, -2.0, 0.5]], np.float32)
    mask = np.array([[1.0, 1.0, 0.0]], np.float32)  # the third token is not the agent's
    cfg = kernels.LossConfig()
    loss, metrics = kernels.get_policy_loss("truncated_is_pg")(logp, old, adv, mask, config=cfg)
    # Weights min(r, 2) = 1, 2 over the two agent tokens; token mean.
    want = -(1.0 * 1.0 * logp[0, 0] + 2.0 * -2.0 * logp[0, 1]) / 2
    assert float(loss.value) == pytest.approx(want, rel=1e-5)
    assert float(metrics["truncated_frac"].value) == pytest.approx(0.5)
    # No gradient through the weight: d loss / d logp_t = -w_t A_t / 2.
    grad = jax.grad(lambda lp: custom_rl.truncated_is_pg(lp, old, adv, mask, config=cfg)[0].value)
    np.testing.assert_allclose(np.asarray(grad(logp)), [[-0.5, 2.0, 0.0]], atol=1e-6)


def test_an_rl_update_runs_the_plugin_estimator_and_loss(custom_rl, caplog):
    """The config names the plugin module and both names; one RL update (the trainer's RLUpdate on
    the :test config's shapes) calls the estimator and logs the loss's own metric."""
    del custom_rl  # on sys.path; from_config_dict imports it as config.plugins says
    cd = load_config_file(os.path.join(REPO, "configs", "tiny_textworld.py") + ":test")
    cd.plugins = ("custom_rl",)
    cd.rl.algo, cd.rl.loss = NAMES
    config = from_config_dict(cd)
    cfg = preset(
        config.model.preset, vocab_size=config.model.tokenizer_vocab, **dict(config.model.overrides)
    )
    assert not config.needs_critic  # registered with needs_values=False
    policy = CausalLM(cfg, rngs=nnx.Rngs(0))
    learner = rl_learner(config, policy, None)
    update = RLUpdate(learner.spec, learner, pad_id=0)
    trajs = synthetic_episodes(2, config.rollout.group_size, cfg.vocab_size, 3)
    with caplog.at_level(logging.INFO):
        _, metrics = update(
            learner.init(policy, None),
            nnx.state(policy, nnx.Param),
            trajs,
            np.random.default_rng(0),
            0,
        )
    assert "batch_mean_baseline: advantages for" in caplog.text
    for tag in ("losses/truncated_frac", "losses/policy_loss", "losses/total", "train/grad_norm"):
        assert math.isfinite(metrics[tag]), (tag, metrics[tag])
    assert metrics["train/updates"] > 0


@pytest.mark.slow  # ~70 s: a whole run; the update above runs the same plugins in-process
def test_cli_trains_with_the_plugin_estimator_and_loss(textworld_games, tmp_path):
    """The README's command on the :test config: plugins, algo and loss from flags alone."""
    workdir = tmp_path / "custom"
    cmd = train_cli.train_cmd(
        workdir,
        "--config.plugins=custom_rl",
        "--config.rl.algo=batch_mean_baseline",
        "--config.rl.loss=truncated_is_pg",
    )
    proc = train_cli.start(
        cmd, textworld_games["root"], tmp_path / "custom.log", PYTHONPATH=EXAMPLES
    )
    (text,) = train_cli.finish(proc)
    assert "RL gain" in text  # the before/after table: training finished

    # The estimator ran every RL iteration (it logs once per call).
    assert text.count("batch_mean_baseline: advantages for") == 3, text[-4000:]
    scalars = read_scalars(str(workdir / "tensorboard"))
    # The loss ran in every update: its own metric is in TensorBoard at every RL iteration.
    assert sorted(step for step, _ in scalars["losses/truncated_frac"]) == [1, 2, 3]
    for tag in ("losses/truncated_frac", "losses/policy_loss", "losses/total", "train/grad_norm"):
        values = [v for _, v in scalars[tag]]
        assert values and all(math.isfinite(v) for v in values), (tag, values)
    assert all(v == 0.0 for _, v in scalars["train/skipped_nonfinite"])
    assert all(v > 0 for _, v in scalars["train/updates"])

    config = json.loads((workdir / "config.json").read_text())
    assert config["plugins"] == ["custom_rl"]
    assert config["rl"]["algo"] == "batch_mean_baseline"
    assert config["rl"]["loss"] == "truncated_is_pg"
    assert any((workdir / "checkpoints").iterdir())


def test_the_doc_shows_the_example_module_as_it_is():
    """docs/custom_losses.md quotes docs/examples/custom_rl.py (below its docstring) verbatim."""
    import ast
    import pathlib
    import re

    source = pathlib.Path(EXAMPLES, "custom_rl.py").read_text()
    body = source.splitlines()[ast.parse(source).body[1].lineno - 1 :]
    doc = pathlib.Path(REPO, "docs", "custom_losses.md").read_text()
    block = re.search(r"<!-- custom-rl-example -->\s*```python\n(.*?)```", doc, re.S)
    assert block and block.group(1).strip() == "\n".join(body).strip()
    for flag in ("--config.plugins=custom_rl", "--config.rl.algo=batch_mean_baseline"):
        assert flag in doc
