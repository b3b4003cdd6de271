"""A run: the configuration, the trainer's assembly and phase loop, checkpoints, multi-host,
the watchdog, TensorBoard, logs and run directories' paths.

Import the modules directly (``agentrl_jax.run.trainer``, ``agentrl_jax.run.config``); this
package imports nothing by itself.
"""
