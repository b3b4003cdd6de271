"""A rerun in an existing workdir: same config resumes, a changed one is an error unless allowed."""

import json
import os
import sys

import pytest

from agentrl_jax.run import workdir_config
from agentrl_jax.run.config import ConfigError, from_config_dict

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from configs import tiny_textworld  # noqa: E402


def _cd(**overrides):
    cd = tiny_textworld.get_config("test")
    for path, value in overrides.items():
        section, _, key = path.rpartition(".")
        node = cd
        for part in filter(None, section.split(".")):
            node = node[part]
        node[key] = value
    return cd


def _check(workdir, cd, **kwargs):
    return workdir_config.check_and_record(str(workdir), cd, from_config_dict(cd), **kwargs)


def _saved(workdir) -> str:
    return (workdir / "config.json").read_text()


def test_fresh_workdir_writes_the_config(tmp_path):
    assert _check(tmp_path, _cd()) == {}
    saved = json.loads(_saved(tmp_path))
    assert saved["rl"]["tasks_per_iteration"] == 2 and saved["model"]["tokenizer_vocab"] == 300
    assert not (tmp_path / "config_changes.jsonl").exists()


def test_same_config_leaves_the_file_alone(tmp_path):
    _check(tmp_path, _cd())
    (tmp_path / "config.json").write_text(_saved(tmp_path).replace("\n", "\n "))  # same values
    before = _saved(tmp_path)
    # The saved file holds lists where the config has tuples: the same resolved run.
    assert _check(tmp_path, _cd()) == {}
    assert _saved(tmp_path) == before
    assert not (tmp_path / "config_changes.jsonl").exists()


def test_a_change_that_changes_the_run_is_an_error_naming_fields_and_values(tmp_path):
    _check(tmp_path, _cd())
    before = _saved(tmp_path)
    cd = _cd(seed=1, **{"rl.actor_lr": 2e-4, "env.kwargs.max_steps": 4})
    with pytest.raises(ConfigError) as e:
        _check(tmp_path, cd)
    message = str(e.value)
    assert message.startswith(f"{tmp_path / 'config.json'} (the run being resumed) differs in ")
    assert "env.kwargs.max_steps 3 -> 4, rl.actor_lr 0.0001 -> 0.0002, seed 0 -> 1;" in message
    assert "--allow_config_change" in message and "\n" not in message
    assert _saved(tmp_path) == before  # never overwritten
    assert not (tmp_path / "config_changes.jsonl").exists()


def test_allowed_change_is_recorded(tmp_path):
    _check(tmp_path, _cd())
    cd = _cd(**{"rl.actor_lr": 2e-4})
    changes = _check(tmp_path, cd, allow_change=True)
    assert changes == {"rl.actor_lr": (1e-4, 2e-4)}
    assert json.loads(_saved(tmp_path))["rl"]["actor_lr"] == 2e-4
    (line,) = (tmp_path / "config_changes.jsonl").read_text().splitlines()
    record = json.loads(line)
    assert record["changes"] == {"rl.actor_lr": [1e-4, 2e-4]} and record["allowed_by_flag"]
    # Resuming again with the new config is now a plain resume.
    assert _check(tmp_path, cd) == {}


def test_free_fields_may_change_and_are_recorded(tmp_path):
    _check(tmp_path, _cd())
    cd = _cd(**{"checkpoint.keep_last": 3, "eval_every": 2})
    changes = _check(tmp_path, cd)
    assert changes == {"checkpoint.keep_last": (5, 3), "eval_every": (0, 2)}
    assert set(changes) <= set(workdir_config.FREE_FIELDS)
    record = json.loads((tmp_path / "config_changes.jsonl").read_text())
    assert not record["allowed_by_flag"]
    assert json.loads(_saved(tmp_path))["checkpoint"]["keep_last"] == 3


def test_unreadable_saved_config_is_an_error_naming_it(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"^cannot compare with the run's saved config "):
        _check(tmp_path, _cd())
    assert _saved(tmp_path) == "{not json"
    _check(tmp_path, _cd(), allow_change=True)
    assert json.loads(_saved(tmp_path))["seed"] == 0
    assert json.loads((tmp_path / "config_changes.jsonl").read_text())["saved_was_unreadable"]


def test_other_processes_check_but_do_not_write(tmp_path):
    assert _check(tmp_path, _cd(), write=False) == {}
    assert not (tmp_path / "config.json").exists()
