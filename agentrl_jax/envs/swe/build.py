"""Builds real bug-fix tasks offline, the way SWE-smith does, from a pure-Python package with its
own pytest suite.

    1. The package's source tree is committed to a git repository (``repos/<name>``): the clean
       commit C0.
    2. The clean suite runs twice in the sandbox; test ids whose status differs between the runs
       are dropped, and the package is skipped when the suite takes ``max_suite_s`` or more.
    3. AST mutations (``mutations``) are applied one at a time to the package's non-test files
       and the suite re-run; a mutation becomes a task when 1 <= |FAIL_TO_PASS| <= ``max_f2p``
       (FAIL_TO_PASS: stable passing tests that now fail; PASS_TO_PASS: the rest).
    4. Each task is a commit on top of C0 with the bug in and the test files that hold failing
       tests deleted (hidden from the agent); ``patch`` restores the code (the gold fix),
       ``test_patch`` restores the tests. The problem statement is written from the failing
       tests' names and one-line errors, never from the patch. Each task's gold patch is checked
       to resolve it with the same grader the agent faces.

Per-mutation results are cached in ``<out>/cache/<name>-<digest>.json`` (keyed by a digest of the
source tree and the build settings), so an interrupted or repeated build resumes where it was.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable

from agentrl_jax.envs.swe import grading, mutations
from agentrl_jax.envs.swe.runtime import _GIT, LocalRuntime, is_protected
from agentrl_jax.envs.swe.sandbox import DEFAULT_HIDDEN, Limits, Sandbox
from agentrl_jax.envs.swe.tasks import SweTask, write_jsonl

BUILDER_VERSION = 1

# Pure-Python packages whose sdists ship their pytest suites: name -> (version, sha256 of sdist).
PINNED_SDISTS = {
    "parse": ("1.20.2", "b41d604d16503c79d81af5165155c0b20f6c8d6c559efa66b4b695c3e5a0a0ce"),
    "xmltodict": ("0.14.2", "201e7c28bb210e374999d1dde6382923ab0ed1a8a5faeece48ab525b7810a553"),
    "cachetools": ("5.5.2", "1a661caa9175d26759571b2e19580f9d6393969e5dfca11fdb1f947a23e640d4"),
}


class BuildError(RuntimeError):
    """A package cannot be turned into tasks (no tests, suite too slow, bad sdist, ...)."""


@dataclasses.dataclass(frozen=True)
class BuildConfig:
    """Task-builder settings.

    Attributes:
      max_f2p: most FAIL_TO_PASS tests a kept task may have.
      max_suite_s: a suite (clean or mutated) must finish under this many seconds.
      max_mutations: mutations tried per package (sampled with ``seed``).
      max_tasks: tasks kept per package.
      seed: sampling seed.
      backend: sandbox backend (None: detect).
      validate: check that each task's gold patch resolves it.
    """

    max_f2p: int = 10
    max_suite_s: float = 60.0
    max_mutations: int = 40
    max_tasks: int = 10
    seed: int = 0
    backend: str | None = None
    validate: bool = True


def _tree_digest(root: str) -> str:
    h = hashlib.sha256()
    for dirpath, dirs, files in sorted(os.walk(root)):
        dirs[:] = sorted(d for d in dirs if d not in (".git", "__pycache__"))
        for name in sorted(files):
            path = os.path.join(dirpath, name)
            h.update(os.path.relpath(path, root).encode() + b"\0")
            with open(path, "rb") as f:
                h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()[:16]


def detect_layout(src: str) -> tuple[str, str]:
    """(PYTHONPATH entry, test directory) of a package tree.

    Raises:
      BuildError: no tests/ or test/ directory.
    """
    tests = next((d for d in ("tests", "test") if os.path.isdir(os.path.join(src, d))), None)
    if tests is None:
        raise BuildError(f"{src}: no tests/ or test/ directory; a pytest suite is required")
    return ("src" if os.path.isdir(os.path.join(src, "src")) else "."), tests


def test_command(src: str) -> str:
    """The pytest command line of a package (its addopts are dropped: plugins may be missing)."""
    pythonpath, tests = detect_layout(src)
    return (
        f"PYTHONPATH={pythonpath} python -m pytest -rA -p no:cacheprovider -o addopts='' "
        f"-W ignore::DeprecationWarning {tests}"
    )


def source_files(src: str) -> list[str]:
    """Non-test .py files of the package (relative paths), the mutation targets."""
    out = []
    for dirpath, dirs, files in os.walk(src):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in ("docs", "build"))
        for name in sorted(files):
            rel = os.path.relpath(os.path.join(dirpath, name), src)
            if name.endswith(".py") and not is_protected(rel) and name != "setup.py":
                out.append(rel)
    return out


def _run_suite(box: Sandbox, cmd: str, timeout_s: float) -> tuple[dict[str, str], str, float, bool]:
    r = box.run(cmd, timeout_s=timeout_s)
    return grading.parse_pytest(r.output), r.output, r.wall_s, r.timed_out


def _commit_task(repo: str, clean: str, rel: str, mutated: str, hide: list[str], msg: str) -> str:
    """A commit on top of ``clean`` with ``rel`` replaced and ``hide`` deleted (no checkout)."""
    with tempfile.NamedTemporaryFile(prefix="agentrl_idx_") as idx:
        env = {**os.environ, "GIT_INDEX_FILE": idx.name}

        def git(*args, stdin=None):
            r = subprocess.run(
                [*_GIT, "-C", repo, *args], input=stdin, capture_output=True, env=env, check=True
            )
            return r.stdout.decode().strip()

        git("read-tree", clean)
        blob = git("hash-object", "-w", "--stdin", stdin=mutated.encode("utf-8"))
        git("update-index", "--cacheinfo", f"100644,{blob},{rel}")
        for path in hide:
            git("update-index", "--force-remove", path)
        tree = git("write-tree")
        sha = git("commit-tree", tree, "-p", clean, "-m", msg)
        git("update-ref", f"refs/tasks/{sha[:12]}", sha)
        return sha


def _problem_statement(name: str, f2p: list[str], errors: dict[str, str]) -> str:
    lines = [
        f"Some behaviour of the `{name}` package is broken. These tests fail:",
        "",
    ]
    for t in f2p:
        err = errors.get(t, "").strip()
        lines.append(f"- {t}" + (f": {err[:200]}" if err else ""))
    lines += [
        "",
        "Find the bug in the library code and fix it; do not edit the tests. The failing tests "
        "are not in your copy of the repository.",
    ]
    return "\n".join(lines)


def build_tasks(
    package_dir: str,
    out_dir: str,
    name: str | None = None,
    config: BuildConfig = BuildConfig(),
    progress: Callable[[str], None] = print,
) -> list[SweTask]:
    """Builds tasks from one unpacked package; returns them (the caller writes the JSONL).

    Args:
      package_dir: the package's source tree (setup.py/pyproject.toml, the package, tests/).
      out_dir: output folder; repositories go to ``out_dir/repos``, the cache to ``out_dir/cache``.
      name: the package's name (default: the folder's name).
      config: builder settings.
      progress: called with one line per step.

    Raises:
      BuildError: no tests, a failing clean suite or one too slow.
    """
    name = name or os.path.basename(os.path.normpath(package_dir))
    test_cmd = test_command(package_dir)
    digest = _tree_digest(package_dir)
    key = hashlib.sha256(
        json.dumps([digest, BUILDER_VERSION, dataclasses.astuple(config)[:4], test_cmd]).encode()
    ).hexdigest()[:16]
    os.makedirs(os.path.join(out_dir, "cache"), exist_ok=True)
    cache_path = os.path.join(out_dir, "cache", f"{name}-{key}.json")
    cache = {}
    if os.path.exists(cache_path):
        with open(cache_path) as f:
            cache = json.load(f)
    repo = os.path.join(out_dir, "repos", name)
    clean = _prepare_repo(package_dir, repo)

    work = tempfile.mkdtemp(prefix=f"agentrl_build_{name}_")
    try:
        os.chmod(work, 0o755)
        ws = os.path.join(work, "ws")
        shutil.copytree(package_dir, ws, symlinks=True, ignore=shutil.ignore_patterns(".git"))
        limits = Limits(timeout_s=config.max_suite_s, cpu_s=int(config.max_suite_s * 2) + 5)
        with Sandbox(ws, limits, config.backend, hidden=(*DEFAULT_HIDDEN, out_dir)) as box:
            tasks = _build_in(
                box, ws, name, repo, clean, test_cmd, config, cache, cache_path, progress
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if config.validate:
        tasks = _validate(tasks, config, progress)
    progress(f"[{name}] {len(tasks)} task(s)")
    return tasks


def _build_in(box, ws, name, repo, clean, test_cmd, config, cache, cache_path, progress):
    def save():
        tmp = cache_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(cache, f)
        os.replace(tmp, cache_path)

    if "clean" not in cache:
        runs = []
        for i in range(2):
            statuses, log, wall, timed_out = _run_suite(box, test_cmd, config.max_suite_s)
            if timed_out or wall >= config.max_suite_s:
                raise BuildError(f"[{name}] clean suite took >= {config.max_suite_s:.0f}s")
            if not statuses:
                raise BuildError(f"[{name}] clean suite produced no test results:\n{log[-2000:]}")
            runs.append((statuses, wall))
            progress(f"[{name}] clean run {i + 1}/2: {len(statuses)} tests in {wall:.1f}s")
        (a, wall_a), (b, wall_b) = runs
        stable = sorted(t for t in a if a[t] == grading.PASSED and b.get(t) == grading.PASSED)
        unstable = sorted(t for t in set(a) | set(b) if a.get(t) != b.get(t))
        cache["clean"] = {"stable": stable, "unstable": unstable, "wall": max(wall_a, wall_b)}
        save()
    stable = cache["clean"]["stable"]
    if cache["clean"]["unstable"]:
        progress(f"[{name}] dropped {len(cache['clean']['unstable'])} unstable test id(s)")
    if not stable:
        raise BuildError(f"[{name}] no test passes on the clean package")
    timeout = min(config.max_suite_s, max(10.0, 5 * cache["clean"]["wall"]))

    candidates = []
    for rel in source_files(ws):
        with open(os.path.join(ws, rel), encoding="utf-8") as f:
            text = f.read()
        try:
            candidates += [(rel, text, m) for m in mutations.find_mutations(text)]
        except SyntaxError:
            continue
    random.Random(config.seed).shuffle(candidates)
    candidates = candidates[: config.max_mutations]
    progress(f"[{name}] trying {len(candidates)} mutation(s)")

    tasks, t0 = [], time.monotonic()
    for i, (rel, text, m) in enumerate(candidates):
        if len(tasks) >= config.max_tasks:
            break
        ck = f"{rel}:{m.key}"
        mutated = mutations.apply(text, m)
        if ck not in cache:
            path = os.path.join(ws, rel)
            with open(path, "w", encoding="utf-8") as f:
                f.write(mutated)
            try:
                statuses, log, wall, timed_out = _run_suite(box, test_cmd, timeout)
            finally:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text)
            f2p = [t for t in stable if statuses.get(t) != grading.PASSED]
            errors = grading.failure_messages(log)
            cache[ck] = {
                "f2p": f2p,
                "errors": {t: errors.get(t, "") for t in f2p},
                "wall": wall,
                "timed_out": timed_out,
                "ran": bool(statuses),
            }
            save()
        res = cache[ck]
        keep = (
            res["ran"]
            and not res["timed_out"]
            and res["wall"] < config.max_suite_s
            and 1 <= len(res["f2p"]) <= config.max_f2p
        )
        if keep:
            tasks.append(_make_task(name, repo, clean, rel, mutated, m, res, stable, test_cmd))
        rate = (i + 1) / max(time.monotonic() - t0, 1e-9)
        progress(
            f"[{name}] mutation {i + 1}/{len(candidates)} {m.op} {rel}:{m.lineno}: "
            f"|F2P|={len(res['f2p'])} {'kept' if keep else 'dropped'}; "
            f"{len(tasks)} task(s), {rate:.2f}/s"
        )
    return tasks


def _make_task(name, repo, clean, rel, mutated, m, res, stable, test_cmd) -> SweTask:
    f2p = list(res["f2p"])
    hide = sorted({t.split("::")[0] for t in f2p})
    iid = f"{name}__{m.op}__{hashlib.sha256((rel + m.key).encode()).hexdigest()[:8]}"
    sha = _commit_task(repo, clean, rel, mutated, hide, f"task {iid}")

    def diff(*paths):
        r = subprocess.run(
            [*_GIT, "-C", repo, "diff", "--binary", sha, clean, "--", *paths],
            capture_output=True,
            check=True,
        )
        return r.stdout.decode("utf-8")

    return SweTask(
        instance_id=iid,
        repo=f"local/{name}",
        base_commit=sha,
        problem_statement=_problem_statement(name, f2p, res["errors"]),
        patch=diff(rel),
        test_patch=diff(*hide),
        fail_to_pass=tuple(f2p),
        pass_to_pass=tuple(t for t in stable if t not in f2p),
        test_cmd=test_cmd,
        log_parser="pytest",
        source="swe-smith-local",
        repo_path=os.path.abspath(repo),
    )


def _validate(tasks, config, progress) -> list[SweTask]:
    """Keeps the tasks whose gold patch resolves them and whose empty patch does not."""
    kept = []
    limits = Limits(timeout_s=config.max_suite_s, cpu_s=int(config.max_suite_s * 2) + 5)
    rt = LocalRuntime(eval_limits=limits, backend=config.backend)
    try:
        for t in tasks:
            rt.reset(t)
            gold = rt.evaluate(t.patch).grade
            if gold.resolved == 1.0:
                kept.append(t)
            else:
                progress(f"[{t.instance_id}] dropped: gold patch does not resolve ({gold.reason})")
    finally:
        rt.close()
    return kept


def _prepare_repo(src: str, repo: str) -> str:
    """Commits ``src`` to the git repository ``repo`` (reusing it when the tree is the same)."""
    os.makedirs(repo, exist_ok=True)
    env = {**os.environ, "GIT_DIR": os.path.join(repo, ".git"), "GIT_WORK_TREE": src}

    def git(*args):
        r = subprocess.run([*_GIT, *args], capture_output=True, env=env, check=True)
        return r.stdout.decode().strip()

    if not os.path.isdir(os.path.join(repo, ".git")):
        git("init", "-q")
    with open(os.path.join(repo, ".git", "info", "exclude"), "a") as f:
        f.write("__pycache__/\n*.pyc\n.git\n")
    git("add", "-A")
    same = (
        subprocess.run(
            [*_GIT, "diff", "--cached", "--quiet", "HEAD"], env=env, capture_output=True
        ).returncode
        == 0
    )
    if same:  # unchanged tree: keep the commit the cached tasks were built on
        return git("rev-parse", "HEAD")
    git("commit", "-q", "-m", "clean")
    git("tag", "-f", "clean")
    return git("rev-parse", "HEAD")


def fetch_sdist(name: str, cache_dir: str, progress: Callable[[str], None] = print) -> str:
    """Downloads a pinned sdist with pip (verifying its sha256) and unpacks it; returns the tree.

    Raises:
      BuildError: the package is not pinned, the download failed, or the hash differs.
    """
    if name not in PINNED_SDISTS:
        raise BuildError(f"package {name!r} is not pinned; pinned: {sorted(PINNED_SDISTS)}")
    version, sha = PINNED_SDISTS[name]
    os.makedirs(cache_dir, exist_ok=True)
    archive = os.path.join(cache_dir, f"{name}-{version}.tar.gz")
    if not os.path.exists(archive):
        progress(f"[{name}] downloading {name}=={version} sdist")
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--no-binary",
                ":all:",
                "--no-build-isolation",
                f"{name}=={version}",
                "-d",
                cache_dir,
            ],
            capture_output=True,
            text=True,
        )
        if r.returncode or not os.path.exists(archive):
            raise BuildError(f"pip download {name}=={version} failed: {r.stderr[-1000:]}")
    with open(archive, "rb") as f:
        got = hashlib.sha256(f.read()).hexdigest()
    if got != sha:
        os.remove(archive)
        raise BuildError(f"{archive}: sha256 {got} != pinned {sha}")
    dest = os.path.join(cache_dir, f"{name}-{version}")
    if not os.path.isdir(dest):
        with tarfile.open(archive) as tf:
            tf.extractall(cache_dir, filter="data")
    shutil.rmtree(os.path.join(dest, "tests", "__pycache__"), ignore_errors=True)
    return dest


def write_tasks(path: str, tasks: list[SweTask]) -> None:
    """Writes the JSONL with repo paths relative to its folder (the output is relocatable)."""
    write_jsonl(path, tasks, base_dir=os.path.dirname(os.path.abspath(path)))
