"""SWE sandbox benchmark: the cost of the jail per command, and graded evaluations per minute.

    python -m launch.bench swe --out bench_swe.json

Workloads, each measured side by side in the same run:

* ``sandbox_overhead_<backend>``: wall time of a trivial command (``true``) in the sandbox
  (ours) vs the same command as a plain subprocess with the same output capture (reference).
  ``overhead_ms`` = ours - reference; the target is <= 100 ms.
* ``evaluations_per_minute``: full ``LocalRuntime.evaluate(gold patch)`` on a task built from the
  toy package (fresh copy, patch filtering and application, sandboxed pytest, log parsing,
  grading) vs the bare test command run unsandboxed on an already-fixed tree (reference).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

from agentrl_jax.benchmarks.report import Report, Row, timed
from agentrl_jax.envs.swe import build, grading, toy_package
from agentrl_jax.envs.swe.runtime import LocalRuntime
from agentrl_jax.envs.swe.sandbox import BACKENDS, Limits, Sandbox, SandboxError, run_capped

OVERHEAD_TARGET_MS = 100.0


def _paired(ours, reference, repeats: int, warmup: int) -> tuple[float, float]:
    """Median seconds of each, run alternately so that load from other jobs hits both alike."""
    for _ in range(warmup):
        ours(), reference()
    a, b = [], []
    for _ in range(repeats):
        a.append(timed(ours, repeats=1, warmup=0))
        b.append(timed(reference, repeats=1, warmup=0))
    return sorted(a)[repeats // 2], sorted(b)[repeats // 2]


def _overhead(backend: str, workdir: str, repeats: int) -> Row:
    ws = os.path.join(workdir, f"ws_{backend}")
    os.makedirs(ws, exist_ok=True)
    with Sandbox(ws, Limits(timeout_s=30), backend=backend) as box:
        ours, ref = _paired(
            lambda: box.run("true"), lambda: run_capped(["bash", "-c", "true"]), repeats, 2
        )
    ours, ref = ours * 1e3, ref * 1e3
    return Row(
        f"sandbox_overhead_{backend}",
        ours,
        ref,
        "ms/command",
        higher_is_better=False,
        extra={"overhead_ms": ours - ref, "target_overhead_ms": OVERHEAD_TARGET_MS},
    )


def _evaluations(workdir: str, repeats: int) -> Row:
    pkg = toy_package.write(os.path.join(workdir, "minicalc"))
    config = build.BuildConfig(max_mutations=6, max_tasks=1, validate=False)
    (task,) = build.build_tasks(pkg, os.path.join(workdir, "out"), config=config,
                                progress=lambda s: None)  # fmt: skip
    # The same interpreter and environment as inside the sandbox.
    path = f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin"
    env = {"PATH": path, "HOME": "/tmp", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}

    def reference():
        r = run_capped(["bash", "-c", task.test_cmd], Limits(timeout_s=120), cwd=pkg, env=env)
        statuses = grading.parse_pytest(r.output)
        assert grading.grade(statuses, task.fail_to_pass, task.pass_to_pass).resolved == 1.0

    rt = LocalRuntime()
    try:
        rt.reset(task)

        def ours():
            assert rt.evaluate(task.patch).grade.resolved == 1.0

        t_ours, t_ref = _paired(ours, reference, repeats, 1)
    finally:
        rt.close()
    return Row(
        "evaluations_per_minute",
        60.0 / t_ours,
        60.0 / t_ref,
        "evaluations/min",
        extra={"seconds_per_evaluation": t_ours, "reference_seconds": t_ref},
    )


def run(quick: bool) -> Report:
    """Measures the workloads; ``quick`` uses fewer repeats (plumbing check)."""
    report = Report("swe")
    workdir = tempfile.mkdtemp(prefix="agentrl_bench_swe_")
    try:
        for backend in BACKENDS:
            try:
                report.add(_overhead(backend, workdir, repeats=5 if quick else 30))
            except SandboxError as e:
                report.facts[f"{backend}_unavailable"] = str(e)
        report.add(_evaluations(workdir, repeats=1 if quick else 5))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report.facts["overhead_target_ms"] = OVERHEAD_TARGET_MS
    return report
