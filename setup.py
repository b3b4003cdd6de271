"""agentrl_jax: JAX-native multi-turn RL for LLM agents."""

from setuptools import find_packages, setup

INSTALL_REQUIRES = [
    "jax==0.10.2",
    "jaxlib==0.10.2",
    "flax==0.12.8",
    "optax==0.2.8",
    "orbax-checkpoint==0.12.8",
    "chex==0.1.92",
    "transformers==5.24.0",
    "tokenizers==0.23.3",
    "safetensors==0.8.0",
    "grain==0.2.18",
    "absl-py==2.5.1",
    "tensorboard==2.21.0",
    "ml-collections==1.1.0",
    "numpy>=2.0,<3",
    "tqdm>=4.66",
    "textworld[pddl]==1.7.0",
    "alfworld==0.4.2",
    "matplotlib>=3.8",
    "psutil>=5.9",
    "scipy>=1.13",  # intervals (agentrl_jax/stats.py); jax needs it too
    "etils[epath]>=1.7",  # checkpoint and report paths, local or gs:// (orbax uses it too)
]

# Other people's environments (agentrl_jax/envs/adapters/) and the W&B writer (run/writers.py).
# openenv-core requires gradio (its web UI, which the adapter never imports), and gradio 6.x
# requires pillow<13: a fresh install resolves pillow 12.x.
ADAPTERS = [
    "gymnasium==1.4.0",
    "openenv-core==0.3.0",
    "textarena==0.7.4",
    "verifiers==0.4.0",
    "wandb==0.31.0",
    "uvicorn>=0.24.0",  # serves an OpenEnv app (env.kwargs.app, the tests' server)
]

EXTRAS = {
    "adapters": ADAPTERS,
    "test": [
        *ADAPTERS,  # tests/test_adapters.py, tests/test_wandb.py
        "pytest==9.0.3",
        "pytest-timeout>=2.3",
        "pytest-xdist==3.8.0",
        "ruff==0.17.5",
        "torch==2.13.0",
        "peft==0.21.2",  # tests/test_lora.py: the PEFT round trip
        "nbclient==0.11.0",
        "nbformat>=5.10",
        "ipykernel>=6.29",
    ],
    "docker": ["docker>=7.0"],
    # launch.plan --topology: the TPU compiler, to plan a TPU slice from any machine (the libtpu
    # jax[tpu]==0.10.2 pins; scripts/test.sh installs the same into .venv/tpu_plan).
    "tpu_plan": ["libtpu==0.0.42.*"],
}

setup(
    name="agentrl_jax",
    version="0.1.0",
    description="JAX-native multi-turn reinforcement learning for LLM agents.",
    python_requires=">=3.11",
    packages=find_packages(include=["agentrl_jax", "agentrl_jax.*", "launch", "launch.*"]),
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
)
