"""Task sources: train and evaluation splits never overlap, for every env family."""

import json

import pytest

from agentrl_jax.rollout.tasks import make_tasks, parse_level

RECORD = {
    "repo": "local/toy",
    "base_commit": "abc",
    "problem_statement": "a test fails",
    "patch": "",
    "test_patch": "",
    "FAIL_TO_PASS": ["tests/test_x.py::test_a"],
    "PASS_TO_PASS": [],
}


def test_swe_splits_are_a_disjoint_fixed_partition(tmp_path):
    path = tmp_path / "tasks.jsonl"
    with open(path, "w") as f:
        for i in range(50):
            repo = "local/toy" if i % 2 else "local/other"
            f.write(json.dumps({**RECORD, "instance_id": f"toy__{i}", "repo": repo}) + "\n")
    kwargs = {"path": str(path)}
    train = make_tasks("swe", "all", "train", 1000, kwargs)
    evaluation = make_tasks("swe", "all", "eval", 1000, kwargs)
    assert len(train) + len(evaluation) == 50 and 3 <= len(evaluation) <= 20
    assert not {t.id for t in train} & {t.id for t in evaluation}
    assert make_tasks("swe", "all", "eval", 1000, kwargs) == evaluation  # stable
    toy = make_tasks("swe", "local/toy", "train", 1000, kwargs)
    assert toy and all(int(t.id.split("__")[1]) % 2 for t in toy)
    with pytest.raises(ValueError, match="config.env.kwargs.path is missing"):
        make_tasks("swe", "all", "train", 1, {})


def test_alfworld_levels_are_task_types_and_splits_are_the_benchmarks(shared_data):
    kwargs = {"data_dir": str(shared_data / "alfworld")}
    heat = make_tasks("alfworld", "pick_heat_then_place_in_recep", "valid_unseen", 1000, kwargs)
    assert heat and all(t.id.startswith("pick_heat_then_place_in_recep") for t in heat)
    assert len(make_tasks("alfworld", "all", "valid_unseen", 1000, kwargs)) == 134
    assert len(make_tasks("alfworld", "all", "valid_seen", 1000, kwargs)) == 140


def test_spread_order_prefixes_cover_the_range_evenly():
    from agentrl_jax.envs.alfworld.data import spread_order

    for n in (0, 1, 2, 5, 8, 13, 3553):
        order = spread_order(n)
        assert sorted(order) == list(range(n))
        for k in (1, 2, 4, 8):  # every prefix of k holds one index of each k-th of the range
            if k <= n and n % k == 0:
                assert sorted(i * k // n for i in order[:k]) == list(range(k))


def test_alfworld_first_train_tasks_span_every_type(shared_data):
    """A run's first train tasks (its demonstrations) hold every task type in about its share
    of the split; the sorted ids would give ``look_at_obj_in_light`` alone."""
    from collections import Counter

    from agentrl_jax.envs.alfworld.data import task_type_of

    kwargs = {"data_dir": str(shared_data / "alfworld")}
    every = make_tasks("alfworld", "all", "train", 10_000, kwargs)
    first = make_tasks("alfworld", "all", "train", 60, kwargs)
    assert first == every[:60] and len({t.id for t in every}) == len(every) == 3553
    share = Counter(task_type_of(t.id) for t in every)
    counts = Counter(task_type_of(t.id) for t in first)
    assert set(counts) == set(share)
    for kind, n in counts.items():
        assert abs(n - 60 * share[kind] / 3553) <= 2, (kind, n, share[kind])


def test_textworld_train_and_eval_games_differ(textworld_games, monkeypatch):
    monkeypatch.setenv("AGENTRL_CACHE", str(textworld_games["root"]))
    train = make_tasks("textworld", "simple", "train", 3)
    valid = make_tasks("textworld", "simple", "valid", 1)
    assert {t.param("seed") for t in train}.isdisjoint({t.param("seed") for t in valid})


def test_level_may_name_its_split():
    assert parse_level("all@valid_seen", "valid_unseen") == ("all", "valid_seen")
    assert parse_level("simple", "valid") == ("simple", "valid")


def test_unknown_env_lists_the_valid_ones():
    with pytest.raises(ValueError, match="valid names: alfworld, .*swe, .*textworld"):
        make_tasks("nethack", "all", "train", 1)


def test_the_built_in_families_task_sources_live_beside_their_envs():
    """Each built-in family's task source and hooks live in its own subpackage of envs/, which
    the registry names by import path (it imports no family)."""
    from agentrl_jax.envs import registry
    from agentrl_jax.envs.alfworld import data as alfworld_data
    from agentrl_jax.envs.swe import tasks as swe_tasks
    from agentrl_jax.envs.textworld import games

    for name, module in (("textworld", games), ("alfworld", alfworld_data), ("swe", swe_tasks)):
        family = registry.family(name)
        for field in ("make_tasks", "task_type", "prepare", "walkthrough"):
            path = getattr(family, field)
            assert not path or path.partition(":")[0] == module.__name__, (name, field, path)
            if path:
                assert family.hook(field) is getattr(module, path.partition(":")[2])
