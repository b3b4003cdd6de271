"""One process of a small multi-host check, started by ``tests/test_multihost.py`` (N copies).

    python tests/multihost_worker.py MODE COORDINATOR NUM_PROCESSES PROCESS_ID

Modes:
  exchange: episode-sized payloads of a new length every "iteration" all-gathered, and the
    policy's local bf16 copy (split over the process's devices) refreshed, as the trainer does;
    prints the XLA compilations of each iteration as ``compiles <it> <n>``.
  experts: a tiny Qwen3-MoE's parameters, laid out over every process's devices with the
    experts split over ``expert``, copied to each process's four-axis local mesh
    (``multihost.local_copy``); prints ``experts <n> a device`` once every device's shard is
    the whole array's block.
  agree: the trainer's agreement check, passed once, then failed on a process that differs in
    config, code, tasks and tokenizer; prints ``agreed`` then the error (exit status 3).
  play: RL iterations, expert demonstrations and a greedy evaluation through the multi-host
    rollout worker (a ``CountingPool`` of 8 episodes and a tiny policy on each process); prints
    the episodes this process played in each as ``played <name> <n>``, then, on process 0,
    ``same as one process`` once every result equals a single-process worker's.
"""

from __future__ import annotations

import os
import sys

import jax
import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tests"))

from agentrl_jax import sharding  # noqa: E402
from agentrl_jax.envs.actors import StepResult  # noqa: E402
from agentrl_jax.envs.base import Observation, Task  # noqa: E402
from agentrl_jax.run import multihost  # noqa: E402

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


class CompileCounter:
    """Counts XLA backend compilations (jax.monitoring) while active."""

    def __init__(self):
        self.count = 0

    def __call__(self, event: str, duration: float, **kwargs) -> None:
        if event == COMPILE_EVENT:
            self.count += 1

    def __enter__(self):
        jax.monitoring.register_event_duration_secs_listener(self)
        return self

    def __exit__(self, *exc):
        jax.monitoring.unregister_event_duration_listener(self)


class CountingPool:
    """An in-process stand-in for ActorPool: an episode of task i lasts i % 3 + 1 steps and pays
    0.5 per step, whatever the policy does (its expert says "look"); holds ``capacity``
    episodes at once and counts the episodes it was given (``played``). Waves play through
    ``reset``/``step``, continuous batching through the slot-wise ``submit``/``poll`` (each
    answer ready at once)."""

    def __init__(self, capacity: int = 2):
        self.capacity = capacity
        self.played = 0
        self.tasks: dict[int, Task] = {}  # slot -> its episode's task
        self.t: dict[int, int] = {}  # slot -> steps its episode took
        self.answers: dict[int, StepResult] = {}  # submitted, not yet polled

    def reset(self, tasks):
        if not 0 < len(tasks) <= self.capacity:
            raise ValueError(f"{len(tasks)} episodes for a pool of {self.capacity}")
        self.tasks, self.t = {}, {}
        return [self._reset(slot, task) for slot, task in enumerate(tasks)]

    def step(self, actions):
        return [None if a is None else self._step(slot) for slot, a in enumerate(actions)]

    def submit(self, kind, items):
        for slot in items:
            if not 0 <= slot < self.capacity:
                raise ValueError(f"slot {slot} is outside the pool (0..{self.capacity - 1})")
        for slot, item in items.items():
            self.answers[slot] = self._reset(slot, item) if kind == "reset" else self._step(slot)

    def poll(self, timeout=None):
        out, self.answers = self.answers, {}
        return out

    @property
    def in_flight(self):
        return len(self.answers)

    def _reset(self, slot, task):
        self.tasks[slot], self.t[slot] = task, 0
        self.played += 1
        return StepResult(self._obs(), info=self._info(0))

    def _step(self, slot):
        self.t[slot] += 1
        done = self.t[slot] >= int(self.tasks[slot].id) % 3 + 1
        info = {"won": done, **self._info(self.t[slot])}
        return StepResult(self._obs(), reward=0.5, done=done, info=info)

    def _obs(self):
        return Observation(objective="win", text="a room", admissible_commands=("look",))

    def _info(self, t):
        return {"state_key": t, "expert_action": "look"}


def tiny_sampler(texts, tokenizer_dir):
    """(sampler, tokenizer, template): a 1-layer policy (seed 0) sampling at temperature 1, and a
    300-token tokenizer built from ``texts``; the same on every process."""
    from flax import nnx

    from agentrl_jax.models import CausalLM, preset
    from agentrl_jax.models.tokenizer import build_tokenizer
    from agentrl_jax.rollout.chat import get_template
    from agentrl_jax.sampling import Sampler, SamplingParams, StopConfig

    tok = build_tokenizer(list(texts) * 10, 300, tokenizer_dir)
    cfg = preset(
        "tiny", vocab_size=300, hidden_size=32, intermediate_size=64, num_layers=1,
        num_heads=2, num_kv_heads=1, head_dim=16,
    )  # fmt: skip
    template = get_template("plain")
    sampler = Sampler(
        CausalLM(cfg, rngs=nnx.Rngs(0)),
        sampling=SamplingParams(temperature=1.0),
        stop=StopConfig(eos_ids=(template.stop_id(tok),)),
        pad_id=tok.pad_token_id,
    )
    return sampler, tok, template


def worker_parts(tokenizer_dir, capacity: int = 2):
    """(pool, sampler, tokenizer, template, rollout config) of a tiny rollout worker."""
    from agentrl_jax.rollout.rollout import RolloutConfig

    sampler, tok, template = tiny_sampler(["a room | look | Goal: win"], tokenizer_dir)
    config = RolloutConfig(group_size=2, max_turns=3, max_new_tokens=4, max_seq_len=256)
    return CountingPool(capacity), sampler, tok, template, config


def played(trajs):
    """What decides an episode's training rows: its task, group, actions and outcome."""
    return [(t.task.id, t.group, [s.action_ids for s in t.steps], t.won) for t in trajs]


def play() -> None:
    """Every kind of rollout call the trainer makes, through ``ShardedRolloutWorker``: each
    process must play its even share of each, and the gathered result must be one process's."""
    import tempfile

    from agentrl_jax.rollout.rollout import RolloutWorker
    from agentrl_jax.run import evaluation

    parts = worker_parts(tempfile.mkdtemp(), capacity=8)
    pool = parts[0]
    worker = multihost.ShardedRolloutWorker(*parts)
    tasks = [Task("scripted", "train", str(i)) for i in range(10)]
    # RL iterations of 4 and 6 tasks x 2 episodes (one or two pool-fulls in all), 5 expert
    # demonstrations (one episode each), 9 held-out tasks greedily (uneven shares, like 140).
    calls = {
        "iteration_0": dict(tasks=tasks[:4], rng=jax.random.key(10)),
        "iteration_1": dict(tasks=tasks[3:9], rng=jax.random.key(11)),
        "demonstrations": dict(tasks=tasks[:5], rng=jax.random.key(0), expert=True, group_size=1),
    }
    results = {}
    for name, kwargs in calls.items():
        before = pool.played
        results[name] = worker.run(**kwargs)
        print(f"played {name} {pool.played - before}", flush=True)
    before = pool.played
    results["evaluation"] = evaluation.evaluate(worker, tasks[:9], jax.random.key(0))
    print(f"played evaluation {pool.played - before}", flush=True)

    if jax.process_index() == 0:
        # One process with one pool of 8 plays the same lists in its own (full) waves.
        one = RolloutWorker(*worker_parts(tempfile.mkdtemp(), capacity=8))
        for name, kwargs in calls.items():
            want, got = played(one.run(**kwargs)), played(results[name])
            assert want == got, (name, want, got)
        want = evaluation.evaluate(one, tasks[:9], jax.random.key(0)).to_json()
        assert want == results["evaluation"].to_json(), (want, results["evaluation"].to_json())
        print("same as one process", flush=True)


def exchange() -> None:
    import jax.numpy as jnp
    from flax import nnx

    from agentrl_jax.models import CausalLM
    from agentrl_jax.models.testing import TEST_CONFIG, random_model

    # FSDP over every process's devices: each process's copy gathers shards from the others.
    mesh = sharding.make_mesh((1, jax.device_count(), 1))
    cfg = TEST_CONFIG.replace(num_layers=1)
    local = multihost.local_mesh(cfg)
    assert dict(local.shape) == {"data": 1, "fsdp": 1, "tp": jax.local_device_count()}, local
    params = nnx.state(random_model(CausalLM, cfg, mesh=mesh), nnx.Param)
    rng = np.random.default_rng(jax.process_index())
    copy = None
    for it in range(6):
        with CompileCounter() as counter:
            # As the trainer does: the old copy goes before the new one is made.
            if copy is not None:
                jax.tree.map(lambda x: x.delete(), copy)
            copy = multihost.local_copy(params, local, jnp.bfloat16)
            for got, want in zip(jax.tree.leaves(copy), jax.tree.leaves(params)):
                assert got.dtype == jnp.bfloat16 and got.sharding.mesh == local, got.sharding
                whole = sharding.host_array(want).astype(jnp.bfloat16)
                np.testing.assert_array_equal(np.asarray(got), whole)
            mlp = copy["trunk"]["layers"][0]["mlp"]["gate_weight_df"][...]
            tp = local.shape["tp"]  # split over the process's devices, not replicated
            assert mlp.sharding.shard_shape(mlp.shape) == (64, 96 // tp), mlp.sharding
            # Episodes of a new size every iteration (a pickled list of token-id arrays of about
            # 5.6-7.3 kB: new lengths, one power-of-two bucket).
            episodes = [rng.integers(0, 300, size=int(n)) for n in rng.integers(80, 100, size=8)]
            gathered = multihost.allgather_objects(episodes)
            assert len(gathered) == jax.process_count()
            for p, block in enumerate(gathered):
                assert len(block) == 8, (p, len(block))
            np.testing.assert_array_equal(gathered[jax.process_index()][3], episodes[3])
        print(f"compiles {it} {counter.count}", flush=True)


def experts() -> None:
    from flax import nnx

    from agentrl_jax.models import CausalLM
    from agentrl_jax.models.config import ModelConfig
    from agentrl_jax.models.testing import random_model

    cfg = ModelConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
        num_kv_heads=2, head_dim=8, family="qwen3_moe", attention_bias=False, qk_norm=True,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
    )  # fmt: skip
    # The learner's parameters over all processes' devices: experts 4 ways, the width over fsdp.
    mesh = sharding.make_mesh((1, jax.device_count() // 4, 1, 4))
    local = multihost.local_mesh(cfg)
    assert dict(local.shape) == {"data": 1, "fsdp": 1, "tp": 2, "expert": 2}, local
    params = nnx.state(random_model(CausalLM, cfg, mesh=mesh, std=0.3), nnx.Param)
    copy = multihost.local_copy(params, local)
    for got, want in zip(jax.tree.leaves(copy), jax.tree.leaves(params)):
        assert got.sharding.mesh == local and got.dtype == want.dtype, got.sharding
        whole = sharding.host_array(want)
        for shard in got.addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data), whole[shard.index])
    gate = copy["trunk"]["layers"][0]["mlp"]["gate_weight_edf"][...]
    assert gate.sharding.spec[0] == "expert", gate.sharding
    print(f"experts {gate.sharding.shard_shape(gate.shape)[0]} a device", flush=True)


def agree() -> None:
    """Two checks of the trainer's run fingerprint: first identical everywhere, then with process
    1 on another learning rate, another copy of trainer.py, another eval task list and another
    vocabulary."""
    import types

    import train_cli

    from agentrl_jax.envs.base import Task
    from agentrl_jax.run import build
    from agentrl_jax.run.config import from_config_dict

    def fingerprint(differ: bool):
        config = from_config_dict(train_cli.tiny_config(rl=dict(actor_lr=2e-4 if differ else 1e-4)))
        eval_ids = ["v/0", "v/9" if differ else "v/1"]
        train_tasks = {"simple": [Task("textworld", "train", f"simple/{i}") for i in range(3)]}
        eval_tasks = {"simple": [Task("textworld", "valid", i) for i in eval_ids]}
        tokenizer = types.SimpleNamespace(
            get_vocab=lambda: {"a": 0, "b": 1, "c" if differ else "d": 2},
            all_special_tokens=["<pad>"],
        )
        out = build.fingerprint(config, eval_tasks, train_tasks)
        out["tokenizer"] = build.tokenizer_fingerprint(tokenizer)
        if differ:
            out["code"]["agentrl_jax/run/trainer.py"] = "0" * 16
        return out

    multihost.check_agreement(fingerprint(differ=False))
    print("agreed", flush=True)
    try:
        multihost.check_agreement(fingerprint(differ=jax.process_index() == 1))
    except multihost.DisagreementError as e:
        print(f"multi-host error: {e}", flush=True)
        sys.exit(3)
    print("agreed again", flush=True)


def main() -> None:
    mode, coordinator, count, index = sys.argv[1:5]
    jax.config.update("jax_threefry_partitionable", True)
    jax.distributed.initialize(coordinator, int(count), int(index))
    {"exchange": exchange, "experts": experts, "agree": agree, "play": play}[mode]()


if __name__ == "__main__":
    main()
