"""The study runner: study files, cell configs, aggregation over seeds, and (slow) a whole study
killed mid-way and resumed."""

import glob
import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
from train_cli import REPO

from agentrl_jax.envs.base import Task
from agentrl_jax.experiments import study as study_lib
from agentrl_jax.run.config import from_config_dict

SMOKE = os.path.join(REPO, "configs", "studies", "smoke.py")


def _write_study(tmp_path, body: str) -> str:
    path = tmp_path / "s.py"
    path.write_text(f"def get_study():\n    return {body}\n")
    return str(path)


def test_smoke_study_cells_get_the_overrides_seed_and_evaluation():
    study = study_lib.load_study(SMOKE)
    assert study.cells() == [("grpo", 0), ("rloo", 0), ("grpo", 1), ("rloo", 1)]
    cd = study_lib.cell_config(study, "rloo", 1)
    cfg = from_config_dict(cd, num_devices=1)
    assert cfg.seed == 1 and cfg.rl.algo == "rloo"
    assert cfg.env.report_levels == ("simple@test",) and cfg.env.num_report_tasks == 1
    assert cfg.rollout.constrain_actions
    # The baseline config itself is left as it was.
    assert (
        from_config_dict(study_lib.cell_config(study, "grpo", 0), num_devices=1).rl.algo == "grpo"
    )


STUDIES = sorted(glob.glob(os.path.join(REPO, "configs", "studies", "*.py")))


@pytest.mark.parametrize("path", STUDIES, ids=os.path.basename)
def test_every_shipped_study_validates_every_cell(path, tmp_path):
    """Every cell's config passes launch.train's validation before a study spends any compute."""
    study = study_lib.load_study(path)
    configs = study_lib.prepare(study, str(tmp_path))
    assert sorted(configs) == sorted(study.cells()) and len(study.seeds) >= 2


def test_studies_sharing_a_baseline_reuse_its_cells(tmp_path):
    """decoding's constrained cells, envrl's and algorithms' grpo cells are rl_learns' sft_rl
    cells, config for config, so --reuse copies them; reward plays other games (cooking), so none
    of its cells is theirs; step_weights' rows cells are curriculum's medium cells."""
    names = ("rl_learns", "reward", "decoding", "envrl", "algorithms", "curriculum", "step_weights")
    studies = {n: study_lib.load_study(os.path.join(REPO, "configs", "studies", f"{n}.py"))
               for n in names}  # fmt: skip
    for name, study in studies.items():
        study_lib.prepare(study, str(tmp_path / name))
    cell = lambda name, variant: json.loads(  # noqa: E731
        (tmp_path / name / "cells" / variant / "seed-1" / "cell_config.json").read_text()
    )
    assert cell("decoding", "constrained") == cell("rl_learns", "sft_rl")
    assert cell("envrl", "grpo") == cell("algorithms", "grpo") == cell("rl_learns", "sft_rl")
    assert cell("envrl", "grpo_envrl") != cell("envrl", "grpo")
    assert cell("algorithms", "gagpo") != cell("algorithms", "gigpo")
    assert cell("decoding", "free") != cell("rl_learns", "sft_rl")
    assert cell("reward", "dense") != cell("rl_learns", "sft_rl")
    assert cell("reward", "sparse") != cell("reward", "dense")
    assert cell("step_weights", "rows") == cell("curriculum", "medium")
    assert cell("step_weights", "episodes") != cell("step_weights", "rows")


@pytest.mark.parametrize(
    "body, match",
    [
        ("dict(baseline='configs/tiny_textworld.py:test', variants={}, seeds=(0,))", "non-empty"),
        ("dict(baseline='configs/tiny_textworld.py:test', variants={'a': {}}, seeds=(0, 0))",
         "distinct ints"),
        ("dict(baseline='configs/tiny_textworld.py:test', variants={'a': {}}, seeds=(0,), "
         "evaluation=dict(decoding='greedy'))", "'free', 'constrained' or None"),
        ("dict(baseline='configs/tiny_textworld.py:test', variants={'a': {}}, seeds=(0,), "
         "evaluation=dict(games=3))", r"unknown key\(s\) \['games'\]"),
        ("dict(baseline='configs/tiny_textworld.py:test', variants={'a b': {}}, seeds=(0,))",
         "variant name 'a b'"),
        ("dict(baseline='configs/tiny_textworld.py:test', variants={'a': {}}, seeds=(0,), "
         "reference='b')", r"'reference'\] is 'b'; expected one of \['a'\]"),
        ("dict(variants={'a': {}}, seeds=(0,), extra=1)", r"unknown key\(s\) \['extra'\]"),
        ("dict(baseline='configs/tiny_textworld.py:test', variants={'a': {}}, seeds=(0,), "
         "shared_sft=('a', 'b'))", r"'shared_sft'\] is \('a', 'b'\); expected a tuple of variant"),
        ("dict(baseline='configs/tiny_textworld.py:test', variants={'a': {}, "
         "'b': {'sft.epochs': 3}}, seeds=(0,), shared_sft=('a', 'b'))",
         r"names 'b', whose overrides \['sft.epochs'\] are not RL settings"),
    ],
)  # fmt: skip
def test_bad_study_files_name_the_field(tmp_path, body, match):
    with pytest.raises(study_lib.StudyError, match=match):
        study_lib.load_study(_write_study(tmp_path, body))


def test_unknown_override_key_is_the_cli_error(tmp_path):
    path = _write_study(
        tmp_path,
        "dict(baseline='configs/tiny_textworld.py:test', variants={'a': {'rl.lr': 1}}, seeds=(0,))",
    )
    study = study_lib.load_study(path)
    with pytest.raises(study_lib.StudyError) as e:
        study_lib.cell_config(study, "a", 0)
    assert "variant 'a': config error: config.rl has no key 'lr'; valid keys: actor_lr," in str(
        e.value
    )


def _cell(rate, n=100, before=0.5):
    wins, before_wins = round(rate * n), round(before * n)
    return {
        "levels": {
            "simple@test": {
                "after_sft": {"wins": before_wins, "n": n, "rate": before, "low": 0.4, "high": 0.6},
                "final": {
                    "wins": wins,
                    "n": n,
                    "rate": rate,
                    "low": rate - 0.1,
                    "high": rate + 0.1,
                },
                "gain": {"diff": rate - before, "low": -0.05, "high": 0.3},
            }
        },
        "rl_iterations": True,
        "curve": [[64, 0.3], [128, rate]],
        "iteration_s": 10.0 * rate,
    }


def test_aggregate_means_over_seeds_and_differences_paired_by_seed(tmp_path):
    path = _write_study(
        tmp_path,
        "dict(baseline='configs/tiny_textworld.py:test', variants={'base': {}, "
        "'alt': {'rl.algo': 'rloo'}}, seeds=(0, 1, 2), evaluation=dict(num_tasks=100))",
    )
    study = study_lib.load_study(path)
    cells = {("base", s): _cell(r) for s, r in zip((0, 1, 2), (0.5, 0.6, 0.7))}
    cells |= {("alt", s): _cell(r) for s, r in zip((0, 1, 2), (0.6, 0.8, 0.7))}
    results = study_lib.aggregate(study, cells)
    base = results["variants"]["base"]["levels"]["simple@test"]
    t2 = 4.302652729749464  # t(0.975, 2 degrees of freedom)
    assert base["mean"] == pytest.approx(0.6)
    assert base["high"] - base["mean"] == pytest.approx(t2 * 0.1 / math.sqrt(3))
    assert "vs_reference" not in base
    alt = results["variants"]["alt"]["levels"]["simple@test"]
    # Per-seed differences 0.1, 0.2, 0.0: mean 0.1, sd 0.1.
    vs = alt["vs_reference"]
    assert vs["seeds"] == [0, 1, 2] and vs["mean"] == pytest.approx(0.1)
    assert (vs["low"], vs["high"]) == pytest.approx(
        (0.1 - t2 * 0.1 / math.sqrt(3), 0.1 + t2 * 0.1 / math.sqrt(3))
    )
    # The RL gain over each cell's own after-SFT policy (0.5 in every cell): for alt 0.1, 0.3,
    # 0.2, mean 0.2, sd 0.1; a cell without RL (after SFT only) has none.
    gain = alt["rl_gain"]
    assert gain["seeds"] == 3 and gain["mean"] == pytest.approx(0.2)
    assert gain["high"] - gain["mean"] == pytest.approx(t2 * 0.1 / math.sqrt(3))
    sft_only = dict(_cell(0.5), rl_iterations=False)
    no_rl = study_lib.aggregate(study, {("base", 0): sft_only, ("alt", 0): _cell(0.7)})
    assert "rl_gain" not in no_rl["variants"]["base"]["levels"]["simple@test"]
    # A success rate's interval stays in [0, 1] (the t interval of 0, 0.01, 0.05 reaches -5%).
    low = {("base", s): _cell(r) for s, r in zip((0, 1, 2), (0.0, 0.01, 0.05))}
    near_zero = study_lib.aggregate(study, low | {k: v for k, v in cells.items() if k[0] == "alt"})
    assert near_zero["variants"]["base"]["levels"]["simple@test"]["low"] == 0.0
    # A cell not yet done: the means and the pairing use the seeds that exist.
    del cells[("alt", 2)]
    partial = study_lib.aggregate(study, cells)["variants"]["alt"]
    assert partial["cells_done"] == 2
    assert partial["levels"]["simple@test"]["vs_reference"]["seeds"] == [0, 1]
    md = study_lib.results_markdown(results)
    # Wall-clock per RL iteration: the seeds' medians (10 x rate here), averaged.
    assert results["variants"]["alt"]["iteration_s"] == pytest.approx(7.0)
    assert "| base | 6.0 |" in md and "| alt | 7.0 |" in md
    assert "| base | simple@test | 3 | 60.0% | [35.2, 84.8] | (reference) | |" in md
    assert "| alt | simple@test | 3 | 70.0% | [45.2, 94.8] | +10.0 | [-14.8, 34.8] |" in md
    assert "| alt | simple@test | 3 | 50.0% | 70.0% | +20.0 | [-4.8, 44.8] |" in md
    assert (
        "| alt/seed-1 | simple@test | 50.0% | [40.0, 60.0] | 80.0% | [70.0, 90.0] | +30.0 |" in md
    )
    # One seed: no spread, so no interval (null, n/a), never a made-up width.
    one = study_lib.aggregate(study, {("base", 0): _cell(0.5), ("alt", 0): _cell(0.7)})
    assert one["variants"]["alt"]["levels"]["simple@test"]["vs_reference"]["low"] is None
    json.dumps(one, allow_nan=False)  # valid JSON
    study_lib.plot_study_curve(results, str(tmp_path / "curve.png"))
    assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"


def test_results_give_success_per_task_type_and_wall_time_per_cell(tmp_path):
    path = _write_study(
        tmp_path,
        "dict(baseline='configs/tiny_textworld.py:test', variants={'grpo': {}, "
        "'gigpo': {'rl.algo': 'gigpo'}}, seeds=(0, 1), evaluation=dict(num_tasks=100), "
        "shared_sft=('grpo', 'gigpo'))",
    )
    study = study_lib.load_study(path)

    def cell(heat, cool, wall):
        c = _cell(0.5)
        c["levels"]["simple@test"]["per_type"] = {
            "pick_cool": {"after_sft": [0, 10], "final": [cool, 10]},
            "pick_heat": {"after_sft": [1, 20], "final": [heat, 20]},
        }
        return dict(c, wall_s=wall, sft_start_s=3600.0)

    cells = {("grpo", 0): cell(4, 1, 1800.0), ("grpo", 1): cell(6, 3, 2400.0)}
    cells |= {("gigpo", 0): cell(10, 0, 3000.0)}
    results = study_lib.aggregate(study, cells)
    per_type = results["variants"]["grpo"]["levels"]["simple@test"]["per_type"]
    assert per_type["pick_heat"] == {"seeds": 2, "episodes": 40, "mean": pytest.approx(0.25)}
    assert per_type["pick_cool"]["mean"] == pytest.approx(0.2)
    assert results["variants"]["grpo"]["cell_s"] == pytest.approx(2100.0)
    md = study_lib.results_markdown(results)
    assert "| grpo | simple@test | pick_heat | 2 | 40 | 25.0% |" in md
    assert "| gigpo | simple@test | pick_cool | 1 | 10 | 0.0% |" in md
    assert "| grpo | 35 min | 1h00 |" in md and "| gigpo | 50 min | 1h00 |" in md


def test_an_evaluation_level_may_name_its_own_split(tmp_path):
    path = _write_study(
        tmp_path,
        "dict(baseline='configs/tiny_textworld.py:test', variants={'a': {}}, seeds=(0,), "
        "evaluation=dict(split='test', num_tasks=3, levels=('simple', 'medium@valid')))",
    )
    cd = study_lib.cell_config(study_lib.load_study(path), "a", 0)
    assert tuple(cd.env.report_levels) == ("simple@test", "medium@valid")


def _fake_cells(tmp_path, monkeypatch, fail_variant=None):
    """Cells that "train" in a blink: each copies a prepared report.json into its run folder
    (rloo: 3 of 4 games won after RL, grpo and any other variant: 2 of 4) and logs that it
    ran."""
    from agentrl_jax.rollout.trajectory import Trajectory
    from agentrl_jax.run.evaluation import summarize

    def report(wins):
        trajs = [
            Trajectory(Task("textworld", "test", f"g/{i}", (("spec", "simple"),)), i, won=i < wins)
            for i in range(4)
        ]
        return summarize(trajs, greedy=True, num_tasks=4, decoding="constrained").to_json()

    reports = {}
    for variant, wins in (("grpo", 2), ("rloo", 3)):
        path = tmp_path / f"{variant}.json"
        evals = {"after_sft": {"simple@test": report(1)}, "after_rl": {"simple@test": report(wins)}}
        path.write_text(json.dumps({"before_after": [], "evals": evals}))
        reports[variant] = path
    script = (
        "import os, shutil, sys; folder, src, code = sys.argv[1:];"
        "run = os.path.join(folder, 'run');"
        "os.makedirs(os.path.join(run, 'tensorboard'), exist_ok=True);"
        "shutil.copy(src, os.path.join(run, 'report.json'));"
        "open(os.path.join(folder, 'ran'), 'a').write('x'); sys.exit(int(code))"
    )

    def cmd(folder):
        variant = os.path.basename(os.path.dirname(folder))
        code = 1 if variant == fail_variant else 0
        report = reports.get(variant, reports["grpo"])
        return [sys.executable, "-c", script, folder, str(report), str(code)]

    monkeypatch.setattr(study_lib, "_train_cmd", cmd)
    monkeypatch.setattr(study_lib, "generate_games", lambda configs, progress=True: 0)


def test_runner_resumes_without_repeating_finished_cells(tmp_path, monkeypatch):
    _fake_cells(tmp_path, monkeypatch)
    study, workdir, lines = study_lib.load_study(SMOKE), tmp_path / "study", []
    results = study_lib.run_study(study, str(workdir), parallel=2, log=lines.append)
    assert "0 already done, 0 reused, 4 to run, 2 at a time" in lines[0]
    assert any("4/4 cells finished" in line and "ETA 0m00s" in line for line in lines)
    cells = workdir / "cells"
    for variant, seed in study.cells():
        folder = cells / variant / f"seed-{seed}"
        assert (folder / "done").is_file() and (folder / "ran").read_text() == "x"
        assert json.loads((folder / "cell_config.json").read_text())["seed"] == seed
    rloo = results["variants"]["rloo"]["levels"]["simple@test"]
    assert rloo["mean"] == 0.75 and rloo["vs_reference"]["mean"] == pytest.approx(0.25)
    cell = results["cells"]["rloo/seed-1"]["levels"]["simple@test"]
    assert cell["gain"]["only_after"] == 2 and cell["protocol"]["decoding"] == "constrained"
    assert json.loads((workdir / "results.json").read_text()) == results
    # An interrupted cell (no done marker): only it runs again.
    (cells / "rloo" / "seed-1" / "done").unlink()
    lines.clear()
    study_lib.run_study(study, str(workdir), log=lines.append)
    assert "3 already done, 0 reused, 1 to run" in lines[0]
    assert (cells / "rloo" / "seed-1" / "ran").read_text() == "xx"
    assert (cells / "grpo" / "seed-0" / "ran").read_text() == "x"


def test_reuse_copies_cells_with_the_same_config_and_code_and_runs_the_rest(tmp_path, monkeypatch):
    _fake_cells(tmp_path, monkeypatch)
    first = tmp_path / "first"
    study_lib.run_study(study_lib.load_study(SMOKE), str(first), log=lambda m: None)
    evaluation = "evaluation=dict(split='test', num_tasks=1, levels=('simple',))"
    # "base" is the smoke study's grpo under another name; this "rloo" trains with other epochs.
    path = _write_study(
        tmp_path,
        "dict(baseline='configs/tiny_textworld.py:test', variants={'base': {}, "
        f"'rloo': {{'rl.algo': 'rloo', 'rl.epochs': 2}}}}, seeds=(0, 1), {evaluation})",
    )
    second, lines = tmp_path / "second", []
    results = study_lib.run_study(
        study_lib.load_study(path), str(second), log=lines.append, reuse=[str(first)]
    )
    assert "reused base/seed-0: the same config and code ran in" in "\n".join(lines)
    assert "0 already done, 2 reused, 2 to run" in lines[0]
    assert not any("start base" in line for line in lines)
    for seed in (0, 1):
        base = second / "cells" / "base" / f"seed-{seed}"
        donor = first / "cells" / "grpo" / f"seed-{seed}"
        assert (base / "reused_from").read_text().strip() == str(donor)
        assert (base / "done").is_file() and (base / "ran").read_text() == "x"  # copied, not run
        assert json.loads((base / "result.json").read_text()) == json.loads(
            (donor / "result.json").read_text()
        )
        assert not (second / "cells" / "rloo" / f"seed-{seed}" / "reused_from").exists()
    assert results["variants"]["base"]["levels"]["simple@test"]["mean"] == 0.5  # grpo's 2 of 4
    # A cell that ran other code is never reused.
    code = first / "cells" / "rloo" / "seed-0" / "code.json"
    code.write_text(json.dumps({**json.loads(code.read_text()), "agentrl_jax/x.py": "0"}))
    path = _write_study(
        tmp_path,
        f"dict(baseline='configs/tiny_textworld.py:test', variants={{'rloo': "
        f"{{'rl.algo': 'rloo'}}}}, seeds=(0, 1), {evaluation})",
    )
    third, lines = tmp_path / "third", []
    study_lib.run_study(
        study_lib.load_study(path), str(third), log=lines.append, reuse=[str(first)]
    )
    assert (third / "cells" / "rloo" / "seed-1" / "reused_from").is_file()
    assert not (third / "cells" / "rloo" / "seed-0" / "reused_from").exists()
    assert any("start rloo/seed-0" in line for line in lines)


def test_variants_run_a_study_a_few_at_a_time_into_one_workdir(tmp_path, monkeypatch):
    _fake_cells(tmp_path, monkeypatch)
    study, workdir, lines = study_lib.load_study(SMOKE), tmp_path / "study", []
    results = study_lib.run_study(study, str(workdir), log=lines.append, variants=["grpo"])
    assert "0 already done, 0 reused, 2 to run (variants grpo)" in lines[0]
    assert sorted(results["cells"]) == ["grpo/seed-0", "grpo/seed-1"]
    assert not (workdir / "cells" / "rloo" / "seed-0" / "ran").exists()
    lines.clear()
    results = study_lib.run_study(study, str(workdir), log=lines.append, variants=["rloo"])
    assert "2 already done, 0 reused, 2 to run (variants rloo)" in lines[0]
    assert (workdir / "cells" / "grpo" / "seed-0" / "ran").read_text() == "x"  # not rerun
    rloo = results["variants"]["rloo"]["levels"]["simple@test"]
    assert rloo["vs_reference"]["mean"] == pytest.approx(0.25)  # the results cover both runs
    with pytest.raises(study_lib.StudyError, match=r"--variants names \['ppo'\].*'grpo', 'rloo'"):
        study_lib.run_study(study, str(workdir), log=lines.append, variants=["ppo"])


def test_a_failed_cell_is_named_and_the_others_finish(tmp_path, monkeypatch):
    _fake_cells(tmp_path, monkeypatch, fail_variant="rloo")
    study, workdir = study_lib.load_study(SMOKE), tmp_path / "study"
    with pytest.raises(
        study_lib.StudyError, match=r"2 cell\(s\) failed: rloo/seed-0 \(exit 1; log "
    ):
        study_lib.run_study(study, str(workdir), log=lambda m: None)
    results = json.loads((workdir / "results.json").read_text())
    assert sorted(results["cells"]) == ["grpo/seed-0", "grpo/seed-1"]
    assert not (workdir / "cells" / "rloo" / "seed-0" / "done").exists()


def test_shared_sft_variants_need_one_rl_state(tmp_path):
    path = _write_study(
        tmp_path,
        "dict(baseline='configs/tiny_textworld.py:test', variants={'grpo': {}, "
        "'ppo': {'rl.algo': 'gae'}}, seeds=(0,), shared_sft=('grpo', 'ppo'))",
    )
    with pytest.raises(study_lib.StudyError, match="'ppo' has a critic and 'grpo' has not"):
        study_lib.prepare(study_lib.load_study(path), str(tmp_path / "study"))


def test_shared_sft_cells_resume_one_sft_start_per_seed(tmp_path, monkeypatch):
    """Per seed, one SFT start (``--stop_after=sft``) runs before the seed's shared cells; each
    shared cell's run folder begins as its copy and resumes with ``--allow_config_change``; a
    variant outside ``shared_sft`` runs on its own; a rerun repeats nothing; a failed start fails
    its cells and no other."""
    _fake_cells(tmp_path, monkeypatch)
    fake = study_lib._train_cmd
    order = tmp_path / "order.txt"
    script = (
        "import os, sys; folder, *flags = sys.argv[1:]; run = os.path.join(folder, 'run');"
        "os.makedirs(run, exist_ok=True); open(sys.argv[-1], 'a').write(folder + ' ' +"
        " ' '.join(flags[:-1]) + '\\n');"
        "open(os.path.join(run, 'sft.txt'), 'w').write(folder);"
        "sys.exit(int(os.path.basename(folder) == os.environ.get('FAIL_START', '-')))"
    )

    def cmd(folder, *flags):
        if os.path.basename(os.path.dirname(folder)) == "starts":
            return [sys.executable, "-c", script, folder, *flags, str(order)]
        assert os.path.isfile(os.path.join(folder, "run", "sft.txt")) == bool(flags)
        with open(order, "a") as f:
            f.write(f"{folder} {' '.join(flags)}\n")
        return fake(folder)

    monkeypatch.setattr(study_lib, "_train_cmd", cmd)
    path = _write_study(
        tmp_path,
        "dict(baseline='configs/tiny_textworld.py:test', variants={'grpo': {}, "
        "'rloo': {'rl.algo': 'rloo'}, 'alone': {'sft.epochs': 3}}, seeds=(0, 1), "
        "evaluation=dict(split='test', num_tasks=1, levels=('simple',), decoding='constrained'),"
        " shared_sft=('grpo', 'rloo'))",
    )
    study, workdir = study_lib.load_study(path), tmp_path / "study"
    study_lib.run_study(study, str(workdir), log=lambda m: None)
    runs = [line.split() for line in order.read_text().splitlines()]
    short = [(os.path.relpath(r[0], workdir), r[1:]) for r in runs]
    assert short == [
        ("starts/seed-0", ["--stop_after=sft"]),
        ("cells/grpo/seed-0", ["--allow_config_change"]),
        ("cells/rloo/seed-0", ["--allow_config_change"]),
        ("cells/alone/seed-0", []),
        ("starts/seed-1", ["--stop_after=sft"]),
        ("cells/grpo/seed-1", ["--allow_config_change"]),
        ("cells/rloo/seed-1", ["--allow_config_change"]),
        ("cells/alone/seed-1", []),
    ]
    start = workdir / "starts" / "seed-1"
    assert (start / "done").is_file()
    cell = workdir / "cells" / "rloo" / "seed-1"
    assert (cell / "run" / "sft.txt").read_text() == str(start)  # the start's copy
    assert (cell / "sft_from").read_text().strip() == str(start)
    result = json.loads((cell / "result.json").read_text())
    assert result["sft_start_s"] == json.loads((start / "result.json").read_text())["wall_s"] > 0
    assert result["wall_s"] > 0
    assert (start / "cell_config.json").read_text() == (
        workdir / "cells" / "grpo" / "seed-1" / "cell_config.json"
    ).read_text()

    order.write_text("")  # a rerun repeats nothing
    study_lib.run_study(study, str(workdir), log=lambda m: None)
    assert order.read_text() == ""

    # A start that fails: its seed's shared cells fail with it, the others run.
    monkeypatch.setenv("FAIL_START", "seed-0")
    with pytest.raises(study_lib.StudyError) as e:
        study_lib.run_study(study, str(tmp_path / "other"), log=lambda m: None)
    assert "SFT start seed-0 (exit 1" in str(e.value)
    assert "grpo/seed-0 (its SFT start failed)" in str(e.value)
    assert "rloo/seed-0 (its SFT start failed)" in str(e.value)
    assert "seed-1" not in str(e.value)


def _start(workdir, cache, log):
    env = dict(os.environ, AGENTRL_CACHE=str(cache), JAX_PLATFORMS="cpu", XLA_FLAGS="")
    cmd = [sys.executable, "-m", "launch.study", f"--study={SMOKE}", f"--workdir={workdir}"]
    out = open(log, "w+b")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )
    return proc, out


@pytest.mark.slow
def test_smoke_study_end_to_end_killed_and_resumed(textworld_games, tmp_path):
    workdir, cache = tmp_path / "study", textworld_games["root"]
    first = workdir / "cells" / "grpo" / "seed-0"
    # Killed (the runner, SIGKILL) once the first cell is done, while the second one trains.
    proc, out = _start(workdir, cache, tmp_path / "run1.log")
    deadline = time.time() + 600
    while not (first / "done").exists():
        assert proc.poll() is None and time.time() < deadline, out.seek(0) or out.read()[-3000:]
        time.sleep(0.5)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    out.close()
    result_mtime = (first / "result.json").stat().st_mtime
    # The same command resumes: the finished cell is not run again.
    proc, out = _start(workdir, cache, tmp_path / "run2.log")
    proc.wait(timeout=900)
    out.seek(0)
    text = out.read().decode(errors="replace")
    out.close()
    assert proc.returncode == 0, text[-4000:]
    assert "1 already done, 0 reused, 3 to run" in text
    assert "start grpo/seed-0" not in text
    assert (first / "train.log").read_text().count("=== launch.study: cell") == 1
    assert (first / "result.json").stat().st_mtime == result_mtime
    assert "ETA" in text
    results = json.loads((workdir / "results.json").read_text())
    assert sorted(results["cells"]) == ["grpo/seed-0", "grpo/seed-1", "rloo/seed-0", "rloo/seed-1"]
    assert results["evaluation"]["split"] == "test" and results["evaluation"]["num_tasks"] == 1
    for cell in results["cells"].values():
        level = cell["levels"]["simple@test"]
        assert (
            level["protocol"]["split"] == "test" and level["protocol"]["decoding"] == "constrained"
        )
        assert level["final"]["n"] == 1 and level["final"]["low"] is not None
        assert [x for x, _ in cell["curve"]] == [4, 8, 12]  # 3 iterations of 2 tasks x 2 episodes
    rloo = results["variants"]["rloo"]["levels"]["simple@test"]
    assert rloo["seeds"] == [0, 1] and rloo["vs_reference"]["seeds"] == [0, 1]
    md = (workdir / "results.md").read_text()
    assert "| rloo | simple@test | 2 |" in md and "1 test games per level, constrained" in md
    assert (workdir / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"
