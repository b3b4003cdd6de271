"""DockerRuntime: real SWE-Gym / SWE-bench instances in their per-instance Docker images.

Each image has the repository at ``/testbed`` on the task's base commit and a conda env named
``testbed`` with its dependencies. The agent's container and each evaluation's fresh container
start with no network and with memory, pids and CPU limits. ``docker`` (the Python SDK, the
``docker`` extra: ``pip install -e '.[docker]'``) is imported only when a client is first
needed, so this module imports everywhere; tests pass a fake client.
"""

from __future__ import annotations

import io
import shlex
import tarfile
import time
from typing import Any

from agentrl_jax.envs.swe import grading
from agentrl_jax.envs.swe.runtime import (
    EvalResult,
    Runtime,
    RuntimeSetupError,
    default_test_cmd,
    filter_patch,
    grade_log,
    patch_files,
)
from agentrl_jax.envs.swe.sandbox import ExecResult
from agentrl_jax.envs.swe.tasks import SweTask

# SWE-Gym's images on Docker Hub; '__' in instance ids becomes '_s_' in image names.
SWE_GYM_IMAGE = "docker.io/xingyaoww/sweb.eval.x86_64.{instance}"
_ACTIVATE = "source /opt/miniconda3/bin/activate testbed >/dev/null 2>&1 || true"


def image_name(task: SweTask, template: str = SWE_GYM_IMAGE) -> str:
    """The task's image: its own ``image`` field, else the template filled with its id."""
    return task.image or template.format(instance=task.instance_id.replace("__", "_s_").lower())


class DockerRuntime(Runtime):
    """Runs a task in its per-instance image.

    Args:
      client: a docker client (default: ``docker.from_env()``, imported lazily).
      image_template: image name with ``{instance}``.
      mem_limit: container memory limit (docker syntax, e.g. '4g'); swap is disabled.
      pids_limit: most processes in a container.
      cpus: CPU share (nano_cpus = cpus * 1e9).
      eval_timeout_s: wall-clock limit of the test run.
      keep_output_bytes / kill_output_bytes: output kept (head + tail) / cut in the container.
    """

    def __init__(
        self,
        client: Any = None,
        image_template: str = SWE_GYM_IMAGE,
        mem_limit: str = "4g",
        pids_limit: int = 512,
        cpus: float = 2.0,
        eval_timeout_s: float = 1800.0,
        keep_output_bytes: int = 256 << 10,
        kill_output_bytes: int = 16 << 20,
    ):
        self._client = client
        self.image_template = image_template
        self.mem_limit, self.pids_limit, self.cpus = mem_limit, pids_limit, cpus
        self.eval_timeout_s = eval_timeout_s
        self.keep_output_bytes, self.kill_output_bytes = keep_output_bytes, kill_output_bytes
        self.task: SweTask | None = None
        self.container = None

    @property
    def client(self):
        if self._client is None:
            try:
                import docker
            except ImportError as e:
                raise RuntimeSetupError(
                    "DockerRuntime needs the docker SDK: pip install -e '.[docker]'"
                ) from e
            self._client = docker.from_env()
        return self._client

    def _start(self, task: SweTask):
        image = image_name(task, self.image_template)
        try:
            return self.client.containers.run(
                image,
                command="sleep infinity",
                detach=True,
                network_mode="none",
                mem_limit=self.mem_limit,
                memswap_limit=self.mem_limit,
                pids_limit=self.pids_limit,
                nano_cpus=int(self.cpus * 1e9),
                working_dir="/testbed",
                labels={"agentrl_jax.instance": task.instance_id},
            )
        except Exception as e:  # the SDK raises ImageNotFound, APIError, ...
            raise RuntimeSetupError(f"cannot start {image} for {task.instance_id}: {e}") from e

    def reset(self, task: SweTask) -> None:
        self.close()
        self.task = task
        self.container = self._start(task)

    def close(self) -> None:
        if self.container is not None:
            try:
                self.container.remove(force=True)
            finally:
                self.container = None

    def _run(self, container, command: str, timeout_s: float) -> ExecResult:
        t0 = time.monotonic()
        # `timeout` kills the command's tree; `head -c` bounds what crosses the docker socket.
        script = (
            f"{_ACTIVATE}; cd /testbed; "
            f"timeout -k 5 {timeout_s:.0f} bash -c {shlex.quote(command)} 2>&1 "
            f"| head -c {self.kill_output_bytes}; exit ${{PIPESTATUS[0]}}"
        )
        code, out = container.exec_run(["bash", "-c", script], workdir="/testbed")
        out = out or b""
        half = self.keep_output_bytes // 2
        elided = max(0, len(out) - 2 * half)
        text = out.decode("utf-8", "replace")
        if elided:
            text = (
                out[:half].decode("utf-8", "replace")
                + f"\n[... {elided} bytes elided ...]\n"
                + out[-half:].decode("utf-8", "replace")
            )
        timed_out = code == 124
        return ExecResult(
            exit_code=None if timed_out else code,
            output=text,
            timed_out=timed_out,
            output_killed=len(out) >= self.kill_output_bytes,
            total_bytes=len(out),
            elided_bytes=elided,
            wall_s=time.monotonic() - t0,
        )

    def _need(self):
        if self.container is None or self.task is None:
            raise RuntimeSetupError("call reset(task) first")
        return self.container

    def exec(self, command: str, timeout_s: float = 60.0) -> ExecResult:
        return self._run(self._need(), command, timeout_s)

    def _put(self, container, path: str, data: bytes) -> None:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size = len(data)
            info.mode = 0o644
            tf.addfile(info, io.BytesIO(data))
        container.put_archive("/", buf.getvalue())

    def _abs(self, path: str) -> str:
        if path.startswith("/"):
            return path
        return "/testbed/" + path

    def read_file(self, path: str) -> str:
        code, out = self._need().exec_run(["cat", "--", self._abs(path)])
        if code:
            raise FileNotFoundError(path)
        return out.decode("utf-8", "replace")

    def write_file(self, path: str, text: str) -> None:
        container = self._need()
        container.exec_run(["mkdir", "-p", "--", self._abs(path).rsplit("/", 1)[0]])
        self._put(container, self._abs(path), text.encode("utf-8"))

    def exists(self, path: str) -> bool:
        return self._need().exec_run(["test", "-e", self._abs(path)])[0] == 0

    def is_dir(self, path: str) -> bool:
        return self._need().exec_run(["test", "-d", self._abs(path)])[0] == 0

    def remove_file(self, path: str) -> None:
        self._need().exec_run(["rm", "-f", "--", self._abs(path)])

    def diff(self) -> str:
        # Not through _run: a cut diff would be a corrupt patch.
        script = (
            "cd /testbed && git add -A >/dev/null && "
            f"git diff --cached --binary {shlex.quote(self.task.base_commit)}"
        )
        code, out = self._need().exec_run(["bash", "-c", script], workdir="/testbed")
        if code:
            raise RuntimeSetupError(f"git diff failed in the container: {out[-500:]!r}")
        return (out or b"").decode("utf-8", "replace")

    def evaluate(self, patch: str) -> EvalResult:
        """SWE-bench style, in a fresh container: the model patch without test-file hunks, test
        files checked out at the base commit, the test_patch, then the test command."""
        task = self.task
        if task is None:
            raise RuntimeSetupError("call reset(task) first")
        t0 = time.monotonic()
        tests = patch_files(task.test_patch)
        model_patch, dropped = filter_patch(patch, frozenset(tests))
        container = self._start(task)
        try:
            self._put(container, "/tmp/model.diff", model_patch.encode("utf-8"))
            self._put(container, "/tmp/test.diff", task.test_patch.encode("utf-8"))
            if model_patch.strip():
                r = self._run(container, "git apply --whitespace=nowarn /tmp/model.diff", 120)
                if r.exit_code != 0:
                    g = grading.failed_grade(f"patch does not apply: {r.output[:500]}", False)
                    return EvalResult(g, r.output, dropped, time.monotonic() - t0)
            quoted = " ".join(shlex.quote(t) for t in tests)
            restore = f"git checkout {task.base_commit} -- {quoted} 2>/dev/null; " if tests else ""
            r = self._run(container, restore + "git apply /tmp/test.diff", 120)
            if r.exit_code != 0:
                g = grading.failed_grade(f"test_patch does not apply: {r.output[:500]}", True)
                return EvalResult(g, r.output, dropped, time.monotonic() - t0)
            result = self._run(container, default_test_cmd(task), self.eval_timeout_s)
            return EvalResult(
                grade_log(task, result), result.output[-20000:], dropped, time.monotonic() - t0
            )
        finally:
            container.remove(force=True)
