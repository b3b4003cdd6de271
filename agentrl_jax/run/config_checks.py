"""The checks a config section's fields use, and a section built from a ConfigDict.

Each section (``run/config_model.py``, ``config_env.py``, ``config_learning.py``, and
``run/config.py``'s own) checks its fields in ``__post_init__`` with these, so a wrong value
fails before any compute with an error that names the field and lists the valid choices.
"""

from __future__ import annotations

import dataclasses
from typing import Any


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field and the valid choices."""


def choice(path: str, value: Any, choices) -> None:
    if value not in choices:
        raise ConfigError(f"{path} is {value!r}; valid choices: {sorted(choices)}")


def number(path: str, value: Any, ok, expected: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
        raise ConfigError(f"{path} is {value!r}; expected {expected}")


def positive(path: str, value: float) -> None:
    number(path, value, lambda v: v > 0, "> 0")


def non_negative(path: str, value: float) -> None:
    number(path, value, lambda v: v >= 0, ">= 0")


def fraction(path: str, value: float) -> None:
    number(path, value, lambda v: 0.0 <= v <= 1.0, "in [0, 1]")


def integer(path: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{path} is {value!r}; expected an int >= {low}")


def microbatch(section: str, value: Any, batch_field: str, batch: int) -> None:
    """``config.<section>.microbatch_size``: 0 or None (no split), or a divisor of the batch."""
    path = f"config.{section}.microbatch_size"
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{path} is {value!r}; expected an int >= 0 (0: no microbatches)")
    if value and batch % value:
        raise ConfigError(
            f"{path}={value} does not divide config.{section}.{batch_field}={batch}: a "
            f"{batch_field} batch must split into whole microbatches; use a divisor of {batch} "
            "(or 0 for no microbatches)"
        )


def mapping(**kwargs) -> dataclasses.Field:
    """A field given as a dict in the config (``{key: value}``), frozen as sorted pairs."""
    return dataclasses.field(default=(), metadata={"mapping": True}, **kwargs)


def section_field(cls) -> dataclasses.Field:
    """A nested section (``config.model.lora``), a dict of its own fields in the config."""
    return dataclasses.field(default_factory=cls, metadata={"section": cls})


def section(cls, cd, path: str):
    """Builds dataclass ``cls`` from ConfigDict ``cd``; unknown keys are errors."""
    values = dict(cd) if cd is not None else {}
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(f"{path}: unknown field(s) {unknown}; valid fields: {sorted(fields)}")
    out = {}
    for name, value in values.items():
        if "section" in fields[name].metadata:
            sub = fields[name].metadata["section"]
            out[name] = value if isinstance(value, sub) else section(sub, value, f"{path}.{name}")
            continue
        if isinstance(value, (list, tuple)):
            value = tuple(tuple(v) if isinstance(v, list) else v for v in value)
        elif hasattr(value, "items"):
            value = tuple(sorted(dict(value).items()))
        out[name] = value
    try:
        return cls(**out)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{path}: {e}") from e
