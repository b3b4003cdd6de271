"""The generation demo (the README's first command until the trainer exists) runs end to end."""

import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_generate_demo_prints_two_turns(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "launch.generate", "--max_new_tokens=4", f"--workdir={tmp_path}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for needle in ("=== turn 1", "=== turn 2", "policy (", "conversation lengths"):
        assert needle in proc.stdout, proc.stdout
    assert (tmp_path / "tokenizer" / "tokenizer.json").is_file()
