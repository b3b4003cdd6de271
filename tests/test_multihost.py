"""Multi-host: which tasks and rows each process owns, and 2 processes x 4 devices == 1 x 8."""

import dataclasses
import os
import socket
import sys
import threading

import jax
import jax.numpy as jnp
import multihost_worker
import numpy as np
import pytest
import train_cli

from agentrl_jax import sharding
from agentrl_jax.envs.base import Task
from agentrl_jax.rollout.curriculum import Curriculum
from agentrl_jax.rollout.rollout import RolloutWorker
from agentrl_jax.run import multihost
from agentrl_jax.run.tensorboard import read_scalars

TOL = 1e-5  # fixed by the issue: f32 max abs diff of the parameters, 2 x 4 devices vs 1 x 8


# ---------------------------------------------------------------- sharding arithmetic


def _slices(num_items, unit, count):
    return [multihost.process_slice(num_items, unit, p, count) for p in range(count)]


def test_process_slice_deals_whole_waves_in_order():
    # 4 tasks in waves of 1 over 2 processes: 2 tasks each, in order.
    assert _slices(4, 1, 2) == [slice(0, 2), slice(2, 4)]
    # 10 tasks in waves of 3 (the last one short: 4 waves) over 3 processes: 2, 1, 1 waves.
    assert _slices(10, 3, 3) == [slice(0, 6), slice(6, 9), slice(9, 10)]
    # Fewer waves than processes: the last processes play nothing.
    assert _slices(3, 2, 4) == [slice(0, 2), slice(2, 3), slice(3, 3), slice(3, 3)]
    assert _slices(0, 2, 2) == [slice(0, 0), slice(0, 0)]
    # One process owns everything.
    assert _slices(7, 3, 1) == [slice(0, 7)]


@pytest.mark.parametrize("num_items", [0, 1, 5, 8, 13])
@pytest.mark.parametrize("unit", [1, 2, 3])
@pytest.mark.parametrize("count", [1, 2, 3, 5])
def test_process_slices_partition_the_items_on_wave_boundaries(num_items, unit, count):
    slices = _slices(num_items, unit, count)
    items = [i for s in slices for i in range(num_items)[s]]
    assert items == list(range(num_items))  # each item once, processes in order
    for s in slices:
        assert s.start % unit == 0 or s.start == num_items  # starts on a wave boundary
    sizes = [-(-(s.stop - s.start) // unit) for s in slices]  # waves per process
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("count", [1, 2, 4])
@pytest.mark.parametrize("capacity", [2, 8, 128])
@pytest.mark.parametrize("group", [1, 2, 8])
@pytest.mark.parametrize("num_tasks", [1, 3, 4, 5, 9, 16, 17, 140])
def test_wave_plans_give_every_process_its_share_of_whole_groups(num_tasks, group, capacity, count):
    if group > capacity:
        return  # the worker refuses a group that does not fit the pool (wave_size)
    per_wave = capacity // group
    plan = multihost.plan_waves(num_tasks, per_wave, count)
    assert len(plan) == count
    # The waves of all processes, in process order, are the tasks in order, each once.
    assert [i for waves in plan for w in waves for i in range(num_tasks)[w]] == list(
        range(num_tasks)
    )
    shares = [sum(w.stop - w.start for w in waves) for waves in plan]
    # Every process plays whenever there is a task for each; shares differ by one task at most.
    assert min(shares) == num_tasks // count and max(shares) - min(shares) <= 1
    assert all(shares) or num_tasks < count
    for waves in plan:
        # Whole groups that fit the pool: a wave's episodes start on a group boundary (the
        # task's first episode) and number at most the capacity; only a share's last is short.
        assert all(0 < (w.stop - w.start) * group <= capacity for w in waves)
        assert all(w.stop - w.start == per_wave for w in waves[:-1])
        # No process plays more waves than its share needs.
        assert len(waves) == -(-sum(w.stop - w.start for w in waves) // per_wave)


def test_wave_plans_deal_the_tasks_in_order():
    # One wave of 16 tasks (a pool of 128 episodes, groups of 8) over 2 processes: 8 tasks each.
    assert multihost.plan_waves(16, 16, 2) == [[slice(0, 8)], [slice(8, 16)]]
    # A 140-task evaluation with waves of 128: 70 each (not 128 + 12), 35 each over 4.
    assert multihost.plan_waves(140, 128, 2) == [[slice(0, 70)], [slice(70, 140)]]
    assert multihost.plan_waves(140, 128, 4) == [[slice(35 * p, 35 * p + 35)] for p in range(4)]
    # A share larger than a wave is cut into full waves, the last one short.
    assert multihost.plan_waves(10, 3, 2) == [
        [slice(0, 3), slice(3, 5)],
        [slice(5, 8), slice(8, 10)],
    ]
    # Fewer tasks than processes: the last processes play nothing.
    assert multihost.plan_waves(2, 4, 4) == [[slice(0, 1)], [slice(1, 2)], [], []]
    with pytest.raises(ValueError, match="per_wave=0"):
        multihost.plan_waves(4, 0, 2)


@pytest.mark.parametrize(
    "args, match",
    [
        ((-1, 1, 0, 1), "num_items=-1"),
        ((4, 0, 0, 1), "unit=0"),
        ((4, 1, 2, 2), r"process_index=2 is not in \[0, process_count=2\)"),
        ((4, 1, 0, 0), "process_count=0"),
    ],
)
def test_process_slice_errors_name_the_bad_value(args, match):
    with pytest.raises(ValueError, match=match):
        multihost.process_slice(*args)


def _pretend_two_processes(device):
    """The 8 fake devices as 2 hosts of 4: devices 0-3 on process 0, 4-7 on process 1."""
    return jax.devices().index(device) // 4


@pytest.mark.parametrize(
    "mesh_shape, num_rows, expected",
    [
        # Rows over (data, fsdp) = 8 devices: each process holds the 4 rows of its 4 devices.
        ((4, 2, 1), 8, {0: range(0, 4), 1: range(4, 8)}),
        ((4, 2, 1), 16, {0: range(0, 8), 1: range(8, 16)}),
        # tp replicates rows: (data, fsdp) = (2, 2), process p holds data block p.
        ((2, 2, 2), 8, {0: range(0, 4), 1: range(4, 8)}),
        # 6 rows do not divide over 8 devices: replicated, so both processes hold all rows.
        ((8, 1, 1), 6, {0: range(0, 6), 1: range(0, 6)}),
    ],
)
def test_process_rows_match_the_placed_global_batch(mesh_shape, num_rows, expected):
    mesh = sharding.make_mesh(mesh_shape)
    shape = (num_rows, 5)
    rows = multihost.process_rows(mesh, ("batch", None), shape, _pretend_two_processes)
    assert {p: r.tolist() for p, r in rows.items()} == {p: list(r) for p, r in expected.items()}
    # What place_batch really puts on each device lies within its process's rows.
    batch = np.arange(num_rows * 5, dtype=np.int32).reshape(shape)
    placed = jax.device_put(batch, sharding.named_sharding(mesh, ("batch", None), shape))
    held = {0: set(), 1: set()}
    for shard in placed.addressable_shards:
        owned = batch[shard.index][:, 0] // 5
        held[_pretend_two_processes(shard.device)].update(owned.tolist())
        np.testing.assert_array_equal(np.asarray(shard.data), batch[shard.index])
    assert {p: sorted(h) for p, h in held.items()} == {p: list(r) for p, r in expected.items()}


def test_sampler_mesh_gives_routed_experts_the_devices_left_after_tp():
    """A dense model keeps its (d, 1, tp) sampler mesh; a model with routed experts gets
    (d, 1, tp, e), the devices left after tp going to ``expert`` as far as they divide its
    experts."""
    from agentrl_jax.models.config import PRESETS, ModelConfig

    # Dense: the shape before experts had an axis, for every dense preset and host size.
    assert multihost.sampler_mesh_shape(PRESETS["qwen2.5-0.5b"], 8) == (4, 1, 2)  # 2 kv heads
    assert multihost.sampler_mesh_shape(PRESETS["qwen2.5-7b"], 8) == (2, 1, 4)
    assert multihost.sampler_mesh_shape(PRESETS["qwen3-8b"], 16) == (2, 1, 8)
    for name, cfg in PRESETS.items():
        if cfg.num_experts:
            continue
        for n in range(1, 17):
            heads = [t for t in range(1, n + 1) if cfg.num_heads % t == cfg.num_kv_heads % t == 0]
            tp = max(t for t in heads if n % t == 0)
            assert multihost.sampler_mesh_shape(cfg, n) == (n // tp, 1, tp), (name, n)
    # Qwen3-30B-A3B (32 query, 4 kv heads, 128 experts): tp = 4, the rest on experts.
    moe = PRESETS["qwen3-30b-a3b"]
    assert multihost.sampler_mesh_shape(moe, 8) == (1, 1, 4, 2)
    assert multihost.sampler_mesh_shape(moe, 16) == (1, 1, 4, 4)
    assert multihost.sampler_mesh_shape(moe, 4) == (1, 1, 4, 1)  # nothing left over
    assert multihost.sampler_mesh_shape(moe, 1) == (1, 1, 1, 1)
    # A tiny MoE (4 query, 2 kv heads: tp = 2 of 8 devices, 4 left): the largest divisor of the
    # 4 that divides its experts takes them, the rest take rows.
    tiny = ModelConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=1, num_heads=4,
        num_kv_heads=2, head_dim=8, family="qwen3_moe", attention_bias=False, qk_norm=True,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
    )  # fmt: skip
    assert multihost.sampler_mesh_shape(tiny, 8) == (1, 1, 2, 4)
    assert multihost.sampler_mesh_shape(tiny.replace(num_experts=6), 8) == (2, 1, 2, 2)
    assert multihost.sampler_mesh_shape(tiny.replace(num_experts=3), 8) == (4, 1, 2, 1)
    assert multihost.sampler_mesh_shape(tiny, 2) == (1, 1, 2, 1)


def test_multi_host_plan_holds_each_expert_once_per_host():
    """``launch.plan --local_devices=8`` for Qwen3-30B-A3B (abstract, nothing allocated): one
    host's sampler mesh is (1, 1, 4, 2) and its bf16 copy holds 64 of the 128 experts a device,
    each expert once on the host, where the (2, 1, 4) mesh held every expert on each row."""
    from flax import nnx

    from agentrl_jax.experiments import plan
    from agentrl_jax.models import registry
    from agentrl_jax.models.config import PRESETS

    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (tests/conftest.py fakes 8 CPU devices)")
    cfg = PRESETS["qwen3-30b-a3b"].replace(dtype=jnp.bfloat16)
    family = registry.family(cfg)
    policy = nnx.state(nnx.eval_shape(lambda: family.policy(cfg, rngs=nnx.Rngs(0))), nnx.Param)
    learner = sharding.make_mesh((1, 4, 1, 2))
    local, copy, owned = plan.sampler_copy(cfg, policy, learner, local_devices=8)
    assert owned and dict(local.shape) == dict(data=1, fsdp=1, tp=4, expert=2)
    gate = copy["trunk"]["layers"]["mlp"]["gate_weight_edf"].get_value()  # scanned: [L, E, D, F]
    assert gate.dtype == jnp.bfloat16
    assert (gate.sharding.spec[1], gate.sharding.spec[3]) == ("expert", "tp")
    assert gate.sharding.shard_shape(gate.shape) == (48, 128 // 2, 2048, 768 // 4)
    rows = sharding.make_mesh((2, 1, 4))  # the three-axis sampler mesh of before
    before = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        copy,
        sharding.leaf_shardings(copy, rows),
    )
    ratio = plan.device_bytes(before) / plan.device_bytes(copy)
    print(f"Qwen3-30B-A3B's bf16 copy a device: {plan.device_bytes(copy) / 2**30:.2f} GiB on "
          f"(1, 1, 4, 2), {plan.device_bytes(before) / 2**30:.2f} GiB on (2, 1, 4)")  # fmt: skip
    assert 1.8 < ratio < 2  # the experts (most of the bytes) halved; the rest as before


def test_payloads_are_padded_to_powers_of_two():
    sizes = [0, 1, 2, 3, 4, 5, 4095, 4096, 4097]
    assert [multihost.payload_bucket(n) for n in sizes] == [1, 1, 2, 4, 4, 8, 4096, 4096, 8192]


def test_single_process_collectives_are_local():
    assert multihost.is_primary()
    assert multihost.allgather_objects({"a": [1, 2]}) == [{"a": [1, 2]}]
    assert multihost.broadcast_object(lambda: "tok") == "tok"
    x = jax.numpy.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(sharding.host_array(x), np.arange(6.0).reshape(2, 3))


# ---------------------------------------------------------------- waves play the same anywhere


@pytest.fixture(scope="module")
def worker_parts(tmp_path_factory):
    return multihost_worker.worker_parts(tmp_path_factory.mktemp("tok"))


_played = multihost_worker.played


def test_each_process_plays_its_waves_as_the_whole_list_would(worker_parts):
    tasks = [Task("scripted", "train", str(i)) for i in range(5)]
    rng = jax.random.key(3)
    whole = RolloutWorker(*worker_parts).run(tasks, rng)
    assert [t.group for t in whole] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    # Sampled actions differ between waves (the test would be vacuous otherwise).
    assert len({tuple(map(tuple, p[2])) for p in _played(whole)}) > 2
    # Process p of 2 plays waves (1 task each, the pool holds one group of 2) 0-2 or 3-4; in a
    # single process the gather returns only its own episodes, so each part can be compared.
    parts = []
    for p in range(2):
        process = multihost.ProcessInfo(index=p, count=2)
        sharded = multihost.ShardedRolloutWorker(*worker_parts, process=process)
        assert sharded.capacity == 2  # this process's pool (its slots)
        parts += sharded.run(tasks, rng)
    assert _played(parts) == _played(whole)


def test_an_episode_plays_the_same_in_any_wave_and_on_any_process(worker_parts):
    """Episodes are keyed by their task's place in the list: waves of 2 tasks (a pool of 4
    episodes: waves 0-1, 2-3, 4) or of 1, and the shares of 2 or 4 processes (tasks 0-2 and
    3-4; 0-1, 2, 3, 4) play the same episodes. (Batches of 2 and 4 rows only: the programs the
    test before this one compiled, or few more.)"""
    _, *rest = worker_parts
    tasks = [Task("scripted", "train", str(i)) for i in range(5)]
    rng = jax.random.key(4)
    whole = RolloutWorker(multihost_worker.CountingPool(4), *rest).run(tasks, rng)
    assert [t.group for t in whole] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert len({tuple(map(tuple, p[2])) for p in _played(whole)}) > 2  # not vacuous
    waves = RolloutWorker(multihost_worker.CountingPool(2), *rest).run(tasks, rng)
    assert _played(waves) == _played(whole)
    for count in (2, 4):
        parts = []
        for p in range(count):
            process = multihost.ProcessInfo(index=p, count=count)
            sharded = multihost.ShardedRolloutWorker(
                multihost_worker.CountingPool(4), *rest, process=process
            )
            mine = sharded.run(tasks, rng)  # one process: the gather returns only its own
            assert mine, (count, p)  # every process of 2 or 4 plays some of the 5 tasks
            parts += mine
        assert _played(parts) == _played(whole), count


def test_continuous_batching_streams_a_process_share_through_its_own_pool(worker_parts):
    """``rollout.batching='continuous'`` on each of 2 processes with pools of 4: a process's 3
    or 2 tasks (6 or 4 episodes) stream through its own pool's 4 slots, 2 cohorts of 2 rows,
    never the 8 slots of both pools (slot 4 would be outside its pool), and play the episodes
    of one process's waves."""
    _, *rest, config = worker_parts
    stream = dataclasses.replace(config, batching="continuous", cohorts=2)
    tasks = [Task("scripted", "train", str(i)) for i in range(5)]
    rng = jax.random.key(5)
    whole = RolloutWorker(multihost_worker.CountingPool(4), *rest, config).run(tasks, rng)
    assert len({tuple(map(tuple, p[2])) for p in _played(whole)}) > 2  # not vacuous
    parts = []
    for p in range(2):
        pool = multihost_worker.CountingPool(4)
        process = multihost.ProcessInfo(index=p, count=2)
        sharded = multihost.ShardedRolloutWorker(pool, *rest, stream, process=process)
        parts += sharded.run(tasks, rng)  # one process: the gather returns only its own
        assert pool.played == (6, 4)[p]
    assert _played(parts) == _played(whole)


class _GatherSpy(multihost.ShardedRolloutWorker):
    """A process's worker that records the thread of every gather (a cross-process collective)."""

    threads: list[str]

    def gather(self, played):
        self.threads.append(threading.current_thread().name)
        return super().gather(played)


def test_async_rl_gathers_the_rollout_played_ahead_on_the_main_thread(worker_parts):
    """``rl.max_staleness=1`` on process 0 of 2: the background thread plays the process's
    share only; its episodes are gathered on the main thread once the update is done, so no
    collective ever runs beside the update's (whose order must be the same on every host).
    Each update trains on the gathered episodes of its own iteration."""
    from agentrl_jax.run.config import from_config_dict
    from agentrl_jax.run.state import RunState
    from agentrl_jax.run.trainer import Trainer

    pool, sampler, tok, template, config = worker_parts
    worker = _GatherSpy(pool, sampler, tok, template, config, process=multihost.ProcessInfo(0, 2))
    worker.threads = []
    run_config = from_config_dict(
        train_cli.tiny_config("test", rl=dict(max_staleness=1)), num_devices=1
    )
    weights = sampler.state  # borrowed by every rollout (set_state), released after it
    trainer = Trainer.__new__(Trainer)  # only what async_iteration reads
    trainer.config, trainer.worker, trainer.sampler = run_config, worker, sampler
    trainer.curriculum = Curriculum(run_config.curriculum)
    trainer.pending = {}
    trainer.run_state = RunState(phase="rl")
    trainer.__dict__["rl_tasks"] = {
        level: [Task("scripted", "train", str(i)) for i in range(5)]
        for level in run_config.env.train_levels
    }
    trainer.num_rl_iterations = lambda: 3
    trainer._sync_sampler = lambda copy=False: sampler.set_state(weights)
    learned = []

    def learn(it, trajs, np_rng, seconds):
        learned.append((it, threading.current_thread().name, [t.group for t in trajs]))
        return {}

    trainer._learn = learn
    try:
        metrics = [trainer.async_iteration(it) for it in range(3)]
    finally:
        trainer._background.shutdown(wait=True)
        sampler.set_state(weights)  # the module's other tests share the sampler
    # Iteration 0's rollout in the foreground, those of iterations 1 and 2 in the background.
    assert ["time/rollout_wait_s" in m for m in metrics] == [True, True, False]
    assert worker.threads == ["MainThread"] * 3
    # Process 0's share (the first of 2 tasks per iteration: group 0), gathered.
    assert learned == [(it, "MainThread", [0, 0]) for it in range(3)]


# ---------------------------------------------------------------- small multi-process checks


def _free_port() -> int:
    """A free TCP port for the coordinator."""
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return probe.getsockname()[1]


def _run_workers(mode, tmp_path, count=2, devices=2, timeout=120, **env):
    """``count`` processes of ``tests/multihost_worker.py MODE`` (``devices`` fake CPU devices
    each); returns each one's (exit status, output)."""
    worker = os.path.join(os.path.dirname(__file__), "multihost_worker.py")
    coordinator = f"localhost:{_free_port()}"
    procs = [
        train_cli.start(
            [sys.executable, worker, mode, coordinator, str(count), str(p)],
            tmp_path,
            tmp_path / f"{mode}.{p}.log",
            devices=devices,
            **env,
        )
        for p in range(count)
    ]
    return train_cli.wait_all(*procs, timeout=timeout)


# Episodes each process plays of each call in tests/multihost_worker.py's ``play`` (pools of 8,
# groups of 2): RL iterations of 4 and 6 tasks, 5 demonstrations and 9 greedy evaluation tasks,
# each dealt out evenly in whole tasks.
SHARES = {
    2: {
        "iteration_0": [4, 4],
        "iteration_1": [6, 6],
        "demonstrations": [3, 2],
        "evaluation": [5, 4],
    },
    4: {
        "iteration_0": [2, 2, 2, 2],
        "iteration_1": [4, 4, 2, 2],
        "demonstrations": [2, 1, 1, 1],
        "evaluation": [3, 2, 2, 2],
    },
}


@pytest.mark.slow
@pytest.mark.parametrize("count", [2, 4])
def test_every_process_plays_its_share_of_every_call(tmp_path, count):
    """Each process plays its share of every RL iteration, the demonstrations and an uneven
    evaluation, and the gathered results are a single process's."""
    results = _run_workers("play", tmp_path, count=count, timeout=600)
    for p, (code, text) in enumerate(results):
        assert code == 0, text[-3000:]
        played = {
            line.split()[1]: int(line.split()[2])
            for line in text.splitlines()
            if line.startswith("played ")
        }
        assert played == {name: shares[p] for name, shares in SHARES[count].items()}, text
    assert "same as one process" in results[0][1], results[0][1][-3000:]


def test_exchanges_compile_once_not_every_iteration(tmp_path):
    """Episodes of a new byte length every iteration and the sampler's replica refresh reuse
    their programs: after the first iteration, no exchange compiles anything."""
    for code, text in _run_workers("exchange", tmp_path):
        assert code == 0, text[-3000:]
        compiles = [
            int(line.split()[2]) for line in text.splitlines() if line.startswith("compiles")
        ]
        assert len(compiles) == 6, text[-3000:]
        assert compiles[0] > 0  # the first exchange compiles its programs (the check can see)
        assert compiles[1:] == [0] * 5, compiles


def test_each_process_copies_the_experts_to_its_own_expert_axis(tmp_path):
    """Two processes of 4 devices, a tiny Qwen3-MoE's parameters split over all 8 (mesh
    (1, 2, 1, 4): experts 4 ways, the model width over the processes): each process's copy
    (``multihost.local_copy``) is on its own (1, 1, 2, 2) local mesh, the 8 experts 4 a
    device, each device's shard the whole array's block bit for bit."""
    for code, text in _run_workers("experts", tmp_path, devices=4):
        assert code == 0, text[-3000:]
        assert "experts 4 a device" in text, text[-3000:]


def test_processes_that_disagree_stop_naming_what_differs(tmp_path):
    lines = []
    for code, text in _run_workers("agree", tmp_path):
        assert code == 3, text[-3000:]
        assert "agreed\n" in text and "agreed again" not in text
        lines.append(next(ln for ln in text.splitlines() if ln.startswith("multi-host error")))
    # Every process stops, with the same message naming each part and key that differs.
    assert lines[0] == lines[1]
    line = lines[0]
    for part in (
        "config: rl.actor_lr (0.0001 vs 0.0002)",
        "code: agentrl_jax/run/trainer.py (",
        "tasks: eval simple (",
        "tokenizer: vocabulary (",
    ):
        assert f"process 1 differs from process 0 in {part}" in line, (part, line)
    assert "train simple" not in line and "special tokens" not in line


def test_disagreements_name_parts_keys_and_both_values():
    same = {"config": {"seed": "0", "rl.algo": "'grpo'"}, "code": {"a.py": "1"}}
    other = {"config": {"seed": "1", "rl.algo": "'grpo'"}, "code": {"a.py": "1", "b.py": "2"}}
    assert multihost.disagreements([same, same, same]) == []
    assert multihost.disagreements([same, same, other]) == [
        "process 2 differs from process 0 in code: b.py (missing vs 2)",
        "process 2 differs from process 0 in config: seed (0 vs 1)",
    ]
    many = {"config": {f"k{i}": str(i) for i in range(5)}}
    (line,) = multihost.disagreements([many, {"config": {}}], show=2)
    assert line.endswith("k0 (0 vs missing), k1 (1 vs missing) and 3 more")
    multihost.check_agreement(same)  # one process: nothing to compare


def test_code_fingerprint_covers_the_package():
    code = multihost.code_fingerprint()
    assert "agentrl_jax/run/trainer.py" in code and "agentrl_jax/__init__.py" in code
    assert all(len(h) == 16 for h in code.values())


# ---------------------------------------------------------------- 2 processes x 4 == 1 x 8

# The test config with a batch that spans the 8 devices: a (4, 2, 1) mesh (rows over data and
# fsdp, parameters split over fsdp), minibatches of 8 rows (one per device), 4 tasks x 2 episodes
# per RL iteration played in waves of one task (pool of 2), 4 demonstrations (2 SFT epochs of one
# batch of 8), 2 RL iterations with an entropy bonus so that the updates move the parameters.
# The 4 demonstrations reuse the config's 2 train games, so RL draws from all of them.
OVERRIDES = (
    "--config.mesh=(4,2,1)",
    "--config.rl.task_pool=all",
    "--config.env.num_workers=1",
    "--config.rl.tasks_per_iteration=4",
    "--config.rl.minibatch_size=8",
    "--config.rl.entropy_coef=0.01",
    "--config.sft.batch_size=8",
    "--config.budget.total=60",
    "--config.budget.sft_fraction=0.7",
)


def _checkpoint_params(workdir, step=None):
    """(step, {path: array}) of the policy parameters in a run's checkpoint (default: newest)."""
    import orbax.checkpoint as ocp

    directory = workdir / "checkpoints"
    steps = sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())
    step = steps[-1] if step is None else step
    path = directory / str(step) / "state"
    with ocp.PyTreeCheckpointer() as ckpt:
        tree = ckpt.metadata(path).item_metadata.tree
        args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
        state = ckpt.restore(path, restore_args=args)
    flat = jax.tree_util.tree_leaves_with_path(state["train"]["policy"])
    return step, {jax.tree_util.keystr(k): np.asarray(v) for k, v in flat}


def _max_diff(a, b):
    assert a.keys() == b.keys()
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


# LoRA for the RL phase (rank 4, dropout, the base in bf16): the adapters, their dropout masks and
# the PEFT export across two processes. Dropout takes a loss without PPO's ratio (run/config.py).
LORA = (
    "--config.model.lora.rank=4",
    "--config.model.lora.dropout=0.1",
    "--config.model.lora.base_dtype=bfloat16",
    "--config.rl.loss=pg",
)


# Continuous batching: each process streams its 4 tasks of an RL iteration (8 episodes) through
# its own pool of 4 slots, 2 cohorts of 2 rows (8 tasks per iteration, so that a share outgrows
# a cohort; the budget then pays the same 4 demonstrations and 2 iterations of 16 episodes).
CONTINUOUS = (
    "--config.rollout.batching=continuous",
    "--config.rollout.cohorts=2",
    "--config.env.envs_per_worker=4",
    "--config.rl.tasks_per_iteration=8",
    "--config.budget.total=80",
    "--config.budget.sft_fraction=0.5",
)
# Asynchronous RL: iteration 2's rollout is played in the background during iteration 1's update
# (each process its share), then gathered on the main thread.
ASYNC = ("--config.rl.max_staleness=1", "--config.rl.off_policy_correction=tis")
VARIANTS = {"full": (), "lora": LORA, "continuous": CONTINUOUS, "async": ASYNC}


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_two_processes_of_four_devices_train_like_one_process_of_eight(
    textworld_games, tmp_path, variant
):
    cache = textworld_games["root"]
    one, two = tmp_path / "one", tmp_path / "two"
    overrides = OVERRIDES + VARIANTS[variant]
    lora = variant == "lora"
    train_cli.finish(
        train_cli.start(
            train_cli.train_cmd(one, *overrides), cache, tmp_path / "one.log", devices=8
        ),
        timeout=900,
    )

    flags = (f"--coordinator_address=localhost:{_free_port()}", "--num_processes=2")
    procs = [
        train_cli.start(
            train_cli.train_cmd(two, *overrides, *flags, f"--process_id={p}"),
            cache,
            tmp_path / f"two.{p}.log",
            devices=4,
        )
        for p in range(2)
    ]
    text0, text1 = train_cli.finish(*procs, timeout=900)

    # The same checkpoints, and the newest one's parameters equal the single process's.
    step_one, params_one = _checkpoint_params(one)
    step_two, params_two = _checkpoint_params(two)
    assert step_one == step_two == 3  # SFT epoch 1, after SFT, RL iterations 1 and 2
    diff = _max_diff(params_one, params_two)
    print(f"max abs diff of the policy parameters, 2 x 4 vs 1 x 8: {diff:.3g}")
    assert diff <= TOL
    # Not vacuous: RL moved the parameters (2 Adam steps of 2e-4: about 4e-4) far beyond TOL.
    _, after_sft = _checkpoint_params(two, step=1)
    if lora:  # the adapters (B from zero) moved; the SFT state holds none
        assert max(np.abs(v).max() for k, v in params_two.items() if "_lora_b" in k) > 10 * TOL
        # The PEFT export gathers the adapters across the processes: process 0's file equals
        # the single process's.
        from safetensors.numpy import load_file

        want = load_file(one / "adapter" / "adapter_model.safetensors")
        got = load_file(two / "adapter" / "adapter_model.safetensors")
        assert want.keys() == got.keys() and _max_diff(want, got) <= TOL
    else:
        assert _max_diff(after_sft, params_two) > 10 * TOL

    # The same episodes and updates, logged once by process 0.
    ref, got = read_scalars(str(one / "tensorboard")), read_scalars(str(two / "tensorboard"))
    for tag in (
        "sft/nll",
        "rollout/episodes",
        "rollout/return",
        "rollout/tokens_per_episode",
        "rollout/episode_length",
        "losses/entropy",
        "train/grad_norm",
    ):
        want, have = np.array(ref[tag]), np.array(got[tag])
        assert want.shape == have.shape and np.abs(want - have).max() <= TOL, (tag, want, have)
    episodes = 16.0 if variant == "continuous" else 8.0
    assert ref["rollout/episodes"] == [(1, episodes), (2, episodes)]
    if variant == "async":  # iteration 2 trained on the rollout played beside update 1
        assert ref["rollout/staleness"] == got["rollout/staleness"] == [(1, 0.0), (2, 1.0)]
    events = [n for n in os.listdir(two / "tensorboard") if "tfevents" in n]
    assert len(events) == 1, events
    # Only process 0 reports.
    assert "| simple@test |" in text0 and "| simple@test |" not in text1  # the report table
    assert "evaluation after_rl done" in text0 and "evaluation after_rl" not in text1
