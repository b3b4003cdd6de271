"""Benchmarks run by ``python -m launch.bench NAME --out FILE.json``.

Each module ``agentrl_jax.benchmarks.<name>`` exposes ``run(quick: bool) -> Report``.
"""
