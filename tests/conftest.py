"""Test setup: 8 fake CPU devices (set before jax is imported) and shared fixtures."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pathlib  # noqa: E402

import pytest  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = pathlib.Path(os.environ.get("AGENTRL_SHARED_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> pathlib.Path:
    """../shared/data when present (a user's clone may not have it): tests skip otherwise."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def textworld_games(tmp_path_factory):
    """A few small TextWorld games generated once per session into a tmp cache.

    Returns a dict: ``root`` (the cache root) and task lists ``train`` (3 simple games),
    ``valid`` (1 simple game), ``test`` (1 simple game: the ``:test`` config's report) and
    ``cooking`` (1 tw-cooking game, max score 3).
    """
    from agentrl_jax.envs.textworld import games

    root = tmp_path_factory.getbasetemp() / "agentrl_cache"
    cooking = "tw-cooking:recipe=1,take=1,go=1"
    jobs = [("simple", "train", i) for i in range(3)]
    jobs += [("simple", "valid", 0), ("simple", "test", 0), (cooking, "train", 0)]
    games.generate(jobs, root=root, workers=2, progress=False)  # One parallel batch.
    make = lambda spec, split, n: games.make_tasks(spec, split, n, root=root, progress=False)
    return {
        "root": root,
        "train": make("simple", "train", 3),
        "valid": make("simple", "valid", 1),
        "test": make("simple", "test", 1),
        "cooking": make(cooking, "train", 1),
    }
