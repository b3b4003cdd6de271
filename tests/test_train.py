"""The launcher end to end: config validation before compute, a short run, SIGKILL anywhere and
resume."""

import dataclasses
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import types

import jax
import ml_collections
import pytest

from agentrl_jax.envs.base import Task
from agentrl_jax.experiments.compare import compare, final_state, logged_scalars
from agentrl_jax.run import budget as budget_lib
from agentrl_jax.run.config import ConfigError, from_config_dict
from agentrl_jax.run.tensorboard import SummaryWriter, read_scalars
from agentrl_jax.run.trainer import Trainer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
import train_cli  # noqa: E402
from train_cli import tiny_config as _config  # noqa: E402

from configs import tiny_textworld  # noqa: E402


@pytest.mark.parametrize(
    "sections, match",
    [
        (dict(rl=dict(algo="ppo2")), r"config.rl.algo is 'ppo2'; valid choices: \[.*'gagpo'.*\]"),
        (
            dict(rl=dict(algo="gae"), rollout=dict(context_mode="step")),
            "needs config.rollout.context_mode='episode'",
        ),
        (dict(rollout=dict(group_size=1)), "group_size >= 2"),
        (dict(mesh=(2, 2, 1)), r"needs 4 devices; this run has 1"),
        (dict(model=dict(preset="qwen9")), "config.model.preset is 'qwen9'; valid choices"),
        (dict(model=dict(remat="dots")), r"config.model.remat is 'dots'; valid choices"),
        (dict(rl=dict(aggregation="mean")), "aggregation"),
        (dict(rl=dict(task_pool="fresh")), r"config.rl.task_pool is 'fresh'; valid choices"),
        (
            dict(env=dict(num_train_tasks=60)),
            r"num_train_tasks=60 .* leave none after the budget's 60 demonstrations",
        ),
        (dict(sft=dict(end_lr_fraction=1.5)), r"config.sft.end_lr_fraction is 1.5"),
        (dict(rl=dict(ratio_level="seq")), r"config.rl.ratio_level='seq': expected 'auto'"),
        (dict(rl=dict(kl_estimator="k4")), r"config.rl: LossConfig.kl_estimator is 'k4'"),
        (dict(rl=dict(kl_clamp=-1.0)), r"config.rl: LossConfig.kl_clamp is -1.0; expected None"),
        (dict(rl=dict(value_clip=0.0)), r"config.rl: LossConfig.value_clip is 0.0; expected None"),
        (dict(envrl=dict(horizon=-5)), r"config.envrl.horizon is -5; expected an int >= 0"),
        (
            dict(env=dict(num_report_tasks=-1)),
            r"config.env.num_report_tasks is -1; expected an int >= 0",
        ),
    ],
)
def test_bad_config_fails_before_compute_naming_the_field(sections, match):
    with pytest.raises(ConfigError, match=match):
        from_config_dict(_config(**sections), num_devices=1)


def test_ratio_level_follows_the_estimator_unless_set():
    def level(**rl):
        return from_config_dict(_config(rl=rl), num_devices=1).rl_spec().loss.ratio_level

    assert level() == "token"  # grpo
    assert level(algo="gagpo") == "action"  # defined with an action-level ratio
    assert level(algo="gagpo", ratio_level="token") == "token"  # overridden on purpose
    assert level(algo="grpo", ratio_level="action") == "action"


def test_kl_estimator_clamp_and_value_clip_reach_the_losses():
    rl = dict(algo="gae", kl_coef=0.1, kl_estimator="k2", kl_clamp=5.0, value_clip=None)
    loss = from_config_dict(_config(rl=rl), num_devices=1).rl_spec().loss
    assert (loss.kl_estimator, loss.kl_clamp, loss.value_clip) == ("k2", 5.0, None)
    default = from_config_dict(_config(), num_devices=1).rl_spec().loss
    assert (default.kl_estimator, default.kl_clamp, default.value_clip) == ("k3", None, 0.2)


def test_a_registered_estimator_gets_the_built_in_checks():
    from agentrl_jax import kernels
    from agentrl_jax.kernels import registry

    kernels.register_advantage_estimator(
        "pairwise_test", lambda *a, **k: None, needs_groups=True, ratio_level="action"
    )
    try:
        cfg = _config(rl=dict(algo="pairwise_test"), rollout=dict(group_size=1))
        with pytest.raises(ConfigError, match="'pairwise_test' compares rollouts within a group"):
            from_config_dict(cfg, num_devices=1)
        run = from_config_dict(_config(rl=dict(algo="pairwise_test")), num_devices=1)
        assert run.rl_spec().loss.ratio_level == "action"
    finally:
        registry.unregister("pairwise_test")


def test_unknown_field_is_an_error():
    cfg = _config()
    with cfg.unlocked():
        cfg.rl.learning_rate = 1.0
    with pytest.raises(ConfigError, match=r"config.rl: unknown field\(s\) \['learning_rate'\]"):
        from_config_dict(cfg)


def test_default_config_is_valid():
    run = from_config_dict(tiny_textworld.get_config(), num_devices=1)
    assert run.rl.algo == "grpo" and not run.needs_critic
    gae = _config(rl=dict(algo="gae"))
    assert from_config_dict(gae, num_devices=1).needs_critic
    assert isinstance(tiny_textworld.get_config("smoke"), ml_collections.ConfigDict)


def test_rl_task_pool_unseen_leaves_out_every_demonstration_game():
    """``rl.task_pool='unseen'``: RL draws only train games that no SFT demonstration used."""
    tasks = [Task(env="textworld", split="train", id=f"g/{i}") for i in range(7)]
    cfg = from_config_dict(
        _config(
            rl=dict(task_pool="unseen", tasks_per_iteration=2, minibatch_size=8),
            env=dict(num_train_tasks=7),
            budget=dict(total=60, sft_fraction=0.5),  # 3 demonstrations
        ),
        num_devices=1,
    )
    trainer = types.SimpleNamespace(
        config=cfg, budget=budget_lib.from_config(cfg.budget), train_tasks={"simple": tasks}
    )
    trainer.demonstration_tasks = functools.partial(Trainer.demonstration_tasks, trainer)
    demos = {t.id for t in trainer.demonstration_tasks()}
    assert demos == {"g/0", "g/1", "g/2"}
    rl = Trainer.rl_tasks.func(trainer)["simple"]
    assert [t.id for t in rl] == ["g/3", "g/4", "g/5", "g/6"]
    every = dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, task_pool="all"))
    trainer.config = every
    assert Trainer.rl_tasks.func(trainer)["simple"] == tasks


# The module's run: the :test config with 2 demonstrations, one per SFT batch, so an SFT epoch
# takes 2 steps and a kill can land inside one (20 units buy the 2 demonstrations, 12 the 3 RL
# iterations of 4 episodes); RL plays the same 2 train games. The SFT policy then reaches states
# of the valid game whose commands take up to 47 tokens at this 300-token vocabulary (the
# valid game's words are rare in the train games' text): 64 hold them.
RUN_FLAGS = (
    "--config.rl.task_pool=all",
    "--config.rollout.max_new_tokens=64",
    "--config.budget.total=32",
    "--config.budget.sft_fraction=0.625",
    "--config.sft.batch_size=1",
)


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory):
    """A JAX compilation cache the module's runs share: compiling is most of a tiny run's cost
    (~70 s of CPU for the first run, ~15 s for the same run with the cache warm)."""
    return dict(
        JAX_COMPILATION_CACHE_DIR=str(tmp_path_factory.mktemp("jax_cache")),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1",
    )


# The module's LoRA run: the same run with rank-4 adapters on every projection for RL (after the
# same full SFT), dropout on their inputs (with the ratio-free policy gradient: PPO's ratio and
# dropout are refused together, run/config.py), the frozen base in bf16 under f32 compute, and a
# KL term, whose reference is then the base without the adapters.
LORA_FLAGS = (
    "--config.model.lora.rank=4",
    "--config.model.lora.dropout=0.1",
    "--config.rl.loss=pg",
    "--config.model.lora.base_dtype=bfloat16",
    "--config.rl.kl_coef=0.05",
)


# Asynchronous RL: rollouts a policy one update old, TIS, continuous batching, envs stepped side
# by side.
ASYNC_FLAGS = (
    "--config.rl.max_staleness=1",
    "--config.rl.off_policy_correction=tis",
    "--config.rollout.batching=continuous",
    "--config.rollout.cohorts=2",
    "--config.env.concurrent_steps=True",
)


def _launch(workdir, cache, compile_cache, *extra, **env):
    os.makedirs(workdir, exist_ok=True)
    log = workdir.parent / f"{workdir.name}.log"
    cmd = train_cli.train_cmd(workdir, *RUN_FLAGS, *extra)
    return train_cli.start(cmd, cache, log, **compile_cache, **env)


def _last_by_step(scalars, tag):
    return {step: value for step, value in scalars[tag]}


@pytest.fixture(scope="module")
def reference_run(textworld_games, tmp_path_factory, compile_cache):
    """One uninterrupted run (SFT of 2 epochs of 2 steps, 3 RL iterations, evaluations)."""
    workdir = tmp_path_factory.mktemp("train") / "ref"
    (text,) = train_cli.finish(_launch(workdir, textworld_games["root"], compile_cache))
    return workdir, text


@pytest.fixture(scope="module")
def lora_run(textworld_games, tmp_path_factory, compile_cache):
    """The reference run with LoRA for RL (``LORA_FLAGS``), uninterrupted."""
    workdir = tmp_path_factory.mktemp("train") / "lora"
    (text,) = train_cli.finish(
        _launch(workdir, textworld_games["root"], compile_cache, *LORA_FLAGS)
    )
    return workdir, text


@pytest.fixture(scope="module")
def async_run(textworld_games, tmp_path_factory, compile_cache):
    """The reference run with asynchronous RL (``ASYNC_FLAGS``), uninterrupted."""
    workdir = tmp_path_factory.mktemp("train") / "async"
    (text,) = train_cli.finish(
        _launch(workdir, textworld_games["root"], compile_cache, *ASYNC_FLAGS)
    )
    return workdir, text


def test_lora_run_trains_the_adapters_only_and_exports_them(lora_run, reference_run):
    """A LoRA run: the same SFT as the full run, then RL moves the adapters only (the base
    arrays bit for bit as SFT left them, rounded to bf16; Adam moments for the adapters alone);
    the sampler's merged copy scores like the learner; the adapters end in PEFT's format in
    WORKDIR/adapter."""
    import numpy as np

    workdir, _ = lora_run
    ref_dir, _ = reference_run
    # Checkpoint 1: the RL state as RL starts (after SFT); 4: after the last RL iteration.
    _, start = final_state(workdir, 1)
    _, full_start = final_state(ref_dir, 1)
    step, end = final_state(workdir)
    assert step == 4 and start.keys() == end.keys()
    policy = [k for k in end if k.startswith("['policy']")]
    adapters = [k for k in policy if "lora" in k]
    base = [k for k in policy if "lora" not in k]
    assert adapters and base
    for k in base:  # the same SFT (stored in bf16), and RL left the base alone
        assert start[k].dtype == "bfloat16" and full_start[k].dtype == np.float32, k
        np.testing.assert_array_equal(start[k], full_start[k].astype(start[k].dtype), err_msg=k)
        np.testing.assert_array_equal(end[k], start[k], err_msg=k)
    assert any(not np.array_equal(end[k], start[k]) for k in adapters)
    # B starts at zero: the RL phase starts from exactly the SFT policy.
    assert all(not start[k].any() for k in adapters if "_lora_b" in k)
    # Adam's moments (mu and nu) are the adapters' shapes, nothing of the base.
    moments = sorted(v.shape for k, v in end.items() if k.startswith("['policy_opt']") and v.ndim)
    assert moments == sorted([end[k].shape for k in adapters] * 2)
    # The merged copy the sampler played equals the learner's adapters-and-base pass (f32).
    scalars = read_scalars(str(workdir / "tensorboard"))
    mismatch = [v for _, v in scalars["rollout/logprob_mismatch"]]
    assert len(mismatch) == 3 and max(mismatch) < 1e-6, mismatch
    # The KL reference is the base: 0 before the adapters move (iteration 1).
    assert abs(_last_by_step(scalars, "losses/kl_ref")[1]) < 1e-6
    assert not (workdir / "checkpoints" / "reference").exists()  # no copy written
    config = json.loads((workdir / "adapter" / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", 4, 8.0)
    assert len(config["target_modules"]) == 7
    assert (workdir / "adapter" / "adapter_model.safetensors").is_file()
    assert not (ref_dir / "adapter").exists() and not (ref_dir / "base").exists()


def _workdir_config(workdir):
    """The RunConfig of a run's ``config.json``."""
    cd = ml_collections.ConfigDict(json.loads((workdir / "config.json").read_text()))
    return from_config_dict(cd)


def _policy_logits(workdir, text):
    """``(ids, logits)``: the run's tokenizer's ids of ``text`` and the newest checkpoint's
    policy's logits of them (f32), as ``launch.export`` restores it."""
    import numpy as np

    from launch import export as export_lib

    policy, tok, _ = export_lib.restore_policy(_workdir_config(workdir), str(workdir))
    ids = tok(text)["input_ids"]
    return ids, np.asarray(policy(jax.numpy.asarray([ids], jax.numpy.int32))[0])


def test_lora_run_adapter_names_the_sft_policy_it_was_trained_on(lora_run):
    """The adapter a LoRA run ends with (WORKDIR/adapter) names WORKDIR/base, written beside it
    as a Hugging Face checkpoint with the tokenizer: the policy RL started from (the SFT policy),
    not ``model.checkpoint`` (here none: a fresh preset). ``AutoPeftModelForCausalLM`` of the
    adapter alone gives the newest checkpoint's logits within 1e-5 (f32)."""
    import numpy as np
    import torch
    from peft import AutoPeftModelForCausalLM

    workdir, _ = lora_run
    adapter = json.loads((workdir / "adapter" / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(workdir / "base")
    assert (workdir / "base" / "tokenizer.json").is_file()
    ids, want = _policy_logits(workdir, "-= Kitchen =- You see a fridge. > open fridge")
    model = AutoPeftModelForCausalLM.from_pretrained(workdir / "adapter", dtype=torch.float32)
    with torch.no_grad():
        got = model.eval()(torch.tensor([ids])).logits.float().numpy()
    assert np.abs(got - want).max() < 1e-5


def test_export_dtype_applies_to_the_adapter_too(lora_run, tmp_path):
    """``launch.export --what=adapter --dtype=D`` stores the adapter's tensors in D as well as
    the base's: bf16 for both (the run's adapters are f32, its base bf16), and f32 for both."""
    from safetensors import safe_open

    from launch import export as export_lib

    workdir, _ = lora_run
    config = _workdir_config(workdir)
    for dtype, stored in (("bfloat16", "BF16"), ("float32", "F32")):
        out = tmp_path / dtype
        export_lib.export(config, str(workdir), str(out), "adapter", dtype)
        for file in ("base/model.safetensors", "adapter/adapter_model.safetensors"):
            with safe_open(str(out / file), "pt") as f:
                dtypes = {f.get_slice(key).get_dtype() for key in f.keys()}  # noqa: SIM118
            assert dtypes == {stored}, (dtype, file, dtypes)


def test_export_writes_the_template_stop_as_eos(lora_run, tmp_path):
    """``launch.export`` (the merged model, and the adapter's base) and the LoRA run's own
    WORKDIR/base write the chat template's stop token (``<|im_end|>``, where the rollouts stop)
    as the model's ``eos_token_id``, in config.json and generation_config.json: transformers'
    ``generate``, given no eos, stops where the policy writes it."""
    import torch
    import transformers

    from agentrl_jax.run import build
    from launch import export as export_lib

    workdir, _ = lora_run
    config = _workdir_config(workdir)
    export_lib.export(config, str(workdir), str(tmp_path / "merged"), "merged")
    export_lib.export(config, str(workdir), str(tmp_path / "peft"), "adapter")
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "merged")
    stop = build.chat_template(config, tok).stop_id(tok)
    assert stop == tok.convert_tokens_to_ids("<|im_end|>")
    for directory in (tmp_path / "merged", tmp_path / "peft" / "base", workdir / "base"):
        hf_config = json.loads((directory / "config.json").read_text())
        assert hf_config["eos_token_id"] == stop, directory
        assert transformers.GenerationConfig.from_pretrained(directory).eos_token_id == stop
    model = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "merged", dtype=torch.float32
    )
    ids = tok("-= Kitchen =- You see a fridge.\n>")["input_ids"]

    class WritesStopAfterThree(transformers.LogitsProcessor):
        """The policy writes three tokens of its own, then the stop token (the tiny policy's
        greedy text does not end by itself within a few tokens)."""

        def __call__(self, input_ids, scores):
            if input_ids.shape[1] == len(ids) + 3:
                scores = torch.full_like(scores, -float("inf"))
                scores[:, stop] = 0.0
            return scores

    out = model.generate(
        torch.tensor([ids]),
        max_new_tokens=16,
        do_sample=False,
        logits_processor=[WritesStopAfterThree()],
    )
    new = out[0, len(ids) :].tolist()
    assert len(new) == 4 and new[-1] == stop, new


def test_async_run_trains_each_iteration_on_a_rollout_one_update_old(async_run, reference_run):
    """``rl.max_staleness=1``: iteration 1 trains on a rollout of the policy as RL began
    (staleness 0: the first rollout is played before any update), iterations 2 and 3 on ones
    played during the update before them (staleness 1), weighed by TIS. The first rollout is
    the on-policy run's."""
    workdir, text = async_run
    scalars = read_scalars(str(workdir / "tensorboard"))
    assert _last_by_step(scalars, "rollout/staleness") == {1: 0.0, 2: 1.0, 3: 1.0}
    weights = _last_by_step(scalars, "off_policy/is_weight_mean")
    assert sorted(weights) == [1, 2, 3] and all(0.0 < w <= 2.0 for w in weights.values())
    ref = read_scalars(str(reference_run[0] / "tensorboard"))
    # Both runs' first rollout is the SFT policy's, on the same tasks and keys.
    for tag in ("rollout/return", "rollout/tokens_per_episode"):
        assert _last_by_step(scalars, tag)[1] == _last_by_step(ref, tag)[1], tag
    assert "rl 3/3" in text


def test_train_entry_point_runs_sft_rl_and_evaluation(reference_run):
    workdir, text = reference_run
    # The before/after table is on the test game, with intervals and the protocol; the valid
    # game (checkpoint selection) is evaluated too, but reported apart.
    assert "| simple@test | 1 |" in text and "after SFT" in text and "RL gain" in text
    assert (
        "95% CI (paired)" in text and "1 test games, constrained decoding, greedy, seed 0" in text
    )
    for sub in ("tensorboard", "checkpoints", "tokenizer"):
        assert (workdir / sub).is_dir(), sub
    assert (workdir / "report.md").is_file()
    report = json.loads((workdir / "report.json").read_text())
    (row,) = report["before_after"]
    assert (row["set"], row["split"], row["num_tasks"], row["decoding"]) == (
        "simple@test",
        "test",
        1,
        "constrained",
    )
    assert row["after_rl"]["n"] == 1 and row["gain"]["n"] == 1
    after_rl = report["evals"]["after_rl"]
    assert after_rl["simple"]["split"] == "valid" and after_rl["simple@test"]["split"] == "test"
    ref = read_scalars(str(workdir / "tensorboard"))
    assert sorted(_last_by_step(ref, "rollout/return")) == [1, 2, 3]
    for tag in (
        "losses/policy_loss",
        "losses/entropy",
        "losses/approx_kl",
        "losses/clipfrac",
        "train/grad_norm",
        "time/rollout_s",
        "time/update_s",
        "perf/rollout_tokens_per_s",
        "perf/device_busy_fraction",  # where the iteration's time went (agentrl_jax/timing.py)
        "time/phase/env_s",
        "time/phase/sample_s",
        "time/phase/update_s",
        "rollout/success_rate",
        "rollout/episode_length",
        "eval/simple/success_rate",
        "report/simple@test/success_rate",
        "sft/nll",
    ):
        assert tag in ref, tag
    # The held-out episodes really played: every evaluation took at least one turn.
    for _, steps in ref["eval/simple/mean_steps"]:
        assert steps >= 1


# absl's record prefix: level letter, MMDD, time (``I1201 21:34:42.960548 ...``).
ABSL_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d")


def _absl_lines(text: str) -> list[str]:
    # tqdm redraws its bar with carriage returns: each redraw is a line of its own.
    return [line for line in re.split(r"[\r\n]", text) if ABSL_LINE.match(line)]


def test_console_shows_progress_and_the_log_file_the_library_logs(reference_run):
    """The console: phases, bars with an ETA, a line per RL iteration, the table; no library
    log (orbax writes ~45 INFO lines per checkpoint). Those go to WORKDIR/logs/train.log."""
    workdir, text = reference_run
    assert not _absl_lines(text), _absl_lines(text)[:5]
    assert "orbax" not in text
    assert "SFT: 4 steps (2 epochs of 2 batches of 1)" in text  # the flags: batches of 1
    assert "RL: iterations 1-3 of 3, 2 tasks x 2 rollouts each (grpo)" in text
    assert re.search(r"rl: +\d+%\|.*\| \d/3 \[\d\d:\d\d<\d\d:\d\d", text)  # elapsed<ETA
    # Written between the bar's redraws (tqdm.write), each on a line of its own.
    summary = re.compile(r"rl (\d)/3: success [\d.]+, return [-\d.]+, 4 episodes \(0 infra")
    lines = re.split(r"[\r\n]", text)
    assert [m.group(1) for line in lines if (m := summary.match(line))] == ["1", "2", "3"]
    assert "evaluation after_rl done: simple success" in text and "| held-out set |" in text
    log = (workdir / "logs" / "train.log").read_text()
    assert f"logs: {workdir}/logs/train.log" in text
    # Every record is in the file, absl-formatted: the libraries' and the project's.
    info = [line for line in _absl_lines(log) if line.startswith("I")]
    assert any("orbax" in line for line in info) and len(info) > 100
    assert any("trainer.py" in line and "rl 3/3: success" in line for line in info)


def test_eval_entry_point_reports_and_plots(
    reference_run, textworld_games, compile_cache, tmp_path
):
    # A copy of the reference run: the chaos tests compare their runs' reports with its own.
    workdir = tmp_path / "ref"
    shutil.copytree(reference_run[0], workdir)
    # The reference run's compilation cache: its evaluations compiled the same sampler programs.
    env = dict(
        os.environ, AGENTRL_CACHE=str(textworld_games["root"]), XLA_FLAGS="", **compile_cache
    )
    cmd = [
        sys.executable,
        "-m",
        "launch.eval",
        f"--workdir={workdir}",
        "--env=textworld",
        "--split=valid",
        "--levels=simple",
        "--num_tasks=1",
        "--failures",
    ]
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "eval/simple@valid/success_rate" in out.stdout
    # The restore's orbax logs go to the log file, not the console.
    assert not _absl_lines(out.stdout + out.stderr) and "orbax" not in out.stderr
    assert any("orbax" in line for line in _absl_lines((workdir / "logs" / "eval.log").read_text()))
    report = json.loads((workdir / "eval" / "eval_valid_simple_valid.json").read_text())
    assert report["num_tasks"] == 1 and report["overall"]["episodes"] == 1
    assert (workdir / "eval" / "eval_valid_simple_valid.md").is_file()
    # --failures: the lost episode (if the game was lost) in a category, against the same game
    # after SFT (the run's eval/after_sft_simple.json played it).
    lost = 1 - report["overall"]["wins"]
    failures = json.loads((workdir / "eval" / "eval_valid_failures.json").read_text())
    assert failures["cap"] == 3  # the :test config's rollout.max_turns and env max_steps
    every = failures["per_type"]["all"]
    assert every["episodes"] == 1 and every["lost"] == lost == len(failures["episodes"])
    assert sum(c["count"] for c in every["categories"].values()) == lost
    sft = json.loads((workdir / "eval" / "after_sft_simple.json").read_text())
    assert sft["outcomes"][0][:2] == ["valid", report["outcomes"][0][1]]
    start = failures["sft_start"]["all"]
    assert start["not_evaluated"] == 0
    assert start["lost_after_sft" if not sft["outcomes"][0][2] else "won_after_sft"] == lost
    for row in failures["episodes"]:
        assert row["steps"] <= 3 and row["walkthrough_steps"] >= 1
        # Simple games have no defeat, and constrained decoding writes no rejected command.
        assert row["category"] in failures["precedence"]
        assert row["category"] not in ("lost", "invalid", "other")
    assert "## SFT start" in (workdir / "eval" / "eval_valid_failures.md").read_text()
    png = (workdir / "eval" / "learning_curve.png").read_bytes()
    assert png.startswith(b"\x89PNG")


def test_export_serves_the_lora_run_in_transformers_and_peft(lora_run, tmp_path):
    """``launch.export`` of the LoRA run: the merged HF checkpoint in transformers, and the base
    with the PEFT adapter through ``PeftModel``, each give the logits of the run's newest
    checkpoint (our learner's policy) within 1e-5 (f32), and the exported tokenizer encodes as
    the run's."""
    import numpy as np
    import torch
    import transformers
    from peft import PeftModel

    from launch import export as export_lib

    workdir = tmp_path / "lora"  # a copy: the chaos test compares the run's files
    shutil.copytree(lora_run[0], workdir)
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
    for what in ("merged", "adapter"):
        cmd = [sys.executable, "-m", "launch.export", f"--workdir={workdir}"]
        cmd += [f"--out={tmp_path / what}", f"--what={what}"]
        out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    adapter = json.loads((tmp_path / "adapter" / "adapter" / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(tmp_path / "adapter" / "base")

    config = from_config_dict(
        ml_collections.ConfigDict(json.loads((workdir / "config.json").read_text()))
    )
    policy, tok, restored = export_lib.restore_policy(config, str(workdir))
    assert restored.step == 4 and policy.cfg.lora is not None
    text = "-= Kitchen =- You see a fridge. > open fridge"
    ids = tok(text)["input_ids"]
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "merged")
    assert hf_tok(text)["input_ids"] == ids
    want = np.asarray(policy(jax.numpy.asarray([ids], jax.numpy.int32))[0])

    def logits(model):
        with torch.no_grad():
            return model(torch.tensor([ids])).logits.float().numpy()

    load = functools.partial(transformers.AutoModelForCausalLM.from_pretrained, dtype=torch.float32)
    merged = logits(load(tmp_path / "merged"))
    peft_model = PeftModel.from_pretrained(
        load(tmp_path / "adapter" / "base"), tmp_path / "adapter" / "adapter"
    )
    adapted = logits(peft_model.eval())
    assert np.abs(merged - want).max() < 1e-5
    assert np.abs(adapted - want).max() < 1e-5
    # The adapters moved: the base alone scores otherwise.
    assert np.abs(logits(load(tmp_path / "adapter" / "base")) - want).max() > 1e-4


# Where each kill lands and where the rerun must resume. The run's checkpoints: 0 after SFT
# epoch 1 (SFT step 2), 1 after SFT, 2-4 after RL iterations 1-3.
KILLS = {
    # Inside SFT epoch 2, after its first step.
    "sft_step:3": "resumed from checkpoint 0 (phase sft, after SFT step 2)",
    # Between SFT epochs 1 and 2, epoch 1's checkpoint complete.
    "sft_epoch:1": "resumed from checkpoint 0 (phase sft, after SFT step 2)",
    # RL iteration 2's episodes after their first turn.
    "rollout:2": "resumed from checkpoint 2 (phase rl, after RL iteration 1)",
    # RL iteration 2's update program dispatched.
    "update:2": "resumed from checkpoint 2 (phase rl, after RL iteration 1)",
    # While checkpoint 2 (RL iteration 1) is written: the previous one restores.
    "checkpoint:3": "resumed from checkpoint 1 (phase rl, after RL iteration 0)",
}


# Asynchronous RL: each rollout's two cohorts reach the kill point once each (their turn 1):
# rollout 0 (played first) #1-2, rollout 1 (during update 0) #3-4, rollout 2 (during update 1)
# #5-6. The kill lands in rollout 2, in the background, while iteration 1 updates: checkpoint 2
# (after iteration 1) holds rollout 1 not yet trained on, finished before it was written.
ASYNC_KILLS = {"rollout:5": "resumed from checkpoint 2 (phase rl, after RL iteration 1)"}


@pytest.mark.parametrize(
    "kill, variant",
    [
        # The default suite's: the cheapest one that resumes mid-RL from a later checkpoint.
        pytest.param("update:2", "full", id="update:2"),
        *(pytest.param(k, "full", marks=pytest.mark.slow, id=k) for k in KILLS if k != "update:2"),
        # A LoRA run (adapters, their moments, the base in the state) resumes the same way.
        pytest.param("update:2", "lora", marks=pytest.mark.slow, id="update:2-lora"),
        # Asynchronous RL: killed in a rollout played in the background during an update.
        pytest.param("rollout:5", "async", marks=pytest.mark.slow, id="rollout:5-async"),
    ],
)
def test_sigkill_anywhere_then_resume_repeats_the_uninterrupted_run(
    kill, variant, request, textworld_games, compile_cache, tmp_path
):
    """A real SIGKILL at ``kill`` (``agentrl_jax/chaos.py``), then the same command again: the
    resumed run restores the checkpoint before the kill and ends with every metric and the whole
    train state of the uninterrupted run, bit for bit (float32 on the CPU). An asynchronous run
    trains on the same episodes: those its checkpoint held played ahead are neither lost nor
    played again."""
    fixture = {"full": "reference_run", "lora": "lora_run", "async": "async_run"}[variant]
    ref_dir, _ = request.getfixturevalue(fixture)
    extra = {"full": (), "lora": LORA_FLAGS, "async": ASYNC_FLAGS}[variant]
    cache = textworld_games["root"]
    run_dir = tmp_path / "run"
    killed = _launch(run_dir, cache, compile_cache, *extra, AGENTRL_CHAOS_KILL=kill)
    ((code, text),) = train_cli.wait_all(killed)
    point, n = kill.split(":")
    assert code == -signal.SIGKILL, text[-4000:]
    assert f"chaos: SIGKILL at {point} #{n}" in text, text[-4000:]
    if point == "checkpoint":
        # Killed mid-write: orbax's temporary directory is left, never renamed to its step.
        checkpoints = run_dir / "checkpoints"
        assert (checkpoints / "2.orbax-checkpoint-tmp").is_dir()
        assert not (checkpoints / "2").exists()

    # The same command with the same workdir resumes, from before the kill.
    (text,) = train_cli.finish(_launch(run_dir, cache, compile_cache, *extra))
    assert {**KILLS, **ASYNC_KILLS}[kill] in text, text[-4000:]

    # Every scalar but the timings, the whole final train state and the reports, bit for bit.
    result = compare(ref_dir, run_dir)
    assert result.checkpoint_steps == (4, 4)
    assert result.same, result.to_json()


def test_an_sft_start_resumed_is_the_uninterrupted_run(
    reference_run, textworld_games, compile_cache, tmp_path
):
    """``--stop_after=sft`` ends once SFT is checkpointed and evaluated, before any RL; a copy of
    that workdir resumed by the plain command is the uninterrupted run, bit for bit, and one
    resumed with other RL settings (``--allow_config_change``, as a study's ``shared_sft`` cells
    do) starts RL from the same SFT policy and its evaluation."""
    ref_dir, _ = reference_run
    cache = textworld_games["root"]
    start = tmp_path / "start"
    (text,) = train_cli.finish(_launch(start, cache, compile_cache, "--stop_after=sft"))
    assert "evaluation after_sft done" in text and "RL iteration" not in text, text[-4000:]
    assert "after_rl" not in json.loads((start / "report.json").read_text())["evals"]

    same = tmp_path / "same"
    shutil.copytree(start, same)
    (text,) = train_cli.finish(_launch(same, cache, compile_cache))
    assert "phase rl, after RL iteration 0" in text, text[-4000:]
    result = compare(ref_dir, same)
    assert result.checkpoint_steps == (4, 4)
    assert result.same, result.to_json()

    other = tmp_path / "rloo"
    shutil.copytree(start, other)
    refused = train_cli.wait_all(_launch(other, cache, compile_cache, "--config.rl.algo=rloo"))
    assert refused[0][0] != 0 and "rl.algo" in refused[0][1], refused[0][1][-4000:]
    flags = ("--config.rl.algo=rloo", "--allow_config_change")
    train_cli.finish(_launch(other, cache, compile_cache, *flags))
    change = json.loads((other / "config_changes.jsonl").read_text().splitlines()[-1])
    assert "rl.algo" in json.dumps(change)
    evals = [json.loads((d / "report.json").read_text())["evals"] for d in (ref_dir, other)]
    assert evals[0]["after_sft"] == evals[1]["after_sft"]
    assert not compare(ref_dir, other).same  # RL ran with RLOO's advantages


@pytest.mark.slow
def test_rollout_mesh_run_is_the_run_on_the_learners_mesh(textworld_games, compile_cache, tmp_path):
    """``config.rollout_mesh``: rollouts on 2 devices of their own (the policy moved there after
    every update), the learner on 2 others, is the run whose rollouts play on the learner's 2
    devices, bit for bit: the same programs on other devices."""
    procs = []
    apart = ("--config.rollout_mesh=(1,2,1)",)
    for name, devices, extra in (("shared", 2, ()), ("apart", 4, apart)):
        workdir = tmp_path / name
        os.makedirs(workdir)
        cmd = train_cli.train_cmd(workdir, *RUN_FLAGS, "--config.mesh=(1,2,1)", *extra)
        log = tmp_path / f"{name}.log"
        procs.append(
            train_cli.start(cmd, textworld_games["root"], log, devices=devices, **compile_cache)
        )
        train_cli.finish(procs[-1])  # one at a time: two cores
    result = compare(tmp_path / "shared", tmp_path / "apart")
    assert result.checkpoint_steps == (4, 4)
    assert result.same, result.to_json()


def test_launch_compare_tells_the_same_run_from_another(reference_run, tmp_path):
    """``python -m launch.compare A B``: exit 0 for a run and itself; a run whose one logged value
    differs is another run (exit 1, the scalar named)."""
    ref_dir, _ = reference_run
    cmd = [sys.executable, "-m", "launch.compare", str(ref_dir)]
    out = subprocess.run([*cmd, str(ref_dir)], capture_output=True, text=True, cwd=train_cli.REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "the same run" in out.stdout and " 0 reports" not in out.stdout

    copy = tmp_path / "copy"
    shutil.copytree(ref_dir, copy)
    (tag, step), value = min(logged_scalars(ref_dir).items())
    writer = SummaryWriter(str(copy / "tensorboard"))  # a newer event file: its value is the last
    writer.scalars({tag: value + 1.0}, step)
    writer.close()
    out = subprocess.run(
        [*cmd, str(copy), "--out", str(tmp_path / "c.json")],
        capture_output=True,
        text=True,
        cwd=train_cli.REPO,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert "different runs" in out.stdout and f"{tag}@{step}" in out.stdout
    saved = json.loads((tmp_path / "c.json").read_text())
    assert not saved["same"] and len(saved["scalars_differ"]) == 1 and not saved["arrays_differ"]


@pytest.mark.slow  # ~3 min on 2 cores: 16 games generated, SFT, 4 evaluations, 7 RL iterations
def test_the_readmes_smoke_command_runs_through_every_evaluation(compile_cache, tmp_path):
    """``--config=configs/tiny_textworld.py:smoke`` as the README runs it, on one device. Its
    400-id tokenizer writes a valid game's longest admissible command in 39 tokens, more than
    ``rollout.max_new_tokens=32``: constrained decoding writes it whole, where the run used to
    stop at its first evaluation (issue #44)."""
    workdir = tmp_path / "smoke"
    cmd = train_cli.train_cmd(workdir, config="configs/tiny_textworld.py:smoke")
    log = tmp_path / "smoke.log"
    (text,) = train_cli.finish(train_cli.start(cmd, tmp_path / "cache", log, **compile_cache))
    assert "evaluation after_sft done" in text and "evaluation after_rl done" in text, text[-3000:]
    assert "RL gain" in (workdir / "report.md").read_text()


@pytest.mark.parametrize(
    "name",
    [
        "tiny_textworld",
        "textworld_qwen2_5_1_5b_ppo",
        "alfworld_gagpo",
        "alfworld_gigpo",
        "alfworld_grpo",
        "swe_grpo",
    ],
)
def test_every_shipped_config_validates(name):
    import importlib

    module = importlib.import_module(f"configs.{name}")
    cfg = module.get_config()
    with cfg.unlocked():
        cfg.mesh = (1, 1, 1)
    run = from_config_dict(cfg, num_devices=1)
    assert run.rl.algo in name or name == "tiny_textworld" or run.rl.algo == "gae"


def _checkpoint_trainer(config, directory):
    """The Trainer's checkpoint methods on a stand-in holding a tiny policy and its RL state."""
    from agentrl_jax.models import CausalLM
    from agentrl_jax.models.testing import random_model
    from agentrl_jax.rollout.curriculum import Curriculum
    from agentrl_jax.run.build import rl_learner
    from agentrl_jax.run.checkpoint import Checkpointer
    from agentrl_jax.run.state import RunState
    from agentrl_jax.run.tensorboard import SummaryWriter
    from agentrl_jax.run.watchdog import Watchdog

    policy = random_model(CausalLM)
    trainer = types.SimpleNamespace(
        config=config,
        policy=policy,
        critic=None,
        learner=rl_learner(config, policy, None),
        checkpointer=Checkpointer(directory, keep_last=2, keep_best=0, async_save=False),
        run_state=RunState(phase="rl"),
        mesh=None,
        curriculum=Curriculum(config.curriculum),
        watchdog=Watchdog(0),
        writer=SummaryWriter(os.path.join(directory, "tensorboard"), enabled=False),
        ref_policy=None,
        state=None,
        sft_state=None,
        pending={},
    )
    for name in ("save", "_save", "_state_tree", "_freeze_reference", "restore"):
        setattr(trainer, name, functools.partial(getattr(Trainer, name), trainer))
    return trainer


def _leaves(tree):
    import numpy as np

    return [np.asarray(x) for x in jax.tree.leaves(tree)]


@pytest.mark.parametrize("kl_coef,dtype", [(0.05, "float32"), (0.05, "bfloat16"), (0.0, "float32")])
def test_reference_policy_is_saved_once_and_restored_on_resume(tmp_path, kl_coef, dtype):
    import orbax.checkpoint as ocp

    from agentrl_jax.run.state import RunState

    rl = dict(kl_coef=kl_coef, reference_dtype=dtype)
    config = from_config_dict(_config(rl=rl), num_devices=1)
    directory = str(tmp_path / "checkpoints")
    run = _checkpoint_trainer(config, directory)
    run.state = run.learner.init(run.policy)
    # The reference as RL starts: the policy, in the reference's dtype.
    frozen = [x.astype(dtype) for x in _leaves(run.state.policy)]
    writes = []
    save_frozen = run.checkpointer.save_frozen
    run.checkpointer.save_frozen = lambda *a: (writes.append(a[0]), save_frozen(*a))
    run._freeze_reference()  # as RL starts
    for it in range(3):  # the policy moves on; three checkpoints
        run.state = dataclasses.replace(
            run.state, policy=jax.tree.map(lambda x: x + 1.0, run.state.policy)
        )
        run.run_state.rl_iteration = it + 1
        run.save()
    moved = _leaves(run.state.policy)
    run.checkpointer.close()

    # Written once, beside the checkpoints; no checkpoint holds a copy of it.
    assert writes == (["reference"] if kl_coef else [])
    assert os.path.isdir(os.path.join(directory, "reference")) == bool(kl_coef)
    for step in run.checkpointer.all_steps():
        with ocp.StandardCheckpointer() as ckpt:
            tree = ckpt.metadata(os.path.join(directory, str(step), "state")).item_metadata.tree
        assert sorted(tree) == ["train"]

    # A resumed run restores the RL state and the reference as RL started.
    resumed = _checkpoint_trainer(config, directory)
    assert resumed.restore()
    assert resumed.run_state == RunState(phase="rl", rl_iteration=3, checkpoint=2)
    # The meta keeps the untyped dict's keys, naming the reference when there is one.
    assert resumed.checkpointer.read_meta(2) == {
        "phase": "rl",
        "rl_iteration": 3,
        "evals": {},
        "checkpoint": 2,
        "curriculum": resumed.curriculum.state_dict(),
        **({"reference": "reference"} if kl_coef else {}),
    }
    for a, b in zip(_leaves(resumed.state.policy), moved, strict=True):
        assert (a == b).all()
    if kl_coef:
        for a, b in zip(_leaves(resumed.ref_policy), frozen, strict=True):
            assert a.dtype == b.dtype and (a == b).all()
    else:
        assert resumed.ref_policy is None  # the KL term is off: no reference held or saved
    resumed.checkpointer.close()
