"""Studies: a baseline config, variants and seeds, every (variant, seed) cell trained and evaluated.

    study = load_study("configs/studies/NAME.py")   # the study file (experiments/study_spec.py)
    run_study(study, "studies/NAME", parallel=2)     # what ``launch.study`` runs

The study file's format, its validation and each cell's config: ``experiments/study_spec.py``;
the cells' numbers, the tables over seeds and the curves: ``experiments/study_results.py``. This
module runs the cells and re-exports both modules' names.

Each cell runs ``launch.train`` as a subprocess on ``WORKDIR/cells/<variant>/seed-<s>/
cell_config.json`` (via ``configs/from_json.py``): a killed or crashed cell loses only itself,
its memory is returned when it ends, and rerunning resumes it from its last checkpoint.
A cell is finished when its ``done`` marker exists, written (atomically) after its
``result.json``; a rerun of the study never repeats a finished cell.

Shared SFT (the study's ``shared_sft`` variants): per seed, a start ``WORKDIR/starts/seed-<s>``
runs the first shared variant's config with ``--stop_after=sft`` (SFT, its evaluation, the
checkpoint RL begins from), once, before any of the seed's shared cells. Each shared cell's run
folder begins as a copy of the start's and resumes from it with its own config
(``--allow_config_change``: the RL settings that differ are recorded in the run's
``config_changes.jsonl``), so the variants' RL phases begin from the very same SFT policy.
"""

from __future__ import annotations

import glob
import json
import math
import os
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from agentrl_jax.experiments import study_results, study_spec
from agentrl_jax.experiments.study_results import (
    aggregate,
    collect_cell,
    plot_study_curve,
    results_markdown,
)
from agentrl_jax.experiments.study_spec import (
    EVALUATION_KEYS,
    STUDY_KEYS,
    Evaluation,
    Study,
    StudyError,
    cell_config,
    load_study,
)
from agentrl_jax.rollout.tasks import report_levels

FROM_JSON = "configs/from_json.py"


def cell_dir(workdir: str, variant: str, seed: int) -> str:
    return os.path.join(workdir, "cells", variant, f"seed-{seed}")


def is_done(workdir: str, variant: str, seed: int) -> bool:
    return os.path.isfile(os.path.join(cell_dir(workdir, variant, seed), "done"))


def start_dir(workdir: str, seed: int) -> str:
    """The shared SFT start of ``seed``'s ``shared_sft`` cells."""
    return os.path.join(workdir, "starts", f"seed-{seed}")


def start_done(workdir: str, seed: int) -> bool:
    return os.path.isfile(os.path.join(start_dir(workdir, seed), "done"))


def cell_code() -> dict[str, str]:
    """The code a cell trains with: every file of the package but the study's own (this runner,
    the study file's reader and the results' tables: a change to them changes no cell's run)."""
    from agentrl_jax.run.multihost import code_fingerprint  # noqa: PLC0415

    # agentrl_jax/experiments/study.py, study_spec.py, study_results.py
    own = {
        m.replace(".", "/") + ".py" for m in (__name__, study_spec.__name__, study_results.__name__)
    }
    return {k: v for k, v in code_fingerprint().items() if k not in own}


def reuse_cells(
    workdir: str,
    pending: Sequence[tuple[str, int]],
    sources: Sequence[str],
    code: dict[str, str] | None = None,
) -> dict[tuple[str, int], str]:
    """Fills pending cells from finished cells of other studies that ran the same thing.

    A source cell qualifies when it is done, its ``cell_config.json`` holds the same config (the
    variant's name does not matter) and its ``code.json`` the same code as this checkout's (a
    cell run by other code is never reused; ``code``: this checkout's ``cell_code()``). Its
    folder is copied whole, ``reused_from`` names it, and the ``done`` marker comes last, so a
    copy cut short is simply run.

    Returns:
      (variant, seed) -> the source cell folder, for the cells filled.
    """
    code = cell_code() if code is None else code
    donors: list[tuple[dict[str, Any], str]] = []
    for source in sources:
        for config_path in sorted(
            glob.glob(os.path.join(source, "cells", "*", "*", "cell_config.json"))
        ):
            folder = os.path.dirname(config_path)
            code_path = os.path.join(folder, "code.json")
            if not (os.path.isfile(os.path.join(folder, "done")) and os.path.isfile(code_path)):
                continue
            with open(code_path) as f:
                if json.load(f) != code:
                    continue
            with open(config_path) as f:
                donors.append((json.load(f), folder))
    filled = {}
    for cell in pending:
        folder = cell_dir(workdir, *cell)
        with open(os.path.join(folder, "cell_config.json")) as f:
            mine = json.load(f)
        source = next((d for c, d in donors if c == mine), None)
        if source is None:
            continue
        for name in os.listdir(source):
            if name in ("done", "cell_config.json"):
                continue
            src, dst = os.path.join(source, name), os.path.join(folder, name)
            if os.path.isdir(src):
                shutil.rmtree(dst, ignore_errors=True)
                shutil.copytree(src, dst, symlinks=True)
            else:
                shutil.copy2(src, dst)
        write_atomic(os.path.join(folder, "reused_from"), os.path.abspath(source) + "\n")
        write_atomic(os.path.join(folder, "done"), time.ctime() + "\n")
        filled[cell] = source
    return filled


def write_atomic(path: str, text: str) -> None:
    """Writes ``text`` to ``path`` so that a reader sees the old file or the whole new one."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def prepare(study: Study, workdir: str) -> dict[tuple[str, int], Any]:
    """Validates every cell's config (before any compute) and writes its cell_config.json.

    Returns:
      (variant, seed) -> RunConfig.
    """
    from agentrl_jax.run.config import ConfigError, from_config_dict  # noqa: PLC0415

    configs = {}
    for variant, seed in study.cells():
        cd = cell_config(study, variant, seed)
        try:
            configs[(variant, seed)] = from_config_dict(cd, num_devices=None)
        except ConfigError as e:
            raise StudyError(
                f"{study.path}: variant {variant!r}, seed {seed}: config error: {e}"
            ) from e
        folder = cell_dir(workdir, variant, seed)
        os.makedirs(folder, exist_ok=True)
        write_atomic(
            os.path.join(folder, "cell_config.json"), cd.to_json_best_effort(indent=2) + "\n"
        )
    if study.shared_sft:
        _check_shared_sft(study, configs)
        for seed in study.seeds:
            folder = start_dir(workdir, seed)
            os.makedirs(folder, exist_ok=True)
            shutil.copy2(
                os.path.join(cell_dir(workdir, study.shared_sft[0], seed), "cell_config.json"),
                os.path.join(folder, "cell_config.json"),
            )
    return configs


def _check_shared_sft(study: Study, configs: dict[tuple[str, int], Any]) -> None:
    """Shared variants must resume one RL state: the same critic or none, the same KL reference
    (the SFT start checkpoints both)."""
    first = study.shared_sft[0]
    for seed in study.seeds:
        a = configs[(first, seed)]
        for variant in study.shared_sft[1:]:
            b = configs[(variant, seed)]
            for what, get in (
                ("a critic", lambda c: c.rl_spec().needs_critic),
                ("a frozen KL reference", lambda c: c.rl_spec().kl.needs_reference),
            ):
                if get(a) != get(b):
                    raise StudyError(
                        f"{study.path}: shared_sft: variant {variant!r} "
                        f"{'has' if get(b) else 'has not'} {what} and {first!r} "
                        f"{'has' if get(a) else 'has not'}; variants sharing an SFT start "
                        "must resume the same RL state"
                    )


def generate_games(configs: Sequence[Any], progress: bool = True) -> int:
    """Builds every task the cells will read, once, before they start, for the env families that
    register a ``prepare`` hook (TextWorld: cells share the game cache; two cells in parallel
    would otherwise both build the same missing games).

    Returns:
      The number of tasks the cells use (made now or found in the cache).
    """
    from agentrl_jax.envs import registry  # noqa: PLC0415
    from agentrl_jax.rollout.tasks import parse_level  # noqa: PLC0415

    need: dict[str, dict[tuple[str, str], int]] = {}

    for cfg in configs:
        env = cfg.env
        family = registry.family(env.name)
        if not family.prepare:
            continue
        counts = need.setdefault(env.name, {})

        def want(level: str, split: str, count: int, counts=counts) -> None:
            counts[(level, split)] = max(counts.get((level, split), 0), count)

        for level in cfg.curriculum.levels:
            want(level, registry.TRAIN_SPLIT, env.num_train_tasks)
        for level in env.eval_levels:
            want(*parse_level(level, family.eval_split), env.num_eval_tasks)
        for key in report_levels(
            env.name, env.report_levels, env.eval_levels, env.num_report_tasks
        ):
            want(*parse_level(key, ""), env.num_report_tasks)
    total = 0
    for name, counts in sorted(need.items()):
        jobs = [(level, split, n) for (level, split), n in sorted(counts.items())]
        registry.family(name).hook("prepare")(jobs, progress=progress)
        total += sum(counts.values())
    return total


def _train_cmd(folder: str, *flags: str) -> list[str]:
    config = os.path.join(folder, "cell_config.json")
    return [
        sys.executable,
        "-m",
        "launch.train",
        f"--config={FROM_JSON}:{config}",
        f"--workdir={os.path.join(folder, 'run')}",
        *flags,
    ]


def _job_place(workdir: str, job: tuple[str, Any]) -> tuple[str, str]:
    """A job's folder and its name in the log: a seed's SFT start, or a (variant, seed) cell."""
    kind, key = job
    if kind == "start":
        return start_dir(workdir, key), f"SFT start seed-{key}"
    return cell_dir(workdir, *key), f"{key[0]}/seed-{key[1]}"


def _begin_from_start(folder: str, start: str) -> None:
    """A shared cell's run folder begins as a copy of its seed's SFT start (once: a rerun
    resumes the cell's own checkpoints)."""
    run = os.path.join(folder, "run")
    if os.path.isdir(run):
        return
    tmp = run + ".copying"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(os.path.join(start, "run"), tmp, symlinks=True)
    os.replace(tmp, run)
    write_atomic(os.path.join(folder, "sft_from"), os.path.abspath(start) + "\n")


def _die_with_parent() -> None:
    """In the cell's process: die when the runner does (Linux), so a killed runner never leaves
    a cell writing a workdir that the next runner resumes."""
    try:
        import ctypes  # noqa: PLC0415

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    except (OSError, AttributeError):
        pass


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


def run_study(
    study: Study,
    workdir: str,
    *,
    parallel: int = 1,
    log: Callable[[str], None] = print,
    repo: str | None = None,
    reuse: Sequence[str] = (),
    variants: Sequence[str] = (),
) -> dict[str, Any]:
    """Runs every unfinished cell (``parallel`` at a time), then writes results.json, results.md
    and learning_curve.png from every finished cell. Returns the results.

    ``reuse``: other studies' workdirs whose finished cells fill this study's cells that would
    run the same config with the same code (``reuse_cells``), e.g. a shared baseline.
    ``variants``: run only these variants' cells (empty: all); the results cover every finished
    cell, so a study can be run a few variants at a time into one workdir.

    Raises:
      StudyError: a cell's config is invalid (before anything runs), or a cell failed (after the
        others ran; its log is named).
    """
    if parallel < 1:
        raise StudyError(f"--parallel={parallel}: expected >= 1")
    unknown = [v for v in variants if v not in study.variants]
    if unknown:
        raise StudyError(
            f"{study.path}: --variants names {unknown}, which the study does not have; "
            f"its variants: {list(study.variants)}"
        )
    repo = repo or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    workdir = os.path.abspath(workdir)
    configs = prepare(study, workdir)
    cells = study.cells()
    done = {c for c in cells if is_done(workdir, *c)}
    pending = [c for c in cells if c not in done and (not variants or c[0] in variants)]
    code = cell_code()
    reused = reuse_cells(workdir, pending, reuse, code) if reuse and pending else {}
    pending = [c for c in pending if c not in reused]
    log(
        f"study {study.name}: {len(cells)} cells ({len(study.variants)} variants x "
        f"{len(study.seeds)} seeds), {len(done)} already done, "
        f"{len(reused)} reused, {len(pending)} to run"
        + (f" (variants {', '.join(variants)})" if variants else "")
        + f", {parallel} at a time; workdir {workdir}"
    )
    for cell, source in reused.items():
        log(f"  reused {cell[0]}/seed-{cell[1]}: the same config and code ran in {source}")
    if pending:
        n = generate_games([configs[c] for c in pending])
        if n:
            log(f"games: {n} TextWorld games ready in the cache")
    shared = set(study.shared_sft)
    # The jobs in run order: a seed's SFT start just before the first of its shared cells.
    queue: list[tuple[str, Any]] = []
    for cell in pending:
        sft = ("start", cell[1])
        if cell[0] in shared and not start_done(workdir, cell[1]) and sft not in queue:
            queue.append(sft)
        queue.append(("cell", cell))

    def ready(job: tuple[str, Any]) -> bool:
        kind, key = job
        return kind == "start" or key[0] not in shared or start_done(workdir, key[1])

    running: dict[tuple[str, Any], tuple[subprocess.Popen, float, Any]] = {}
    durations: list[float] = []
    failed: list[str] = []
    start = time.monotonic()
    while queue or running:
        while len(running) < parallel and any(ready(j) for j in queue):
            job = next(j for j in queue if ready(j))
            queue.remove(job)
            kind, key = job
            folder, name = _job_place(workdir, job)
            if kind == "start":
                flags = ("--stop_after=sft",)
            else:
                flags = ()
                if key[0] in shared:
                    _begin_from_start(folder, start_dir(workdir, key[1]))
                    flags = ("--allow_config_change",)
            write_atomic(os.path.join(folder, "code.json"), json.dumps(code, indent=0) + "\n")
            logf = open(os.path.join(folder, "train.log"), "ab")  # noqa: SIM115 - closed on exit
            logf.write(f"=== launch.study: {kind} {name} started {time.ctime()}\n".encode())
            logf.flush()
            with warnings.catch_warnings():
                # preexec_fn means fork then exec; JAX warns about forking once it has threads,
                # but the child only calls prctl before exec, touching no lock JAX holds.
                warnings.filterwarnings("ignore", "os.fork", RuntimeWarning)
                proc = subprocess.Popen(
                    _train_cmd(folder, *flags),
                    cwd=repo,
                    stdout=logf,
                    stderr=subprocess.STDOUT,
                    preexec_fn=_die_with_parent,
                )
            running[job] = (proc, time.monotonic(), logf)
            log(f"  start {name}")
        if queue and not running:  # what is left waits on an SFT start that failed
            for _, cell in queue:
                failed.append(f"{cell[0]}/seed-{cell[1]} (its SFT start failed)")
            queue.clear()
            break
        time.sleep(0.5)
        for job, (proc, t0, logf) in list(running.items()):
            if proc.poll() is None:
                continue
            logf.close()
            del running[job]
            kind, key = job
            folder, name = _job_place(workdir, job)
            if proc.returncode != 0:
                failed.append(f"{name} (exit {proc.returncode}; log {folder}/train.log)")
                log(f"  FAILED {name}: exit status {proc.returncode}; see {folder}/train.log")
                continue
            if kind == "start":
                wall = json.dumps({"wall_s": time.monotonic() - t0})
                write_atomic(os.path.join(folder, "result.json"), wall + "\n")
                write_atomic(os.path.join(folder, "done"), time.ctime() + "\n")
                log(f"  done {name} in {_duration(time.monotonic() - t0)}")
                continue
            env = configs[key].env
            levels = report_levels(
                env.name, env.report_levels, env.eval_levels, env.num_report_tasks
            )
            result = collect_cell(os.path.join(folder, "run"), levels)
            result["wall_s"] = time.monotonic() - t0
            if key[0] in shared:
                with open(os.path.join(start_dir(workdir, key[1]), "result.json")) as f:
                    result["sft_start_s"] = json.load(f)["wall_s"]
            write_atomic(os.path.join(folder, "result.json"), json.dumps(result, indent=2) + "\n")
            write_atomic(os.path.join(folder, "done"), time.ctime() + "\n")
            durations.append(time.monotonic() - t0)
            done = sum(is_done(workdir, *c) for c in cells)
            left = sum(k == "cell" for k, _ in queue) + len(running)
            eta = (
                _duration(sum(durations) / len(durations) * math.ceil(left / parallel))
                if left
                else "0m00s"
            )
            log(
                f"  done {name} in {_duration(durations[-1])}: {done}/{len(cells)} cells finished, "
                f"elapsed {_duration(time.monotonic() - start)}, ETA {eta}"
            )
    finished = {}
    for cell in cells:
        if is_done(workdir, *cell):
            with open(os.path.join(cell_dir(workdir, *cell), "result.json")) as f:
                finished[cell] = json.load(f)
    results = aggregate(study, finished)
    write_atomic(os.path.join(workdir, "results.json"), json.dumps(results, indent=2) + "\n")
    write_atomic(os.path.join(workdir, "results.md"), results_markdown(results))
    plot_study_curve(results, os.path.join(workdir, "learning_curve.png"))
    log(f"results: {workdir}/results.md, results.json, learning_curve.png")
    if failed:
        raise StudyError(f"{len(failed)} cell(s) failed: {', '.join(failed)}; rerun to retry them")
    return results


__all__ = [
    "EVALUATION_KEYS",
    "FROM_JSON",
    "STUDY_KEYS",
    "Evaluation",
    "Study",
    "StudyError",
    "aggregate",
    "cell_code",
    "cell_config",
    "cell_dir",
    "collect_cell",
    "generate_games",
    "is_done",
    "load_study",
    "plot_study_curve",
    "prepare",
    "results_markdown",
    "reuse_cells",
    "run_study",
    "start_dir",
    "start_done",
    "write_atomic",
]
