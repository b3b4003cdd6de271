"""The top-level public API: every name resolves, the docstring documents exactly ``__all__``,
``import agentrl_jax`` stays cheap, and config plugins are imported (or fail naming the module)."""

import os
import re
import subprocess
import sys
import textwrap

import pytest

import agentrl_jax
from agentrl_jax import kernels
from agentrl_jax.run.config import (
    ConfigError,
    from_config_dict,
    import_plugins,
    load_config_file,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _documented_names() -> list[str]:
    """The names of the docstring's ``- ``name``: ...`` lines, in order."""
    return re.findall(r"^- ``(\w+)``:", agentrl_jax.__doc__, re.M)


def test_all_matches_the_documented_list():
    documented = _documented_names()
    assert len(documented) == len(set(documented)), "a name is documented twice"
    assert documented == list(agentrl_jax.__all__)
    assert "internal" in agentrl_jax.__doc__  # the rest is declared private


@pytest.mark.parametrize("name", agentrl_jax.__all__)
def test_every_public_name_resolves(name):
    value = getattr(agentrl_jax, name)
    assert value is not None
    assert getattr(agentrl_jax, name) is value  # cached after the first use
    assert name in dir(agentrl_jax)


def test_public_names_are_the_library_objects():
    assert agentrl_jax.register_advantage_estimator is kernels.register_advantage_estimator
    assert agentrl_jax.kernels is kernels
    assert agentrl_jax.from_config_dict is from_config_dict
    assert "grpo" in agentrl_jax.advantage_estimators()
    assert "ppo" in agentrl_jax.policy_losses()
    assert "textworld" in agentrl_jax.env_names()
    assert agentrl_jax.SamplingParams(temperature=0.0).temperature == 0.0
    with pytest.raises(AttributeError, match="no attribute 'learner'"):
        agentrl_jax.learner  # noqa: B018 - internal modules are not re-exported


def test_import_is_lazy():
    code = textwrap.dedent(
        """
        import sys
        import agentrl_jax
        assert "jax" not in sys.modules, "import agentrl_jax imported jax"
        agentrl_jax.LossConfig
        assert "jax" in sys.modules and "agentrl_jax.run.trainer" not in sys.modules
        print("ok")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_load_config_file_reads_the_arg_like_the_flag():
    path = os.path.join(REPO, "configs", "tiny_textworld.py")
    full, test = load_config_file(path), load_config_file(path + ":test")
    assert full.budget.total == 600 + 20 * 64 and test.budget.total == 24
    assert tuple(full.plugins) == ()
    with pytest.raises(FileNotFoundError, match="nope.py"):
        load_config_file("configs/nope.py:test")


def test_plugins_are_imported_before_validation(tmp_path, monkeypatch):
    (tmp_path / "plugin_halved_pg.py").write_text(
        textwrap.dedent(
            """
            import agentrl_jax as arl

            @arl.register_policy_loss("plugin_halved_pg")
            def halved(logprobs, old_logprobs, advantages, loss_mask, *, step_ids=None, config):
                loss, metrics = arl.kernels.pg_loss(logprobs, old_logprobs, advantages, loss_mask)
                return arl.Weighted(loss.numerator / 2, loss.denominator), metrics
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    cd = load_config_file(os.path.join(REPO, "configs", "tiny_textworld.py:test"))
    cd.rl.loss = "plugin_halved_pg"
    try:
        with pytest.raises(ConfigError, match="config.rl.loss is 'plugin_halved_pg'"):
            from_config_dict(cd, num_devices=1)  # not imported: not a valid name yet
        cd.plugins = ("plugin_halved_pg",)
        run = from_config_dict(cd, num_devices=1)
        assert run.plugins == ("plugin_halved_pg",) and run.rl.loss == "plugin_halved_pg"
    finally:
        kernels.registry.unregister("plugin_halved_pg")
        sys.modules.pop("plugin_halved_pg", None)


@pytest.mark.parametrize(
    "plugins, match",
    [
        (("no_such_plugin_module",), r"cannot import module 'no_such_plugin_module'"),
        (("",), r"expected a tuple of module names"),
    ],
)
def test_bad_plugins_fail_naming_the_module(plugins, match):
    cd = load_config_file(os.path.join(REPO, "configs", "tiny_textworld.py:test"))
    cd.plugins = plugins
    with pytest.raises(ConfigError, match=match):
        from_config_dict(cd, num_devices=1)


def test_plugins_must_be_a_tuple_not_one_string():
    with pytest.raises(ConfigError, match=r"config.plugins is 'my_losses'; expected a tuple"):
        import_plugins("my_losses")


def test_a_plugin_that_raises_is_named(tmp_path, monkeypatch):
    (tmp_path / "plugin_broken.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cd = load_config_file(os.path.join(REPO, "configs", "tiny_textworld.py:test"))
    cd.plugins = ("plugin_broken",)
    with pytest.raises(ConfigError, match=r"'plugin_broken': RuntimeError: boom at import"):
        from_config_dict(cd, num_devices=1)
