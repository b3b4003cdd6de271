r"""Generates TextWorld games into the on-disk cache (reused by later runs and by the envs).

    python -m launch.make_games --spec=simple --split=train --count=100
    python -m launch.make_games --spec=custom:6,10,5 --split=valid --count=20 --workers=2
    python -m launch.make_games --spec=tw-cooking:recipe=2,take=1,go=6,open,cut --count=10
    python -m launch.make_games --spec=tw-coin_collector:level=5 --split=test --count=10

Specs: simple | medium | hard | custom:ROOMS,OBJECTS,QUEST_LENGTH | tw-coin_collector:level=N |
tw-treasure_hunter:level=N | tw-cooking:<tw-make settings>. The cache root is --cache_dir, else
$AGENTRL_CACHE, else ~/.cache/agentrl_jax.
"""

from absl import app, flags

from agentrl_jax.envs.textworld import games

_SPEC = flags.DEFINE_string("spec", "simple", "Game spec (see the module docstring).")
_SPLIT = flags.DEFINE_enum("split", "train", list(games.SPLITS), "Which seed range.")
_COUNT = flags.DEFINE_integer("count", 10, "How many games.", lower_bound=1)
_START = flags.DEFINE_integer("start", 0, "Index of the first game.", lower_bound=0)
_WORKERS = flags.DEFINE_integer("workers", None, "Generator processes (default: core count).")
_CACHE_DIR = flags.DEFINE_string("cache_dir", None, "Cache root (default: $AGENTRL_CACHE).")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    try:
        spec = games.parse_spec(_SPEC.value)
    except ValueError as e:
        raise app.UsageError(str(e)) from None
    paths = games.make_games(
        spec,
        _SPLIT.value,
        _COUNT.value,
        start=_START.value,
        root=_CACHE_DIR.value,
        workers=_WORKERS.value,
    )
    root = _CACHE_DIR.value or games.cache_dir()
    print(f"{len(paths)} {spec.name} games ({_SPLIT.value}) ready under {root}")


if __name__ == "__main__":
    app.run(main)
