"""A user's mistakes on the command line end in one clear line and exit status 2."""

import os
import subprocess
import sys

import pytest
from train_cli import REPO, train_cmd

from launch import cli


def run(*extra, workdir):
    cmd = train_cmd(workdir, *extra, config="configs/tiny_textworld.py:smoke")
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")  # one device, as a user has
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stderr.strip().splitlines()[-1]


def test_unknown_config_key_names_the_section_keys_and_closest_match(tmp_path):
    rc, line = run("--config.rl.lr=1", workdir=tmp_path / "run")
    assert rc == 2
    assert line.startswith("config error: config.rl has no key 'lr'; valid keys: actor_lr,")
    rc, line = run("--config.rll.algo=grpo", workdir=tmp_path / "run")
    assert rc == 2
    assert "config has no key 'rll' (did you mean config.rl?)" in line
    assert not (tmp_path / "run").exists()  # nothing was started


def test_unusable_workdir_names_the_path_and_why(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    rc, line = run(workdir=blocker / "run")
    assert rc == 2
    assert line.startswith(f"workdir error: cannot use --workdir={str(blocker / 'run')!r}"), line
    assert "NotADirectoryError" in line


def _eval(workdir, *flags):
    cmd = [sys.executable, "-m", "launch.eval", f"--workdir={workdir}", *flags]
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stderr.strip().splitlines()[-1]


def test_eval_flags_end_in_one_line(tmp_path):
    from agentrl_jax.run.config import load_config_file

    cd = load_config_file(os.path.join(REPO, "configs", "tiny_textworld.py:smoke"))
    cd.env.kwargs.admissible_commands = False  # an env that lists no commands
    cd.rollout.constrain_actions = False
    (tmp_path / "config.json").write_text(cd.to_json_best_effort())
    rc, line = _eval(tmp_path, "--split=train")
    assert rc == 2
    assert line == (
        "eval: --split='train' is not a held-out split of 'textworld'; expected one of valid, test"
    )
    rc, line = _eval(tmp_path, "--decoding=constrained")
    assert rc == 2
    assert line.startswith(
        "config error: config.rollout.constrain_actions=True writes one of the env's admissible "
        "commands, but config.env.name='textworld' with config.env.kwargs="
    ), line
    rc, line = _eval(tmp_path, "--decoding=greedy")
    assert rc == 2 and "--decoding" in line and "free" in line and "constrained" in line, line
    rc, line = _eval(tmp_path, "--num_task=3")
    assert rc == 2 and "num_task" in line, line
    # Told before anything is built (no tokenizer, actor pool or policy).
    rc, line = _eval(tmp_path)
    assert rc == 2 and line == f"eval: no checkpoint under {tmp_path}/checkpoints", line
    assert not (tmp_path / "tokenizer").exists()


def test_export_flags_end_in_one_line(tmp_path):
    from agentrl_jax.run.config import load_config_file

    def export(*flags):
        cmd = [sys.executable, "-m", "launch.export", *flags]
        env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        return proc.returncode, proc.stderr.strip().splitlines()[-1]

    rc, line = export(f"--workdir={tmp_path}")
    assert rc == 2 and line.startswith("export: --workdir=DIR"), line
    rc, line = export(f"--workdir={tmp_path}", f"--out={tmp_path / 'hf'}")
    assert rc == 2 and line == (
        f"export: {tmp_path}/config.json not found; is '{tmp_path}' a launch.train workdir?"
    ), line
    cd = load_config_file(os.path.join(REPO, "configs", "tiny_textworld.py:smoke"))
    (tmp_path / "config.json").write_text(cd.to_json_best_effort())
    rc, line = export(f"--workdir={tmp_path}", f"--out={tmp_path / 'hf'}", "--what=adapter")
    assert rc == 2 and "--what=adapter needs a LoRA run" in line, line
    rc, line = export(f"--workdir={tmp_path}", f"--out={tmp_path / 'hf'}", "--what=lora")
    assert rc == 2 and "--what" in line and "merged" in line and "adapter" in line, line
    # Told before anything is built (no tokenizer or policy), and nothing written.
    rc, line = export(f"--workdir={tmp_path}", f"--out={tmp_path / 'hf'}")
    assert rc == 2 and line == f"export: no checkpoint under {tmp_path}/checkpoints", line
    assert not (tmp_path / "hf").exists() and not (tmp_path / "tokenizer").exists()


def test_override_check_walks_nested_sections():
    import ml_collections

    config = ml_collections.ConfigDict({"rl": {"algo": "grpo"}, "seed": 0})
    assert cli._bad_override(config, "--config.rl.algo=gae") is None
    assert "config.seed is not a section" in cli._bad_override(config, "--config.seed.x=1")
    assert cli._bad_override(config, "--workdir=x") is None


def test_usable_workdir_creates_and_checks(tmp_path):
    assert cli.usable_workdir(str(tmp_path / "new" / "dir")) == str(tmp_path / "new" / "dir")
    assert list((tmp_path / "new" / "dir").iterdir()) == []  # the probe file is gone
    with pytest.raises(SystemExit) as e:
        cli.usable_workdir("/proc/1/not_here")
    assert e.value.code == 2


def test_resuming_with_a_changed_config_names_the_fields(tmp_path):
    from configs import tiny_textworld

    workdir = tmp_path / "run"
    workdir.mkdir()
    saved = tiny_textworld.get_config("smoke")
    saved.seed = 5
    (workdir / "config.json").write_text(saved.to_json_best_effort(indent=2))
    before = (workdir / "config.json").read_text()
    rc, line = run(workdir=workdir)
    assert rc == 2
    assert line.startswith(f"resume error: {workdir / 'config.json'} (the run being resumed)")
    assert "seed 5 -> 0;" in line and "--allow_config_change" in line
    assert (workdir / "config.json").read_text() == before
    # Nothing was started: only the log file of this refused attempt was added.
    assert sorted(p.name for p in workdir.iterdir()) == ["config.json", "logs"]
