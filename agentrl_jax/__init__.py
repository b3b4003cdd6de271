"""agentrl_jax: JAX-native multi-turn reinforcement learning for LLM agents.

Each subpackage is a small library with one job that can be imported alone:

- ``agentrl_jax.models``: Qwen2-family decoders in flax.nnx, Hugging Face checkpoints, tokenizers.
- ``agentrl_jax.sharding``: the logical-axis rules and the device mesh.
- ``agentrl_jax.sampling``: jitted multi-turn generation over a kept KV cache.
- ``agentrl_jax.training``: rollouts, the learner, the trainer, checkpoints and metrics.
- ``agentrl_jax.kernels``: advantage estimators and losses (pure functions of arrays).
- ``agentrl_jax.envs``: TextWorld and ALFWorld environments and the host-side actor pool.
- ``agentrl_jax.swe``: SWE-Gym-style bug-fix tasks in a sandbox.
"""

__version__ = "0.1.0"
