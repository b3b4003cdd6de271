"""Defaults shared by every config: each ``configs/<name>.py`` starts from ``base_config()``.

The defaults themselves are the fields of the dataclasses in ``run/config.py`` (the one place
they are written); ``base_config()`` is generated from them.
"""

from agentrl_jax.run.config import base_config

__all__ = ["base_config"]
