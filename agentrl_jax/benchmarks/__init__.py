"""Benchmarks run by ``python -m launch.bench NAME --out FILE.json``.

Each module ``agentrl_jax.benchmarks.<name>`` named in ``launch/bench.py`` exposes
``run(quick: bool) -> Report``; ``report.py`` is their report, ``alfworld.py`` ALFWorld's rows of
``envs``.
"""
