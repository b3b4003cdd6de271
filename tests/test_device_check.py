"""scripts/device_check.sh --dry-run: every step of the accelerator check, shrunk, on the CPU.

The same script takes a bare device machine to results (docs/performance.md, "On an
accelerator"); here it runs each benchmark's ``--quick`` form with the test venv, which is also
the test of ``launch.bench iteration --quick`` and ``launch.bench parity --quick``.
"""

import json
import os
import pathlib
import subprocess
import tarfile

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
# Five minutes of CPU for the dry run alone (two cold and warm iteration benches, parity, the
# device bench): run before using the script on a device (`bash scripts/test.sh -m slow`).
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("device_check")
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "PYTHONPATH")}
    env["OUT"] = str(out)
    env["AGENTRL_CACHE"] = str(out / "cache")  # games and compiled programs of its own
    proc = subprocess.run(
        ["bash", "scripts/device_check.sh", "--dry-run"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=850,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return out


def _json(path: pathlib.Path) -> dict:
    return json.loads(path.read_text())


def test_every_step_passes_and_is_recorded(dry_run):
    summary = _json(dry_run / "summary.json")
    assert summary["failed"] == 0
    for step in ("versions", "iteration", "parity", "device"):
        assert summary[step]["rc"] == 0
    assert _json(dry_run / "versions.json")["backend"] == "cpu"
    assert "== device: exit 0" in (dry_run / "device_check.log").read_text()


def test_iteration_phases_cover_the_wall_time(dry_run):
    row = _json(dry_run / "iteration.json")["workloads"]["tiny/iteration_seconds"]
    assert row["ours"] > 0
    assert 0.95 <= row["phase_coverage"] <= 1.0001
    assert 0 < row["device_busy_fraction"] < 1
    phases = row["phases_s"]
    for name in ("env", "text", "sample", "transfer", "score", "update", "checkpoint"):
        assert phases[name] >= 0, name
    assert any(p.startswith("evaluate/") for p in phases)  # the last iteration evaluates
    assert row["rollout_tokens_per_s"] > 0 and row["update_tokens_per_s"] > 0
    assert row["logprob_mismatch_max"] < 1e-4  # f32 on the CPU: sampler and learner agree
    for profile in row["profiles"]:
        assert sum(profile["phases"].values()) <= profile["wall_s"] * 1.0001


def test_a_warm_compilation_cache_saves_most_compile_seconds(dry_run):
    row = _json(dry_run / "iteration.json")["workloads"]["tiny/compile_seconds"]
    cold, warm = row["cold"], row["warm"]
    assert cold["compilations"] > 10 and cold["cache_hits"] == 0
    assert warm["cache_hits"] == warm["compilations"] == cold["compilations"]
    assert row["ours"] <= row["reference"] / 4  # the bar: at most a quarter of the cold seconds


def test_parity_and_device_rows(dry_run):
    parity = _json(dry_run / "parity.json")["workloads"]["tiny/logits_max_abs_error"]
    assert parity["within_tolerance"], parity
    device = _json(dry_run / "device.json")["workloads"]["tiny/sampler_tokens_per_s"]
    assert device["roofline_fraction"] > 0
    with tarfile.open(dry_run / "profile.tar.gz") as traces:  # the profiler's traces, packed
        names = traces.getnames()
    for row in ("tiny_sampler", "tiny_update"):
        assert any(n.startswith(f"profile/{row}/") and n.endswith(".xplane.pb") for n in names)
