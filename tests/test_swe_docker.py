"""DockerRuntime against a fake docker client (no Docker daemon here): container settings, the
command wrapping, file transfer and the SWE-bench evaluation sequence."""

import io
import subprocess
import sys
import tarfile

import pytest

from agentrl_jax.envs.swe.docker_runtime import DockerRuntime, image_name
from agentrl_jax.envs.swe.runtime import RuntimeSetupError
from agentrl_jax.envs.swe.tasks import from_record

TASK = from_record(
    {
        "instance_id": "getmoto__moto-1234",
        "repo": "getmoto/moto",
        "base_commit": "deadbeef",
        "problem_statement": "bug",
        "patch": "",
        "test_patch": (
            "diff --git a/tests/test_s3.py b/tests/test_s3.py\n--- a/tests/test_s3.py\n"
            "+++ b/tests/test_s3.py\n@@ -1 +1,2 @@\n x\n+y\n"
        ),
        "FAIL_TO_PASS": '["tests/test_s3.py::test_new"]',
        "PASS_TO_PASS": '["tests/test_s3.py::test_old"]',
    }
)
LOG = b"PASSED tests/test_s3.py::test_new\nPASSED tests/test_s3.py::test_old\n"


class FakeContainer:
    def __init__(self, client, image, kwargs):
        self.client, self.image, self.kwargs = client, image, kwargs
        self.files, self.commands, self.removed = {}, [], False

    def exec_run(self, cmd, workdir=None):
        self.commands.append(cmd)
        script = cmd[-1] if cmd[0] == "bash" else " ".join(cmd)
        return self.client.respond(self, script)

    def put_archive(self, path, data):
        with tarfile.open(fileobj=io.BytesIO(data)) as tf:
            for m in tf.getmembers():
                self.files["/" + m.name] = tf.extractfile(m).read()
        return True

    def remove(self, force=False):
        self.removed = True


class FakeClient:
    def __init__(self, test_log=LOG, apply_code=0):
        self.started, self.test_log, self.apply_code = [], test_log, apply_code
        self.containers = self

    def run(self, image, **kwargs):
        c = FakeContainer(self, image, kwargs)
        self.started.append(c)
        return c

    def respond(self, container, script):
        if "git apply --whitespace=nowarn /tmp/model.diff" in script:
            return self.apply_code, b"error: patch failed: a.py:1" if self.apply_code else b""
        if "pytest" in script:
            return 1, self.test_log
        if script.startswith("cat -- "):
            return 0, b"file text"
        return 0, b""


def test_container_settings_and_exec():
    client = FakeClient()
    rt = DockerRuntime(client=client, mem_limit="2g", pids_limit=128, cpus=1.5)
    rt.reset(TASK)
    (c,) = client.started
    assert c.image == "docker.io/xingyaoww/sweb.eval.x86_64.getmoto_s_moto-1234"
    assert image_name(TASK) == c.image
    kw = c.kwargs
    assert kw["network_mode"] == "none" and kw["detach"] and kw["working_dir"] == "/testbed"
    assert (kw["mem_limit"], kw["memswap_limit"], kw["pids_limit"]) == ("2g", "2g", 128)
    assert kw["nano_cpus"] == 1_500_000_000
    r = rt.exec("pytest -q", timeout_s=7)
    script = c.commands[-1][-1]
    assert "activate testbed" in script and "cd /testbed" in script
    assert "timeout -k 5 7 bash -c 'pytest -q'" in script and "head -c" in script
    assert r.exit_code == 1 and "test_new" in r.output
    rt.write_file("src/a.py", "print(1)\n")
    assert c.files["/testbed/src/a.py"] == b"print(1)\n"
    assert rt.read_file("src/a.py") == "file text"
    rt.close()
    assert c.removed and rt.container is None
    rt.close()  # twice is fine


def test_evaluate_sequence_in_fresh_container():
    client = FakeClient()
    rt = DockerRuntime(client=client)
    rt.reset(TASK)
    patch = (
        "diff --git a/moto/s3.py b/moto/s3.py\n--- a/moto/s3.py\n+++ b/moto/s3.py\n@@ x\n"
        "diff --git a/tests/test_s3.py b/tests/test_s3.py\n@@ cheat\n"
    )
    res = rt.evaluate(patch)
    agent, fresh = client.started
    assert fresh is not agent and fresh.removed and not agent.removed
    assert fresh.files["/tmp/model.diff"].decode().count("diff --git") == 1  # test hunk dropped
    assert res.dropped_files == ("tests/test_s3.py",)
    scripts = [cmd[-1] for cmd in fresh.commands]
    assert any("git checkout deadbeef -- tests/test_s3.py" in s for s in scripts)
    assert "python -m pytest -rA -p no:cacheprovider tests/test_s3.py" in scripts[-1]
    assert res.grade.resolved == 1.0 and res.grade.verified_ratio == 1.0


def test_evaluate_failures():
    rt = DockerRuntime(client=FakeClient(apply_code=1))
    rt.reset(TASK)
    res = rt.evaluate("diff --git a/a.py b/a.py\n@@ x\n")
    assert res.grade.resolved == 0.0 and "patch does not apply" in res.grade.reason
    rt = DockerRuntime(client=FakeClient(test_log=b"Traceback: ImportError\n"))
    rt.reset(TASK)
    res = rt.evaluate("")
    assert res.grade.infra_failure and res.grade.resolved == 0.0


def test_docker_is_imported_lazily():
    code = (
        "import sys, agentrl_jax.envs.swe.docker_runtime as d\n"
        "assert 'docker' not in sys.modules\n"
        "sys.modules['docker'] = None\n"  # makes `import docker` fail
        "rt = d.DockerRuntime()\n"
        "try:\n    rt.client\nexcept d.RuntimeSetupError as e:\n    print('ERR', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "ERR DockerRuntime needs the docker SDK: pip install -e '.[docker]'" in out.stdout, (
        out.stderr
    )


def test_exec_before_reset_is_clear():
    with pytest.raises(RuntimeSetupError, match="reset"):
        DockerRuntime(client=FakeClient()).exec("ls")
