"""An env family registered from a user's module (tests/toy_env_family.py) trains, evaluates and
reports through ``launch.train`` and ``launch.eval`` with no edit to the package, and a config
naming a split or level the family lacks fails before compute, naming the field."""

import json
import os
import subprocess
import sys

import pytest
import train_cli

from agentrl_jax.envs import registry
from agentrl_jax.experiments import study as study_lib
from agentrl_jax.rollout.tasks import make_tasks, report_levels
from agentrl_jax.run.config import ConfigError, from_config_dict, load_config_file

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
CONFIG = os.path.join("tests", "toy_family_config.py")
PLUGINS = "--config.plugins=('toy_env_family',)"


@pytest.fixture
def toy_family(monkeypatch):
    """The family's module imported as a user's plugin would be (on sys.path); unregistered
    afterwards."""
    monkeypatch.syspath_prepend(TESTS)
    sys.modules.pop("toy_env_family", None)
    import toy_env_family

    yield toy_env_family
    registry.unregister(toy_env_family.NAME)
    sys.modules.pop("toy_env_family", None)


def _config(**env):
    cd = load_config_file(os.path.join(REPO, CONFIG))
    cd.plugins = ("toy_env_family",)
    cd.env.update(env)
    return cd


def test_the_registry_carries_the_family_whole(toy_family):
    family = registry.family("toy-corridor")
    assert family.held_out_splits == ("dev", "heldout")
    assert (family.eval_split, family.report_split) == ("dev", "heldout")
    dev = make_tasks("toy-corridor", "short", "dev", 2)
    assert [t.split for t in dev] == ["dev", "dev"] and len({t.id for t in dev}) == 2
    train = make_tasks("toy-corridor", "short", "train", 4)
    assert {t.id for t in train}.isdisjoint({t.id for t in dev})
    assert report_levels("toy-corridor", (), ("short", "long@dev"), 1) == [
        "short@heldout",
        "long@heldout",
    ]
    with pytest.raises(ValueError, match="has no split 'test'; its splits: train, dev, heldout"):
        make_tasks("toy-corridor", "short", "test", 1)
    # The built-in families go through the same entry.
    assert registry.family("textworld").report_split == "test"
    assert registry.family("alfworld").held_out_splits == ("valid_seen", "valid_unseen")
    assert registry.family("swe").eval_split == "eval"


@pytest.mark.parametrize(
    "env, match",
    [
        (
            dict(name="toy-corridr"),
            r"^config.env.name: unknown env 'toy-corridr'; valid names: .*toy-corridor",
        ),
        (
            dict(eval_levels=("short@test",)),
            r"config.env.eval_levels holds 'short@test': env family 'toy-corridor' has no "
            r"held-out split 'test'; expected one of dev, heldout \(registered env families: "
            r".*textworld",
        ),
        (
            dict(report_levels=("short@train",)),
            r"config.env.report_levels holds 'short@train'.*expected one of dev, heldout",
        ),
        (
            dict(eval_levels=("medium",)),
            r"config.env.eval_levels holds 'medium': env family 'toy-corridor' has no level "
            r"'medium'; expected one of short, long",
        ),
    ],
)
def test_unknown_env_split_or_level_fails_naming_the_field(toy_family, env, match):
    with pytest.raises(ConfigError, match=match):
        from_config_dict(_config(**env), num_devices=1)


def test_a_study_reports_on_the_family_split_and_prepares_its_tasks(toy_family, tmp_path):
    """A study that names no evaluation split reports on the family's report split, and its
    cells' tasks go through the family's ``prepare`` hook once, before they start."""
    baseline = tmp_path / "baseline.py"
    baseline.write_text(
        "import importlib.util\n"
        f"path = {os.path.join(REPO, CONFIG)!r}\n"
        "spec = importlib.util.spec_from_file_location('toy_cfg', path)\n"
        "toy = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(toy)\n"
        "def get_config(arg=None):\n"
        "    c = toy.get_config(arg)\n"
        "    c.plugins = ('toy_env_family',)\n"
        "    return c\n"
    )
    study_file = tmp_path / "toy_study.py"
    study_file.write_text(
        "def get_study():\n"
        f"    return dict(baseline={str(baseline)!r}, variants={{'grpo': {{}}}}, seeds=(0,),\n"
        "                evaluation=dict(num_tasks=2))\n"
    )
    study = study_lib.load_study(str(study_file))
    assert study.evaluation.split == "heldout"
    configs = study_lib.prepare(study, str(tmp_path / "study"))
    (config,) = configs.values()
    assert config.env.report_levels == ("short@heldout",) and config.env.num_report_tasks == 2
    toy_family.PREPARED.clear()
    assert study_lib.generate_games(list(configs.values()), progress=False) == 2 + 1 + 2
    assert sorted(toy_family.PREPARED) == [
        ("short", "dev", 1),
        ("short", "heldout", 2),
        ("short", "train", 2),
    ]


def test_register_checks_the_splits():
    with pytest.raises(ValueError, match=r"report_split='test' is not one of its held-out"):
        registry.register("bad-test", "m:f", splits=("train", "valid"), report_split="test")
    with pytest.raises(ValueError, match=r"splits=\('valid', 'train'\): expected distinct"):
        registry.register("bad-test", "m:f", splits=("valid", "train"))
    assert "bad-test" not in registry.names()


def test_a_user_registered_family_trains_evaluates_and_reports(tmp_path):
    """The plugin reaches launch.train only through --config.plugins (and PYTHONPATH, as a
    user's module would), then launch.eval reads it back from the workdir's config.json."""
    workdir = tmp_path / "run"
    env = dict(
        PYTHONPATH=os.pathsep.join([REPO, TESTS, os.environ.get("PYTHONPATH", "")]),
        JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax_cache"),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1",
    )
    cmd = train_cli.train_cmd(workdir, PLUGINS, config=CONFIG)
    (text,) = train_cli.finish(train_cli.start(cmd, tmp_path / "cache", tmp_path / "log", **env))
    assert "| short@heldout | 1 |" in text and "1 heldout games" in text
    assert "short@heldout" in (workdir / "report.md").read_text()
    report = json.loads((workdir / "report.json").read_text())
    (row,) = report["before_after"]
    assert (row["set"], row["split"], row["num_tasks"]) == ("short@heldout", "heldout", 1)
    after_rl = report["evals"]["after_rl"]
    assert after_rl["short"]["split"] == "dev"  # the tuning split the family registered
    assert after_rl["short@heldout"]["split"] == "heldout"

    run_env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="", **env)
    evaluate = [sys.executable, "-m", "launch.eval", f"--workdir={workdir}"]
    out = subprocess.run(
        [*evaluate, "--split=heldout", "--num_tasks=1"],
        cwd=REPO,
        env=run_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "eval/short@heldout/success_rate" in out.stdout
    result = json.loads((workdir / "eval" / "eval_heldout_short_heldout.json").read_text())
    assert result["split"] == "heldout" and result["num_tasks"] == 1
