"""Thin command-line entry points; the logic lives in ``agentrl_jax``."""
