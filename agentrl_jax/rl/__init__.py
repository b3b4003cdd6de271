"""The learner's math: the resolved RL spec the rest reads (``spec.py``), the chunked LM head, the
jitted learner and its loss terms, RL rows and the RL update, the SFT and ENVRL data pipelines,
and the host-side random streams they draw from.

Import the modules directly (``agentrl_jax.rl.learner``, ``agentrl_jax.rl.rl_update``); this
package imports nothing by itself.
"""
