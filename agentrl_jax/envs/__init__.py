"""Text environments (TextWorld, ALFWorld), the env contract and the host-side actor pool.

Import the pieces directly (``agentrl_jax.envs.textworld.env``, ``agentrl_jax.envs.actors``);
this package imports no engine by itself, so importing one env never pays for the others.
"""
