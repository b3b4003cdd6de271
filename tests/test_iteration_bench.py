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
