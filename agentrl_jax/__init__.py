"""agentrl_jax: JAX-native multi-turn reinforcement learning for LLM agents.

The public API is the names below (``__all__``), imported from the top level::

    import agentrl_jax as arl

    if __name__ == "__main__":  # in a script: the env workers import the main module again
        cd = arl.load_config_file("configs/tiny_textworld.py:smoke")  # as --config= reads it
        cd.rl.algo = "gagpo"                                            # as --config.rl.algo=
        trainer = arl.Trainer(arl.from_config_dict(cd, num_devices=1), "runs/demo")
        evals = trainer.run()                                           # SFT, then RL; resumes

A script must keep the ``if __name__ == "__main__":`` block: the env actor pool starts its worker
processes through multiprocessing's forkserver, which imports the main module again, so code
that builds a Trainer (or an ActorPool) at import time would run again in every worker (the
pool's error names this). Notebooks and ``python -c`` need no block.

Everything not listed in ``__all__`` is internal and may change without notice, including the
subpackages' own modules (``agentrl_jax.rl.learner``, ``agentrl_jax.envs.actors``, ...);
the ``kernels`` namespace is public as a whole (its own ``__all__``). Names are imported lazily
(PEP 562), so ``import agentrl_jax`` does not import JAX; the first use of a name imports its
module.

Training and configuration:

- ``Trainer``: runs SFT then RL for a RunConfig in a workdir (TensorBoard, checkpoints, reports).
- ``RunConfig``: the frozen, validated run configuration.
- ``ConfigError``: a configuration value is invalid (the message names the field).
- ``base_config``: the defaults every ``configs/*.py`` starts from (an ml_collections ConfigDict).
- ``load_config_file``: the ConfigDict of ``"configs/x.py:arg"``, as ``--config=`` reads it.
- ``from_config_dict``: validates a ConfigDict (importing ``config.plugins``) into a RunConfig.

Credit assignment and losses (see docs/algorithms.md and docs/custom_losses.md):

- ``kernels``: every estimator, loss and helper (``episode_returns``, ``aggregate``, ...).
- ``register_advantage_estimator``: adds an estimator selectable as ``config.rl.algo``.
- ``register_policy_loss``: adds a policy loss selectable as ``config.rl.loss``.
- ``advantage_estimators``: the registered estimator names.
- ``policy_losses``: the registered policy loss names.
- ``Batch``: the padded trajectory batch an estimator reads.
- ``Advantages``: what an estimator returns (token, step advantages; returns).
- ``AdvantageConfig``: gamma, lambda and the other estimator settings.
- ``LossConfig``: clip ranges, ratio level and aggregation of the losses.
- ``Weighted``: a (numerator, denominator) loss or metric.

Models, tokenizers and sampling:

- ``ModelConfig``: a decoder's shape, numerics and family (Qwen2, Qwen3, Llama 3, Gemma 3).
- ``preset``: a named ModelConfig (``"tiny"``, ``"qwen2.5-0.5b"``, ...) with overrides.
- ``CausalLM``: the policy (flax.nnx).
- ``ValueModel``: the critic (the policy's trunk with a scalar head).
- ``load_hf_model``: a checkpoint of a registered family from a local Hugging Face directory.
- ``save_hf_checkpoint``: writes a model back in the Hugging Face format.
- ``load_tokenizer``: a tokenizer from a local directory (a checkpoint's or a built one).
- ``build_tokenizer``: trains the built-in byte-level BPE on environment text.
- ``Sampler``: jitted multi-turn generation over a KV cache kept between turns.
- ``SamplingParams``: temperature, top-k, top-p (``temperature=0``: greedy).
- ``StopConfig``: the stop (end-of-turn) token ids.

Environments and results:

- ``Env``: the environment contract (``reset(task)``, ``step(action_text)``).
- ``Task``: one task instance (env family, split, id, parameters).
- ``Observation``: what an environment shows the agent.
- ``make_env``: builds a registered environment by name (``"textworld"``, ``"alfworld"``, ...).
- ``register_env``: registers an environment family under a name: its factory, task source,
  splits, tuning and report splits (docs/environments.md).
- ``env_names``: the registered environment names.
- ``make_tasks``: the tasks of a level and split of an env family (games are made on first use).
- ``evaluate``: plays held-out tasks with a rollout worker and reports success per task type.
- ``read_scalars``: every scalar in a run's TensorBoard event files.
- ``plot_learning_curve``: TensorBoard scalars of a run as a PNG.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# name -> (module, attribute in it); attribute None: the module itself.
_EXPORTS: dict[str, tuple[str, str | None]] = {
    # Training and configuration.
    "Trainer": ("agentrl_jax.run.trainer", "Trainer"),
    "RunConfig": ("agentrl_jax.run.config", "RunConfig"),
    "ConfigError": ("agentrl_jax.run.config", "ConfigError"),
    "base_config": ("agentrl_jax.run.config", "base_config"),
    "load_config_file": ("agentrl_jax.run.config", "load_config_file"),
    "from_config_dict": ("agentrl_jax.run.config", "from_config_dict"),
    # Credit assignment and losses.
    "kernels": ("agentrl_jax.kernels", None),
    "register_advantage_estimator": ("agentrl_jax.kernels", "register_advantage_estimator"),
    "register_policy_loss": ("agentrl_jax.kernels", "register_policy_loss"),
    "advantage_estimators": ("agentrl_jax.kernels", "advantage_estimators"),
    "policy_losses": ("agentrl_jax.kernels", "policy_losses"),
    "Batch": ("agentrl_jax.kernels", "Batch"),
    "Advantages": ("agentrl_jax.kernels", "Advantages"),
    "AdvantageConfig": ("agentrl_jax.kernels", "AdvantageConfig"),
    "LossConfig": ("agentrl_jax.kernels", "LossConfig"),
    "Weighted": ("agentrl_jax.kernels", "Weighted"),
    # Models, tokenizers and sampling.
    "ModelConfig": ("agentrl_jax.models", "ModelConfig"),
    "preset": ("agentrl_jax.models", "preset"),
    "CausalLM": ("agentrl_jax.models", "CausalLM"),
    "ValueModel": ("agentrl_jax.models", "ValueModel"),
    "load_hf_model": ("agentrl_jax.models.hf_checkpoint", "load_hf_model"),
    "save_hf_checkpoint": ("agentrl_jax.models.hf_checkpoint", "save_hf_checkpoint"),
    "load_tokenizer": ("agentrl_jax.models.tokenizer", "load_tokenizer"),
    "build_tokenizer": ("agentrl_jax.models.tokenizer", "build_tokenizer"),
    "Sampler": ("agentrl_jax.sampling", "Sampler"),
    "SamplingParams": ("agentrl_jax.sampling", "SamplingParams"),
    "StopConfig": ("agentrl_jax.sampling", "StopConfig"),
    # Environments and results.
    "Env": ("agentrl_jax.envs.base", "Env"),
    "Task": ("agentrl_jax.envs.base", "Task"),
    "Observation": ("agentrl_jax.envs.base", "Observation"),
    "make_env": ("agentrl_jax.envs.registry", "make_env"),
    "register_env": ("agentrl_jax.envs.registry", "register"),
    "env_names": ("agentrl_jax.envs.registry", "names"),
    "make_tasks": ("agentrl_jax.rollout.tasks", "make_tasks"),
    "evaluate": ("agentrl_jax.run.evaluation", "evaluate"),
    "read_scalars": ("agentrl_jax.run.tensorboard", "read_scalars"),
    "plot_learning_curve": ("agentrl_jax.experiments.evaluate", "plot_learning_curve"),
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Imports a public name's module on first use (PEP 562) and caches the name here."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'agentrl_jax' has no attribute {name!r}")
    module_name, attr = _EXPORTS[name]
    module = importlib.import_module(module_name)
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
