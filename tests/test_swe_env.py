"""The SWE task builder, local runtime and env end to end, on a small package generated here.

One module-scoped build (through the launcher, as a user runs it) feeds every test.
"""

import os
import re
import subprocess
import sys
import textwrap

import pytest

from agentrl_jax.envs.base import Task
from agentrl_jax.envs.swe import build, toy_package
from agentrl_jax.envs.swe.env import SweEnv
from agentrl_jax.envs.swe.runtime import LocalRuntime
from agentrl_jax.envs.swe.tasks import load_jsonl

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Passes on every odd run, fails on every even one: a flaky test the builder must drop.
FLAKY = """
    import os


    def test_flaky():
        n = int(open(".runs").read()) + 1 if os.path.exists(".runs") else 1
        open(".runs", "w").write(str(n))
        assert n % 2 == 1
"""
MAX_F2P = 3


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("swe")
    pkg = toy_package.write(str(root / "minicalc"))
    with open(os.path.join(pkg, "tests", "test_flaky.py"), "w") as f:
        f.write(textwrap.dedent(FLAKY))
    out = root / "out"
    cmd = [
        sys.executable, "-m", "launch.make_swe_tasks", f"--package_dir={pkg}", f"--out={out}",
        "--max_mutations=8", "--max_tasks=3", f"--max_f2p={MAX_F2P}", "--seed=1",
    ]  # fmt: skip
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    tasks = load_jsonl(str(out / "tasks.jsonl"))
    assert tasks, r.stdout
    return {"pkg": pkg, "out": str(out), "tasks": tasks, "log": r.stdout}


def _git(repo, *args):
    return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True)


def test_builder_output(built):
    log, tasks = built["log"], built["tasks"]
    assert "clean run 1/2" in log and "clean run 2/2" in log and "mutation 1/" in log
    assert "dropped 1 unstable test id(s)" in log
    for t in tasks:
        assert 1 <= len(t.fail_to_pass) <= MAX_F2P
        ids = set(t.fail_to_pass) | set(t.pass_to_pass)
        assert "tests/test_flaky.py::test_flaky" not in ids
        assert len(ids) == 11  # the toy suite's stable tests, split between the two lists
        assert t.source == "swe-smith-local" and os.path.isdir(t.repo_path)
        # The statement names the failing tests and never quotes the gold patch's code.
        for test_id in t.fail_to_pass:
            assert test_id in t.problem_statement
        added = [ln[1:].strip() for ln in t.patch.splitlines() if ln.startswith("+ ")]
        for code in added:
            assert code not in t.problem_statement
        # The failing tests' files are hidden at base_commit and restored by test_patch.
        for f in {x.split("::")[0] for x in t.fail_to_pass}:
            assert _git(t.repo_path, "cat-file", "-e", f"{t.base_commit}:{f}").returncode != 0
            assert f"+++ b/{f}" in t.test_patch
        assert t.patch.count("diff --git") == 1 and "tests/" not in t.patch


def test_builder_cache_is_reused(built, monkeypatch):
    def no_runs(*a, **k):
        raise AssertionError("the cache should have answered")

    monkeypatch.setattr(build, "_run_suite", no_runs)
    config = build.BuildConfig(max_mutations=8, max_tasks=3, max_f2p=MAX_F2P, seed=1,
                               validate=False)  # fmt: skip
    again = build.build_tasks(built["pkg"], built["out"], config=config, progress=lambda s: None)
    assert [t.instance_id for t in again] == [t.instance_id for t in built["tasks"]]


def test_builder_rejects_slow_suite(built, tmp_path):
    config = build.BuildConfig(max_suite_s=0.3, validate=False)
    with pytest.raises(build.BuildError, match=r"clean suite took >= 0s"):
        build.build_tasks(built["pkg"], str(tmp_path), config=config, progress=lambda s: None)


@pytest.fixture
def runtime(built):
    rt = LocalRuntime(hidden=(built["out"],))
    yield rt
    rt.close()


def test_runtime_files_diff_and_confinement(built, runtime):
    task = built["tasks"][0]
    runtime.reset(task)
    r = runtime.exec("ls; cat minicalc/core.py | head -3; ls " + built["out"])
    assert "minicalc" in r.output and "def clamp" in r.output
    assert "tasks.jsonl" not in r.output  # the gold patches are hidden from the sandbox
    runtime.write_file("notes/x.txt", "hello\n")
    assert runtime.read_file("notes/x.txt") == "hello\n"
    assert runtime.exec("cat notes/x.txt; echo more >> notes/x.txt").exit_code == 0
    runtime.exec("ln -s /etc/passwd leak; ln -s .. up")
    with pytest.raises(PermissionError, match="outside the repository"):
        runtime.read_file("leak")
    with pytest.raises(PermissionError):
        runtime.write_file("up/escape.txt", "x")
    assert "+hello\n+more" in runtime.diff()


def test_evaluate_gold_empty_cheat_and_bad_input(built, runtime):
    task = built["tasks"][0]
    runtime.reset(task)
    gold = runtime.evaluate(task.patch)
    assert gold.grade.resolved == 1.0 and gold.grade.verified_ratio == 1.0, gold.log[-2000:]
    empty = runtime.evaluate("")
    assert empty.grade.resolved == 0.0 and not empty.grade.infra_failure
    assert empty.grade.verified_ratio == 0.0
    # Cheating by editing the failing tests' file earns nothing: it is restored from pristine.
    test_file = task.fail_to_pass[0].split("::")[0]
    cheat = (
        f"diff --git a/{test_file} b/{test_file}\nnew file mode 100644\n--- /dev/null\n"
        f"+++ b/{test_file}\n@@ -0,0 +1,2 @@\n+def test_nothing():\n+    pass\n"
    )
    res = runtime.evaluate(cheat + "diff --git a/conftest.py b/conftest.py\nnew file mode 100644\n"
                           "--- /dev/null\n+++ b/conftest.py\n@@ -0,0 +1 @@\n+x = 1\n")  # fmt: skip
    assert res.grade.resolved == 0.0 and set(res.dropped_files) == {test_file, "conftest.py"}
    bad = runtime.evaluate(
        "diff --git a/nope.py b/nope.py\n--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-a\n+b\n"
    )
    assert bad.grade.resolved == 0.0 and "patch does not apply" in bad.grade.reason
    assert not bad.grade.infra_failure


def test_missing_test_command_is_infra_failure(built, runtime):
    import dataclasses

    task = dataclasses.replace(built["tasks"][0], test_cmd="no_such_test_runner -q")
    runtime.reset(task)
    res = runtime.evaluate(task.patch)
    assert res.grade.infra_failure and res.grade.resolved == 0.0
    assert "not found" in res.grade.reason


def _fix_action(task) -> str:
    """A str_replace action equivalent to the gold patch (one changed line)."""
    path = re.search(r"^\+\+\+ b/(\S+)", task.patch, re.M).group(1)
    old = [
        ln[1:] for ln in task.patch.splitlines() if ln.startswith("-") and not ln.startswith("---")
    ]
    new = [
        ln[1:] for ln in task.patch.splitlines() if ln.startswith("+") and not ln.startswith("+++")
    ]
    return (
        f"Fixing it.\n```str_replace {path}\n<<<<<<< OLD\n" + "\n".join(old)
        + "\n=======\n" + "\n".join(new) + "\n>>>>>>> NEW\n```"
    )  # fmt: skip


def test_env_episode_resolves(built):
    env = SweEnv.from_jsonl(os.path.join(built["out"], "tasks.jsonl"), max_turns=10)
    task = built["tasks"][0]
    try:
        obs = env.reset(Task("swe", "train", task.instance_id))
        assert task.fail_to_pass[0] in obs.objective and "```bash" in obs.text
        obs, reward, done, info = env.step("hmm, no action here")
        assert info["invalid_action"] and not done and "no fenced action block" in obs.feedback
        obs, reward, done, info = env.step("```bash\npython -c 'print(6*7)'\n```")
        assert "42" in obs.feedback and "[exit code 0]" in obs.feedback and not done
        key0 = info["state_key"]
        obs, reward, done, info = env.step(_fix_action(task))
        assert not info["invalid_action"], obs.feedback
        assert info["state_key"] != key0
        obs, reward, done, info = env.step("```submit\n```")
        assert done and reward == 1.0 and info["won"] and info["resolved"] == 1.0
        assert not info["infra_failure"]
        with pytest.raises(RuntimeError, match="after the episode ended"):
            env.step("```submit\n```")
    finally:
        env.close()


def test_env_turn_limit_and_verified_ratio(built):
    env = SweEnv.from_jsonl(
        os.path.join(built["out"], "tasks.jsonl"), max_turns=2, reward="verified_ratio"
    )
    task = built["tasks"][-1]
    try:
        env.reset(Task("swe", "train", task.instance_id))
        _, _, done, _ = env.step("```bash\necho $HOME\n```")
        assert not done
        obs, reward, done, info = env.step("```bash\ntrue\n```")
        assert done and info["truncated"] and reward == 0.0 and not info["won"]
        assert "turn limit (2) reached" in obs.text
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.network_sdist
def test_build_from_real_sdist(tmp_path, request):
    # Downloads from PyPI: runs only when asked for (-m network_sdist) or AGENTRL_NETWORK_TESTS=1.
    if "network_sdist" not in (request.config.getoption("-m") or "") and not os.environ.get(
        "AGENTRL_NETWORK_TESTS"
    ):
        pytest.skip("needs PyPI: run with -m network_sdist")
    src = build.fetch_sdist("parse", str(tmp_path / "sdists"))
    config = build.BuildConfig(max_mutations=6, max_tasks=2)
    tasks = build.build_tasks(src, str(tmp_path / "out"), name="parse", config=config)
    assert tasks and all(1 <= len(t.fail_to_pass) <= config.max_f2p for t in tasks)
