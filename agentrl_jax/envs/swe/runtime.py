"""The runtime interface (where the agent's repository lives) and the local, sandboxed runtime.

    rt.reset(task)                 fresh copy of the repository at task.base_commit
    rt.exec(command, timeout_s)    a fresh bash in the sandbox, at the repository root
    rt.read_file / write_file / exists / is_dir / remove_file    host-side, confined to the copy
    rt.diff()                      the agent's changes as a git diff
    rt.evaluate(patch)             grade a patch on a fresh copy (tests restored from pristine)
    rt.close()

Evaluation follows SWE-bench: a fresh copy of the base commit, the model patch applied with its
hunks on test files dropped (``filter_patch``: test files, conftest.py and pytest configuration
stay pristine, so editing tests earns nothing), then the task's test_patch, then the test command;
the log is parsed and graded (``grading``). Every failure mode (patch that does not apply, test
command not found, timeout, empty log) ends in a zero-reward ``EvalResult`` with its reason.
"""

from __future__ import annotations

import abc
import dataclasses
import os
import re
import shutil
import subprocess
import tempfile
import time

from agentrl_jax.envs.swe import grading
from agentrl_jax.envs.swe.sandbox import DEFAULT_HIDDEN, ExecResult, Limits, Sandbox
from agentrl_jax.envs.swe.tasks import SweTask

_CONFIG_FILES = {"pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml", "noxfile.py"}
_TEST_DIRS = {"tests", "test", "testing"}
_DIFF_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)", re.M)
_GIT = ["git", "-c", "safe.directory=*", "-c", "core.hooksPath=/dev/null"]
_GIT += ["-c", "core.fsmonitor=false", "-c", "user.name=agentrl", "-c", "user.email=a@b"]
AGENT_LIMITS = Limits(timeout_s=60)
EVAL_LIMITS = Limits(timeout_s=300, cpu_s=600)


class RuntimeSetupError(RuntimeError):
    """The runtime cannot start this task (no local repository, base commit missing, ...)."""


@dataclasses.dataclass
class EvalResult:
    """The outcome of evaluating one patch.

    Attributes:
      grade: rewards and the verdict (``grade.infra_failure`` for runs that proved nothing).
      log: the tail of the test log (or the error that stopped the run).
      dropped_files: files whose changes were discarded because they are tests or test config.
      wall_s: seconds the evaluation took.
    """

    grade: grading.Grade
    log: str = ""
    dropped_files: tuple[str, ...] = ()
    wall_s: float = 0.0


def patch_files(patch: str) -> list[str]:
    """Paths a git diff touches (the b/ side, and the a/ side for deletions/renames)."""
    out = []
    for pair in _DIFF_HEADER.findall(patch):
        for p in pair:
            if p not in out:
                out.append(p)
    return out


def is_protected(path: str, extra: frozenset[str] = frozenset()) -> bool:
    """Test files and test configuration, which grading restores from pristine."""
    parts = path.split("/")
    name = parts[-1]
    return (
        path in extra
        or name == "conftest.py"
        or (name.startswith("test_") and name.endswith(".py"))
        or name.endswith("_test.py")
        or any(p in _TEST_DIRS for p in parts[:-1])
        or (len(parts) == 1 and name in _CONFIG_FILES)
    )


def filter_patch(patch: str, extra: frozenset[str] = frozenset()) -> tuple[str, tuple[str, ...]]:
    """Drops the file sections of a git diff that touch protected paths.

    Returns:
      (the remaining diff, the dropped paths).
    """
    starts = [m.start() for m in _DIFF_HEADER.finditer(patch)]
    if not starts:
        return patch, ()
    kept, dropped = [patch[: starts[0]]], []
    for i, s in enumerate(starts):
        section = patch[s : starts[i + 1] if i + 1 < len(starts) else len(patch)]
        a, b = _DIFF_HEADER.match(section).groups()
        if is_protected(a, extra) or is_protected(b, extra):
            dropped += [p for p in dict.fromkeys((a, b)) if p not in dropped]
        else:
            kept.append(section)
    return "".join(kept), tuple(dropped)


def default_test_cmd(task: SweTask) -> str:
    """The task's test command, else pytest on the files its test_patch touches."""
    if task.test_cmd:
        return task.test_cmd
    files = [f for f in patch_files(task.test_patch) if f.endswith(".py")]
    return "python -m pytest -rA -p no:cacheprovider " + " ".join(files)


def grade_log(task: SweTask, result: ExecResult) -> grading.Grade:
    """Parses a test run's output and grades it; says why a run proved nothing."""
    statuses = grading.LOG_PARSERS[task.log_parser](result.output)
    if result.exit_code == 127 and not statuses:
        return grading.failed_grade(
            f"test command not found (exit 127): {result.output.strip()[-300:]}", True
        )
    g = grading.grade(statuses, task.fail_to_pass, task.pass_to_pass)
    if result.timed_out:
        g = dataclasses.replace(g, reason=g.reason + "; the test run timed out")
    return g


class Runtime(abc.ABC):
    """Where an agent works on one task at a time."""

    @abc.abstractmethod
    def reset(self, task: SweTask) -> None:
        """Starts ``task`` on a fresh copy of its repository."""

    @abc.abstractmethod
    def exec(self, command: str, timeout_s: float = 60.0) -> ExecResult:
        """Runs ``command`` in a fresh bash at the repository root."""

    @abc.abstractmethod
    def read_file(self, path: str) -> str:
        """The text of a file (path relative to the repository root)."""

    @abc.abstractmethod
    def write_file(self, path: str, text: str) -> None:
        """Writes a file, creating parent directories."""

    @abc.abstractmethod
    def exists(self, path: str) -> bool: ...

    @abc.abstractmethod
    def is_dir(self, path: str) -> bool: ...

    @abc.abstractmethod
    def remove_file(self, path: str) -> None: ...

    @abc.abstractmethod
    def diff(self) -> str:
        """The agent's changes since reset, as a git diff."""

    @abc.abstractmethod
    def evaluate(self, patch: str) -> EvalResult:
        """Grades ``patch`` against the current task on a fresh copy."""

    @abc.abstractmethod
    def close(self) -> None:
        """Frees the copy and its sandbox. Safe to call twice."""


def _git(args: list[str], cwd: str | None = None, stdin: bytes | None = None, **env) -> bytes:
    full_env = {**os.environ, **env}
    r = subprocess.run(_GIT + args, cwd=cwd, input=stdin, capture_output=True, env=full_env)
    if r.returncode:
        raise RuntimeSetupError(
            f"git {' '.join(args[:3])} failed: {r.stderr.decode(errors='replace')[-500:]}"
        )
    return r.stdout


class LocalRuntime(Runtime):
    """Works on a temporary copy of a local git repository; every command runs in a Sandbox.

    Args:
      limits: limits of each agent command (its ``timeout_s`` is the default bash timeout).
      eval_limits: limits of the test run in ``evaluate``.
      backend: sandbox backend (None: ``sandbox.detect_backend``).
      hidden: extra host paths masked in the sandbox (e.g. the task JSONL's folder, which holds
        the gold patches); the task's repo_path and this runtime's own folder always are.
      max_file_bytes: largest file ``read_file`` returns.
    """

    def __init__(
        self,
        limits: Limits = AGENT_LIMITS,
        eval_limits: Limits = EVAL_LIMITS,
        backend: str | None = None,
        hidden: tuple[str, ...] = (),
        max_file_bytes: int = 4 << 20,
    ):
        self.limits, self.eval_limits, self.backend = limits, eval_limits, backend
        self.hidden, self.max_file_bytes = hidden, max_file_bytes
        self.task: SweTask | None = None
        self.root = self.ws = None
        self.sandbox: Sandbox | None = None
        self._evals = 0

    # --- lifecycle -------------------------------------------------------------------------
    def reset(self, task: SweTask) -> None:
        self.close()
        if not task.repo_path:
            raise RuntimeSetupError(
                f"task {task.instance_id!r} has no repo_path: the local runtime needs a local git "
                "repository (tasks from launch.make_swe_tasks); run SWE-Gym tasks with "
                "DockerRuntime"
            )
        if not os.path.isdir(task.repo_path):
            raise RuntimeSetupError(
                f"task {task.instance_id!r}: repo_path {task.repo_path!r} is not a directory"
            )
        self.task = task
        self.root = tempfile.mkdtemp(prefix="agentrl_swe_")
        os.chmod(self.root, 0o755)  # the sandbox uid must traverse it
        self.pristine = os.path.join(self.root, "pristine")
        self.ws = os.path.join(self.root, "ws")
        self.gitdir = os.path.join(self.root, "git")
        os.mkdir(self.pristine)
        tar = _git(["-C", task.repo_path, "archive", "--format=tar", task.base_commit])
        subprocess.run(["tar", "-x", "-C", self.pristine], input=tar, check=True)
        shutil.copytree(self.pristine, self.ws, symlinks=True)
        # The git dir lives outside the workspace, where sandboxed code cannot plant hooks or
        # config that the host-side `git` would run.
        env = {"GIT_DIR": self.gitdir, "GIT_WORK_TREE": self.ws}
        _git(["init", "-q"], **env)
        _git(["add", "-A"], **env)
        _git(["commit", "-q", "--allow-empty", "-m", "base"], **env)
        hidden = (*DEFAULT_HIDDEN, task.repo_path, self.root, *self.hidden)
        self.sandbox = Sandbox(
            self.ws, self.limits, self.backend, hidden=[h for h in hidden if os.path.exists(h)]
        )

    def close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
            self.sandbox = None
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def _need(self) -> SweTask:
        if self.task is None or self.sandbox is None:
            raise RuntimeSetupError("call reset(task) first")
        return self.task

    # --- agent side ------------------------------------------------------------------------
    def exec(self, command: str, timeout_s: float = 60.0) -> ExecResult:
        self._need()
        return self.sandbox.run(command, timeout_s=timeout_s)

    def _path(self, path: str) -> str:
        """Host path of ``path``, refusing anything (a symlink included) that leaves the copy."""
        self._need()
        full = os.path.realpath(os.path.join(self.ws, path))
        if full != self.ws and not full.startswith(self.ws + os.sep):
            raise PermissionError(f"{path!r} is outside the repository")
        return full

    def read_file(self, path: str) -> str:
        full = self._path(path)
        if os.path.getsize(full) > self.max_file_bytes:
            raise ValueError(f"file is larger than {self.max_file_bytes} bytes; use bash to view")
        with open(full, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def write_file(self, path: str, text: str) -> None:
        full = self._path(path)
        parent = os.path.dirname(full)
        os.makedirs(parent, exist_ok=True)
        with open(full, "w", encoding="utf-8") as f:
            f.write(text)
        self.sandbox.own(parent)

    def exists(self, path: str) -> bool:
        return os.path.exists(self._path(path))

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(self._path(path))

    def remove_file(self, path: str) -> None:
        os.remove(self._path(path))

    def diff(self) -> str:
        self._need()
        env = {"GIT_DIR": self.gitdir, "GIT_WORK_TREE": self.ws}
        _git(["add", "-A"], **env)
        return _git(["diff", "--cached", "--binary", "HEAD"], **env).decode("utf-8", "replace")

    # --- grading ---------------------------------------------------------------------------
    def evaluate(self, patch: str) -> EvalResult:
        task = self._need()
        t0 = time.monotonic()
        self._evals += 1
        work = os.path.join(self.root, f"eval{self._evals}")
        shutil.copytree(self.pristine, work, symlinks=True)
        try:
            return self._evaluate_in(task, work, patch, t0)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def _apply(self, work: str, patch: str) -> str | None:
        """Applies a diff in ``work``; returns git's complaint, or None on success."""
        if not patch.strip():
            return None
        # The ceiling stops git from finding an enclosing repository and applying there.
        env = {**os.environ, "GIT_CEILING_DIRECTORIES": os.path.dirname(work)}
        r = subprocess.run(
            [*_GIT, "apply", "--whitespace=nowarn", "-"],
            cwd=work,
            input=patch.encode("utf-8"),
            capture_output=True,
            env=env,
        )
        return r.stderr.decode(errors="replace").strip() if r.returncode else None

    def _evaluate_in(self, task: SweTask, work: str, patch: str, t0: float) -> EvalResult:
        protected = frozenset(patch_files(task.test_patch))
        model_patch, dropped = filter_patch(patch, protected)
        err = self._apply(work, model_patch)
        if err:
            g = grading.failed_grade(f"patch does not apply: {err[:500]}", False)
            return EvalResult(g, err, dropped, time.monotonic() - t0)
        err = self._apply(work, task.test_patch)
        if err:
            g = grading.failed_grade(f"test_patch does not apply (broken task): {err[:500]}", True)
            return EvalResult(g, err, dropped, time.monotonic() - t0)
        hidden = (*DEFAULT_HIDDEN, task.repo_path, self.ws, self.pristine, *self.hidden)
        with Sandbox(
            work, self.eval_limits, self.backend, hidden=[h for h in hidden if os.path.exists(h)]
        ) as box:
            result = box.run(default_test_cmd(task))
        return EvalResult(
            grade_log(task, result), result.output[-20000:], dropped, time.monotonic() - t0
        )
