"""The run config: one source of defaults, shipped configs pinned, every check before compute."""

import dataclasses
import glob
import json
import os
import sys

import ml_collections
import pytest

from agentrl_jax import kernels
from agentrl_jax.kernels import registry
from agentrl_jax.rollout.curriculum import CurriculumConfig
from agentrl_jax.rollout.rollout import RolloutConfig
from agentrl_jax.run import config as config_lib
from agentrl_jax.run.config import ConfigError, base_config, from_config_dict
from agentrl_jax.run.config_model import LoraSection

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from train_cli import tiny_config as _config  # noqa: E402

# Every shipped config's resolved RunConfig, computed at commit 33bdb58 (before the defaults were
# merged into the dataclasses).
SNAPSHOT = os.path.join(REPO, "tests", "data", "resolved_configs.json")
# Changes to a shipped config's resolved values made on purpose since the snapshot:
# {"configs/x.py[:arg]": {"section.field": new_value}}. ENVRL's horizon: 0 (the whole RL phase)
# replaced 100 updates as the default; model.remat names a policy ("none" | "full" | "save_dots",
# was a bool) and model.scan_layers is new (on with the Qwen configs' full remat); the
# before/after report's test games are new (env.report_levels, env.num_report_tasks: 200, the
# tiny default 50, its :test 1 and :smoke 2); the watchdog (new field) is off by default; each
# evaluated level writes 3 episodes as text (env.num_transcripts, new).
REPORT_TASKS = {
    "configs/tiny_textworld.py": 50,
    "configs/tiny_textworld.py:test": 1,
    "configs/tiny_textworld.py:smoke": 2,
}
# The 1.5B config's train steps take one row at a time and its rollouts play in waves of 128
# episodes (its memory plan, docs/performance.md); the tiny default's recipe is a small SFT warm
# start, then RL (docs/results.md, rl_learns).
TUNED = {
    "configs/textworld_qwen2_5_1_5b_ppo.py": {
        "rl.microbatch_size": 1,
        "sft.microbatch_size": 1,
        "env.envs_per_worker": 8,
        "rl.reference_dtype": "bfloat16",
    },
    "configs/tiny_textworld.py": {
        "budget.total": 1880,
        "budget.sft_fraction": 600 / 1880,
        "rl.epochs": 2,
        "rl.actor_lr": 5e-4,
        "rollout.max_new_tokens": 32,
    },
    "configs/tiny_textworld.py:smoke": {
        "rl.epochs": 2,
        "rl.actor_lr": 5e-4,
        "rollout.max_new_tokens": 32,
    },
    # issue #44: the ALFWorld configs declare the data_dir they document (None: $ALFWORLD_DATA).
    **{
        f"configs/alfworld_{algo}.py": {
            "env.kwargs": [["admissible_commands", True], ["data_dir", None], ["max_steps", 50]]
        }
        for algo in ("gagpo", "gigpo", "grpo")
    },
}
with open(SNAPSHOT) as _f:
    INTENDED_CHANGES: dict[str, dict[str, object]] = {
        spec: {
            "envrl.horizon": 0,
            "model.remat": "full" if resolved["model"]["remat"] else "none",
            "model.scan_layers": bool(resolved["model"]["remat"]),
            "env.report_levels": [],
            "env.num_report_tasks": REPORT_TASKS.get(spec, 200),
            "env.num_transcripts": 3,
            "watchdog_s": 0.0,
            "compile_cache": "",  # issue #30: the persistent compilation cache's folder
            "rl.reference_dtype": "float32",
            # issue #32: LoRA for the RL phase, off (rank 0) unless asked for.
            "model.lora.rank": 0,
            "model.lora.alpha": 8.0,
            "model.lora.dropout": 0.0,
            "model.lora.targets": "all",
            "model.lora.base_dtype": resolved["model"]["dtype"],  # empty resolves to model.dtype
            # issue #31: importance weights for the sampler's log-probs, off unless asked for.
            "rl.off_policy_correction": "none",
            "rl.is_cap": 2.0,
            # issue #31: continuous batching, concurrent env steps and asynchronous RL, off.
            "rollout.batching": "waves",
            "rollout.cohorts": 2,
            "rl.max_staleness": 0,
            "env.concurrent_steps": False,
            "rollout_mesh": [],
            # issue #40: a built tokenizer learns from every train task unless told fewer.
            "model.tokenizer_tasks": 0,
            "rollout.restate_goal": False,  # issue #40: the goal line on every turn, off
            # issue #43: a Weights & Biases writer beside TensorBoard, off.
            "logging.wandb.enabled": False,
            "logging.wandb.project": "agentrl_jax",
            "logging.wandb.entity": "",
            "logging.wandb.name": "",
            "logging.wandb.group": "",
            "logging.wandb.tags": [],
            "logging.wandb.mode": "offline",
            "logging.wandb.run_id": "",
            # issue #43: tool calling's format; empty: the model family's.
            "rollout.tool_format": "",
            # issue #42: a checkpoint's chat template is held exact unless append-only is asked for.
            "model.template_mode": "exact",
            # issue #41: no reward on refused commands unless asked for.
            "rl.invalid_action_reward": 0.0,
            # issue #42: routed experts computed densely unless grouped is asked for.
            "model.moe_impl": "dense",
            **TUNED.get(spec, {}),
        }
        for spec, resolved in json.load(_f).items()
    }


def _flat(tree, prefix=""):
    if isinstance(tree, dict):
        out = {}
        for k, v in tree.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: tree}


def _resolved(run) -> dict:
    return _flat(json.loads(json.dumps(dataclasses.asdict(run))))


# Configs shipped after the snapshot: each resolves in a test of its own (the snapshot holds
# what the older configs resolved to before later fields existed).
AFTER_SNAPSHOT = {
    "configs/alfworld_tiny.py": ("sft",),
    "configs/textarena_frozenlake.py": ("smoke", "test"),  # tests/test_adapters.py
}


def _shipped_specs():
    specs = []
    for path in sorted(glob.glob(os.path.join(REPO, "configs", "*.py"))):
        name = os.path.relpath(path, REPO)
        if name == os.path.join("configs", "from_json.py") or name in AFTER_SNAPSHOT:
            continue  # a loader of a saved config.json, not an experiment; or a newer config
        args = (None, "test", "smoke") if name.endswith("tiny_textworld.py") else (None,)
        specs += [name if a is None else f"{name}:{a}" for a in args]
    return specs


def test_snapshot_covers_every_shipped_config():
    with open(SNAPSHOT) as f:
        assert sorted(json.load(f)) == sorted(_shipped_specs())


@pytest.mark.parametrize("spec", _shipped_specs())
def test_shipped_config_resolves_as_before(spec, monkeypatch):
    monkeypatch.chdir(REPO)
    with open(SNAPSHOT) as f:
        expected = _flat(json.load(f)[spec])
    expected.update(INTENDED_CHANGES.get(spec, {}))
    got = _resolved(from_config_dict(config_lib.load_config_file(spec)))
    assert sorted(got) == sorted(expected)
    diffs = {k: (expected[k], got[k]) for k in expected if got[k] != expected[k]}
    assert not diffs, f"{spec}: (snapshot, now) differ: {diffs}"


@pytest.mark.parametrize("arg", (None, *AFTER_SNAPSHOT["configs/alfworld_tiny.py"]))
def test_alfworld_tiny_resolves(arg, monkeypatch):
    monkeypatch.chdir(REPO)
    spec = "configs/alfworld_tiny.py" + (f":{arg}" if arg else "")
    run = from_config_dict(config_lib.load_config_file(spec))
    assert run.env.name == "alfworld" and run.model.tokenizer_tasks == 200
    assert run.rollout.constrain_actions and not run.rollout.show_admissible
    assert run.env.eval_levels == ("all@valid_seen", "all@valid_unseen")
    assert (run.budget.sft_fraction == 1.0) == (arg == "sft")


def test_tokenizer_tasks_takes_each_levels_first_and_is_checked():
    from agentrl_jax.run.build import corpus_tasks

    train = {"a": list("abcde"), "b": list("xyz")}
    assert corpus_tasks(from_config_dict(_config()), train) == list("abcdexyz")  # 0: all
    two = from_config_dict(_config(model={"tokenizer_tasks": 2}))
    assert corpus_tasks(two, train) == list("abxy")
    with pytest.raises(ConfigError, match=r"config.model.tokenizer_tasks is -1; expected an int"):
        from_config_dict(_config(model={"tokenizer_tasks": -1}))


def test_defaults_have_one_source():
    """base_config() is the dataclasses' defaults, and a key left out takes the same value."""
    cd = base_config()
    for name, cls in config_lib.SECTIONS.items():
        fields = {f.name: f for f in dataclasses.fields(cls)}
        assert sorted(cd[name].keys()) == sorted(fields), name
        instance = cls()
        for key in fields:
            value = cd[name][key]
            value = tuple(sorted(value.items())) if hasattr(value, "items") else value
            # A default resolved in __post_init__ (model.template: "" is "checkpoint" with a
            # checkpoint, else "plain") resolves to the same value.
            assert getattr(cls(**{key: value}), key) == getattr(instance, key), f"{name}.{key}"
    assert cd.curriculum.window == CurriculumConfig(stages=((("a", 1.0),),)).window
    full = from_config_dict(base_config())
    assert from_config_dict(ml_collections.ConfigDict()) == full
    assert from_config_dict(ml_collections.ConfigDict({"rl": {"algo": "grpo"}})) == full
    # The values the shipped configs and docs relied on (base_config's before the merge).
    assert (full.rl.epochs, full.sft.learning_rate, full.checkpoint.every) == (1, 2e-3, 5)
    assert (full.rollout.group_size, full.model.tokenizer_vocab) == (4, 1024)
    assert RolloutConfig() == full.rollout


@pytest.mark.parametrize(
    "sections, match",
    [
        (
            dict(rl=dict(kl_mode="reward", kl_coef=0.1)),
            r"^config.rl.kl_mode='reward' needs an estimator that takes a per-token KL reward "
            r"penalty; config.rl.algo='grpo' does not .*\['gae', 'reinforce_pp'\]",
        ),
        (dict(rl=dict(temperature=0.0)), r"^config.rl.temperature is 0.0; expected > 0"),
        (dict(rl=dict(top_p=0.0)), r"^config.rl.top_p is 0.0; expected in \(0, 1\]"),
        (dict(rl=dict(top_k=-1)), r"^config.rl.top_k is -1; expected an int >= 0"),
        # Valid sampling values the learner does not model: refused, not silently mis-trained.
        (
            dict(rl=dict(top_p=0.5)),
            r"^config.rl.top_p is 0.5; expected 1.0: the learner's log-probs do not model top-p "
            r"truncation, so the PPO ratio would not be against the behaviour policy",
        ),
        (
            dict(rl=dict(top_k=5)),
            r"^config.rl.top_k is 5; expected 0: the learner's log-probs do not model top-k "
            r"truncation, so the PPO ratio would not be against the behaviour policy",
        ),
        (dict(rl=dict(kl_coef=-0.1)), r"^config.rl.kl_coef is -0.1; expected >= 0"),
        (
            dict(rl=dict(invalid_action_reward=0.1)),
            r"^config.rl.invalid_action_reward is 0.1; expected <= 0 \(a penalty",
        ),
        (
            dict(env=dict(kwargs=dict(admissible_commands=False))),
            r"^config.rollout.constrain_actions=True writes one of the env's admissible "
            r"commands, but config.env.name='textworld' with config.env.kwargs=.*lists none",
        ),
        (
            dict(rl=dict(minibatch_size=128)),
            r"^config.rl.minibatch_size=128 is more than an iteration's 64 episodes",
        ),
        (
            dict(rollout=dict(group_size=40), env=dict(num_workers=2, envs_per_worker=16)),
            r"^config.rollout.group_size=40 does not fit the actor pool: "
            r"config.env.num_workers=2 x config.env.envs_per_worker=16 = 32",
        ),
        (
            dict(budget=dict(total=4010, sft_fraction=4000 / 4010)),
            r"^config.budget leaves 10 RL episodes, fewer than one iteration's 64",
        ),
        (dict(checkpoint=dict(every=0)), r"^config.checkpoint.every is 0; expected an int >= 1"),
        (dict(checkpoint=dict(keep_last=0)), r"^config.checkpoint.keep_last is 0"),
        (dict(env=dict(name="nethack")), r"^config.env.name: unknown env 'nethack'; valid names"),
        (dict(env=dict(num_eval_tasks=0)), r"^config.env.num_eval_tasks is 0; expected an int"),
        (dict(env=dict(eval_levels=())), r"^config.env.eval_levels is empty"),
        (dict(model=dict(tokenizer_vocab=100)), r"^config.model.tokenizer_vocab is 100; .* >= 259"),
        (
            dict(model=dict(moe_impl="ragged")),
            r"^config.model.moe_impl is 'ragged'; valid choices: \['dense', 'grouped'\]",
        ),
        (dict(sft=dict(epochs=0)), r"^config.sft.epochs is 0; expected an int >= 1"),
        (dict(envrl=dict(horizon=-1)), r"^config.envrl.horizon is -1; expected an int >= 0"),
        (dict(eval_every=-1), r"^config.eval_every is -1; expected an int >= 0"),
        (dict(watchdog_s=-5.0), r"^config.watchdog_s is -5.0; expected >= 0 seconds \(0: off\)"),
        (dict(mesh=(1, 0, 1)), r"^config.mesh is \(1, 0, 1\); expected three sizes"),
        (
            dict(mesh=(1, 1, 1, 1, 1)),
            r"^config.mesh is \(1, 1, 1, 1, 1\); expected three sizes \(data, fsdp, tp\) or four "
            r"\(data, fsdp, tp, expert\)",
        ),
        (
            dict(rollout=dict(max_new_tokens=768)),
            r"^config.rollout: rollout.max_new_tokens=768 leaves no room for a prompt in "
            r"rollout.max_seq_len=768",
        ),
        (dict(rollout=dict(history_turns=-1)), r"^config.rollout: rollout.history_turns is -1"),
        (dict(curriculum=dict(windo=3)), r"^config.curriculum: unknown field\(s\) \['windo'\]"),
    ],
)
def test_bad_combination_fails_at_validation_in_one_line(sections, match):
    with pytest.raises(ConfigError, match=match) as e:
        from_config_dict(_config(**sections), num_devices=1)
    assert "\n" not in str(e.value)


def test_mesh_takes_an_expert_axis_for_a_model_with_routed_experts(tmp_path):
    """``config.mesh`` of four sizes: the fourth splits routed experts, so it is refused (naming
    the field and the model) on a model without them or where it does not divide num_experts;
    a -1 there is checked once resolved, by the config given a device count, or by the mesh."""
    from agentrl_jax.models import hf_checkpoint as hc
    from agentrl_jax.models.config import preset
    from agentrl_jax.run import build

    moe = dict(preset="qwen3-30b-a3b", overrides={})  # 128 routed experts
    run = from_config_dict(_config(mesh=(1, 2, 1, 4), model=moe), num_devices=8)
    assert run.mesh == (1, 2, 1, 4)
    resolved = from_config_dict(_config(mesh=(1, 1, 1, -1), model=moe), num_devices=8)
    assert resolved.mesh == (1, 1, 1, 8)
    # An expert axis of 1 is a (data, fsdp, tp) mesh with a trivial fourth axis: any model.
    assert from_config_dict(_config(mesh=(1, 2, 2, 1)), num_devices=4).mesh == (1, 2, 2, 1)
    with pytest.raises(ConfigError) as e:
        from_config_dict(_config(mesh=(1, 2, 1, 2)), num_devices=4)
    assert str(e.value).startswith(
        "config.mesh=(1, 2, 1, 2) splits routed experts over 2 devices (its fourth size, "
        "expert), but the model (config.model.preset='tiny' with config.model.overrides="
    )
    assert "has none; expected an expert size of 1" in str(e.value)
    with pytest.raises(ConfigError, match=r"^config.mesh=\(1, 1, 1, 3\): its expert size 3 does "
                       r"not divide the model's num_experts=128 \(config.model.preset="
                       r"'qwen3-30b-a3b'\); expected a divisor of 128$"):  # fmt: skip
        from_config_dict(_config(mesh=(1, 1, 1, 3), model=moe), num_devices=3)
    with pytest.raises(ConfigError, match=r"^config.mesh=\(1, 1, 1, 6\): its expert size 6"):
        from_config_dict(_config(mesh=(1, 1, 1, -1), model=moe), num_devices=6)
    # Without a device count the -1 stays; the run's mesh resolves it (8 devices) and checks it.
    unresolved = from_config_dict(_config(mesh=(1, 1, 1, -1), model=moe))
    assert unresolved.mesh == (1, 1, 1, -1)
    assert dict(build.device_mesh(unresolved).shape) == dict(data=1, fsdp=1, tp=1, expert=8)
    with pytest.raises(ConfigError, match=r"^config.mesh=\(1, 1, 1, 8\) splits routed experts"):
        build.device_mesh(from_config_dict(_config(mesh=(1, 1, 1, -1))))
    # A checkpoint's num_experts is its config.json's (num_experts, or num_local_experts).
    ckpt = tmp_path / "moe"
    ckpt.mkdir()
    cfg = dict(preset="", checkpoint=str(ckpt), template="plain", overrides={})
    with pytest.raises(ConfigError, match=r"^config.mesh has an expert axis.*config.json"):
        from_config_dict(_config(mesh=(1, 1, 1, 2), model=cfg), num_devices=2)
    experts = preset("qwen3-30b-a3b").with_layers(1).replace(num_experts=6, num_experts_per_tok=2)
    (ckpt / "config.json").write_text(json.dumps(hc.config_to_hf(experts)))
    assert from_config_dict(_config(mesh=(1, 1, 1, 3), model=cfg), num_devices=3).mesh[3] == 3
    with pytest.raises(ConfigError, match=r"num_experts=6 \(config.model.checkpoint='"):
        from_config_dict(_config(mesh=(1, 1, 1, 4), model=cfg), num_devices=4)


def test_rollout_mesh_takes_an_expert_axis_checked_as_the_learners(tmp_path):
    """``config.rollout_mesh`` of four sizes (data, fsdp, tp, expert): its devices counted after
    the learner's, its expert size refused as ``config.mesh``'s is (no routed experts, or not
    dividing num_experts), the error naming ``config.rollout_mesh`` and the model's source."""
    import jax

    from agentrl_jax.models import hf_checkpoint as hc
    from agentrl_jax.models.config import preset
    from agentrl_jax.run import build

    moe = dict(preset="qwen3-30b-a3b", overrides={})  # 128 routed experts
    run = from_config_dict(
        _config(mesh=(1, 2, 1, 2), rollout_mesh=(1, 1, 1, 4), model=moe), num_devices=8
    )
    assert run.mesh == (1, 2, 1, 2) and run.rollout_mesh == (1, 1, 1, 4)
    # The learner's -1 takes the devices the four-axis rollout mesh leaves.
    left = from_config_dict(
        _config(mesh=(1, -1, 1), rollout_mesh=(1, 2, 1, 2), model=moe), num_devices=8
    )
    assert left.mesh == (1, 4, 1) and left.rollout_mesh == (1, 2, 1, 2)
    # An expert size of 1: a (data, fsdp, tp) rollout mesh with a trivial fourth axis, any model.
    assert from_config_dict(_config(rollout_mesh=(1, 2, 1, 1)), num_devices=3).rollout_mesh == (
        1, 2, 1, 1,
    )  # fmt: skip
    with pytest.raises(ConfigError) as e:
        from_config_dict(_config(rollout_mesh=(1, 1, 1, 2)), num_devices=3)
    assert str(e.value).startswith(
        "config.rollout_mesh=(1, 1, 1, 2) splits routed experts over 2 devices (its fourth size, "
        "expert), but the model (config.model.preset='tiny' with config.model.overrides="
    )
    assert "has none; expected an expert size of 1" in str(e.value)
    with pytest.raises(ConfigError, match=r"^config.rollout_mesh=\(1, 1, 1, 3\): its expert size "
                       r"3 does not divide the model's num_experts=128 \(config.model.preset="
                       r"'qwen3-30b-a3b'\); expected a divisor of 128"):  # fmt: skip
        from_config_dict(_config(rollout_mesh=(1, 1, 1, 3), model=moe), num_devices=4)
    # A checkpoint's num_experts (its config.json), and none to read.
    ckpt = tmp_path / "moe"
    ckpt.mkdir()
    cfg = dict(preset="", checkpoint=str(ckpt), template="plain", overrides={})
    with pytest.raises(ConfigError, match=r"^config.rollout_mesh has an expert axis.*config.json"):
        from_config_dict(_config(rollout_mesh=(1, 1, 1, 2), model=cfg), num_devices=3)
    experts = preset("qwen3-30b-a3b").with_layers(1).replace(num_experts=6, num_experts_per_tok=2)
    (ckpt / "config.json").write_text(json.dumps(hc.config_to_hf(experts)))
    run = from_config_dict(_config(rollout_mesh=(1, 1, 1, 3), model=cfg), num_devices=4)
    assert run.rollout_mesh == (1, 1, 1, 3)
    with pytest.raises(ConfigError, match=r"^config.rollout_mesh=\(1, 1, 1, 4\): .*num_experts=6 "
                       r"\(config.model.checkpoint='"):  # fmt: skip
        from_config_dict(_config(rollout_mesh=(1, 1, 1, 4), model=cfg), num_devices=5)
    # Sizes: (), three or four, each positive (no -1: its devices are counted first).
    for bad in [(1, 1), (1, 1, 1, 1, 1), (1, -1, 1), (1, 1, 1, 0)]:
        with pytest.raises(ConfigError) as e:
            from_config_dict(_config(rollout_mesh=bad), num_devices=8)
        assert str(e.value) == (
            f"config.rollout_mesh is {bad}; expected () (rollouts on the learner's mesh), three "
            "positive sizes (data, fsdp, tp) or four (data, fsdp, tp, expert)"
        ), bad
    with pytest.raises(ConfigError, match=r"^config.rollout_mesh is \('1', 'x', '1'\); expected "
                       r"\(\) or three ints \(data, fsdp, tp\) or four \(data, fsdp, tp, "
                       r"expert\)$"):  # fmt: skip
        from_config_dict(_config(rollout_mesh=("1", "x", "1")), num_devices=8)

    # With a rollout mesh and a -1 left in config.mesh (a config validated without a device
    # count), the learner takes the devices the rollout's leave, the rollout the last ones.
    apart = from_config_dict(_config(mesh=(1, -1, 1), rollout_mesh=(1, 2, 1)))
    learner, rollout = build.device_mesh(apart), build.rollout_device_mesh(apart)
    assert dict(learner.shape) == dict(data=1, fsdp=6, tp=1)
    assert list(learner.devices.flat) == jax.devices()[:6]
    assert list(rollout.devices.flat) == jax.devices()[6:]


def test_unknown_config_keys_are_refused():
    cd = _config()
    with cd.unlocked():
        cd.seeed = 1
    with pytest.raises(ConfigError, match=r"^config: unknown key\(s\) \['seeed'\]; valid keys"):
        from_config_dict(cd)


def test_kl_reward_is_fine_with_an_estimator_that_takes_it():
    run = from_config_dict(_config(rl=dict(algo="reinforce_pp", kl_mode="reward", kl_coef=0.1)))
    assert run.rl_spec().advantage.kl_coef == 0.1


def test_sft_only_budget_needs_no_rl_iteration():
    run = from_config_dict(
        _config(budget=dict(total=4000, sft_fraction=1.0), rl=dict(task_pool="all"))
    )
    assert run.budget.sft_fraction == 1.0


def test_a_registered_estimator_declares_what_it_needs_and_gets_the_checks():
    """A user's estimator is checked by what it declares, never by its name."""
    kernels.register_advantage_estimator(
        "critic_test", lambda *a, **k: None, needs_values=True, needs_groups=True, kl_reward=True
    )
    kernels.register_advantage_estimator("plain_test", lambda *a, **k: None)
    try:
        with pytest.raises(ConfigError, match="'critic_test' uses a critic over the whole"):
            from_config_dict(
                _config(rl=dict(algo="critic_test"), rollout=dict(context_mode="step"))
            )
        with pytest.raises(ConfigError, match="'critic_test' compares rollouts within a group"):
            from_config_dict(_config(rl=dict(algo="critic_test"), rollout=dict(group_size=1)))
        rl = dict(algo="critic_test", kl_mode="reward", kl_coef=0.1)
        assert from_config_dict(_config(rl=rl)).needs_critic
        with pytest.raises(ConfigError, match=r"config.rl.algo='plain_test' does not .*'critic"):
            from_config_dict(_config(rl=dict(algo="plain_test", kl_mode="reward")))
        rl = dict(algo="plain_test", minibatch_size=16)
        run = from_config_dict(_config(rl=rl, rollout=dict(group_size=1)))
        assert not run.needs_critic and run.rl_spec().loss.ratio_level == "token"
    finally:
        registry.unregister("critic_test")
        registry.unregister("plain_test")


def test_env_declares_whether_it_lists_admissible_commands():
    from agentrl_jax.envs import registry as envs

    assert envs.lists_admissible_commands("textworld", {}) is True
    assert envs.lists_admissible_commands("textworld", {"admissible_commands": False}) is False
    assert envs.lists_admissible_commands("alfworld", {"max_steps": 5}) is True
    assert envs.lists_admissible_commands("swe", {"path": "x.jsonl"}) is False
    cd = _config(env=dict(name="swe", kwargs=dict(path="x.jsonl")))
    with pytest.raises(ConfigError, match="config.env.name='swe' with config.env.kwargs="):
        from_config_dict(cd)


def test_lora_section_is_validated_naming_the_field():
    """``config.model.lora``: rank 0 (off) by default; its fields checked, each error naming it."""
    off = from_config_dict(base_config())
    assert off.model.lora == LoraSection(base_dtype=off.model.dtype)
    assert off.model.lora.lora_config() is None
    cd = base_config()
    cd.model.lora.rank = 4
    cd.model.lora.alpha = 16
    cd.model.lora.targets = "v, q"
    run = from_config_dict(cd)
    assert (run.model.lora.rank, run.model.lora.alpha, run.model.lora.targets) == (4, 16.0, "q,v")
    lora = run.model.lora.lora_config()
    assert (lora.rank, lora.scale, lora.targets) == (4, 4.0, ("q", "v"))
    # A saved config.json round-trips (the section as a dict of its fields).
    assert from_config_dict(ml_collections.ConfigDict(json.loads(json.dumps(cd.to_dict())))) == run
    # The frozen base is stored in the compute dtype unless the config names another.
    assert run.model.lora.base_dtype == run.model.dtype == "float32"
    cd.model.dtype = "bfloat16"
    assert from_config_dict(cd).model.lora.base_dtype == "bfloat16"
    cd.model.lora.base_dtype = "float32"
    cd.model.lora.dropout = 0.1
    cd.rl.loss = "pg"  # dropout and PPO's ratio do not go together (the next test)
    assert from_config_dict(cd).model.lora.base_dtype == "float32"
    assert from_config_dict(cd).model.lora.lora_config().dropout == 0.1
    for key, value, match in [
        ("rank", -1, r"config.model.lora.rank is -1; expected an int >= 0"),
        ("alpha", 0, r"config.model.lora.alpha is 0"),
        ("dropout", 1.0, r"config.model.lora.dropout is 1.0; expected a probability in \[0, 1\)"),
        ("base_dtype", "float16", r"config.model.lora.base_dtype is 'float16'; valid choices"),
        ("targets", "q,qq", r"config.model.lora.targets is 'q,qq': \['qq'\] not among"),
        ("targets", "q,q", r"config.model.lora.targets is 'q,q': repeated"),
        ("bogus", 1, r"config.model.lora: unknown field\(s\) \['bogus'\]"),
    ]:
        cd = base_config()
        cd.model.lora[key] = value
        with pytest.raises(ConfigError, match=match):
            from_config_dict(cd)


def test_lora_dropout_is_refused_with_the_ppo_ratio():
    """LoRA dropout acts in the RL steps' forward passes while the old log-probs are scored
    without it, so PPO's ratio would be pi_dropout / pi, not 1, on-policy: refused, naming the
    fields. A loss without a ratio (``pg``), no dropout, or no LoRA are accepted."""
    cd = base_config()
    cd.model.lora.rank = 4
    cd.model.lora.dropout = 0.1
    with pytest.raises(
        ConfigError,
        match=r"config.model.lora.dropout=0.1 with config.rl.loss='ppo': .* PPO ratio",
    ):
        from_config_dict(cd)
    cd.rl.loss = "pg"
    assert from_config_dict(cd).model.lora.lora_config().dropout == 0.1
    cd.rl.loss = "ppo"
    cd.model.lora.dropout = 0.0
    assert from_config_dict(cd).model.lora.rank == 4
    cd.model.lora.rank, cd.model.lora.dropout = 0, 0.1  # LoRA off: the dropout applies to nothing
    assert from_config_dict(cd).model.lora.lora_config() is None


def test_step_latency_is_checked_naming_the_field():
    cd = base_config()
    cd.env.kwargs = dict(cd.env.kwargs, step_latency_s=0.2)
    assert dict(from_config_dict(cd).env.kwargs)["step_latency_s"] == 0.2
    cd.env.kwargs = dict(cd.env.kwargs, step_latency_s=[0.3, 0.1])
    with pytest.raises(ConfigError, match=r"config.env.kwargs.step_latency_s is \[0.3, 0.1\]"):
        from_config_dict(cd)


def test_a_lora_run_is_told_by_one_predicate():
    """``config.model.lora.enabled`` (rank > 0) is the one test of a LoRA run."""
    off = from_config_dict(_config())
    on = from_config_dict(_config(model={"lora": {"rank": 4}}, rl={"loss": "pg"}))
    assert not off.model.lora.enabled and off.model.lora.lora_config() is None
    assert on.model.lora.enabled and on.model.lora.lora_config().rank == 4
