"""Episodes and their prompts: the rollout worker and its waves, trajectories, the curriculum,
task sources and chat templates.

Import the modules directly (``agentrl_jax.rollout.rollout``, ``agentrl_jax.rollout.tasks``);
this package imports nothing by itself.
"""
