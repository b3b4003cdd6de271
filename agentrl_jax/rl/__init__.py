"""The learner's math: the chunked LM head, the jitted learner, RL rows and the RL update, the
SFT and ENVRL data pipelines, and the host-side random streams they draw from.

Import the modules directly (``agentrl_jax.rl.learner``, ``agentrl_jax.rl.rl_update``); this
package imports nothing by itself.
"""
