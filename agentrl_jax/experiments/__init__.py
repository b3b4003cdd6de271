"""Experiments over runs: held-out evaluation and its reports, statistics, studies and the
memory plan.

Import the modules directly (``agentrl_jax.experiments.study``, ``agentrl_jax.experiments.plan``);
this package imports nothing by itself.
"""
