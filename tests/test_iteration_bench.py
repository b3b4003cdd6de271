"""``launch.bench iteration``'s choice of run: any config (``--config``) and settings (``--set``).

The benchmark itself runs in ``tests/test_device_check.py`` (slow: the dry run of the device
check); here only the config it would run is built."""

import os

import pytest

from agentrl_jax.benchmarks import iteration

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_another_config_runs_its_own_tasks_shrunk_with_the_settings_given(monkeypatch):
    monkeypatch.chdir(REPO)
    spec = iteration.Spec(
        workdir="unused",
        cache="unused",
        config="configs/alfworld_tiny.py",
        overrides=(("rollout.show_admissible", True), ("env.kwargs.max_steps", 30)),
    )
    run = iteration.bench_config(spec)
    assert run.env.name == "alfworld" and run.rollout.context_mode == "episode"
    assert run.env.eval_levels == ("all@valid_seen",) and run.env.num_eval_tasks == 16
    assert run.env.num_train_tasks == 64 and run.budget.sft_fraction == 0.0
    assert run.rollout.show_admissible and dict(run.env.kwargs)["max_steps"] == 30


def test_the_default_runs_as_before(monkeypatch):
    monkeypatch.chdir(REPO)
    run = iteration.bench_config(iteration.Spec(workdir="unused", cache="unused"))
    assert run.env.eval_levels == ("simple",) and run.env.num_eval_tasks == 16
    assert run.env.num_train_tasks == 64 and run.rl.task_pool == "all"


def test_quick_is_the_defaults_only_and_settings_parse_as_literals():
    with pytest.raises(ValueError, match="--quick runs configs/tiny_textworld.py:test"):
        iteration.run(quick=True, config="configs/alfworld_tiny.py")
    setting = iteration.setting
    assert setting("rollout.show_admissible=True") == ("rollout.show_admissible", True)
    assert setting("rollout.system_prompt=Act.") == ("rollout.system_prompt", "Act.")
    with pytest.raises(ValueError, match="expected section.field=value"):
        setting("rollout.show_admissible")


def test_the_benches_take_each_familys_small_presets():
    """The device check measures every family (issue #42): the iteration bench's models are
    presets, and each has a one-layer quick form of its own family (Gemma 3's first layer type
    with it)."""
    from agentrl_jax.models import registry
    from agentrl_jax.models.config import PRESETS, preset

    assert {"qwen3-0.6b", "llama3.2-1b", "gemma3-1b"} <= set(iteration.MODELS) <= set(PRESETS)
    for name in iteration.MODELS:
        full = preset(name)
        quick = full.with_layers(1)
        assert quick.num_layers == 1 and quick.family == full.family
        assert quick.layer_types == full.layer_types[:1]
        assert registry.family(quick) is registry.family(full)
        assert quick.num_params < full.num_params or full.num_layers == 1
    with pytest.raises(ValueError, match="--model='qwen3-8b': expected one of tiny, "):
        iteration.run(quick=True, model="qwen3-8b")
