r"""The memory plan of a run, before renting the devices: per program, per device bytes.

    python -m launch.plan --config=configs/textworld_qwen2_5_1_5b_ppo.py \
        --config.model.preset=qwen2.5-1.5b --devices=8 --out plan.json

Compiles ahead of time, on ``--devices`` fake CPU devices laid out as ``config.mesh``, every
program a run of the config executes (sampler turn, SFT step, scoring, RL update) with abstract
inputs, no parameter allocated; prints a table of XLA's per-device memory analysis and the
largest program, and writes the JSON (``agentrl_jax.experiments.plan``). The model is the
checkpoint's config.json when ``--config.model.checkpoint`` is given (no weights are read), else
``config.model.preset``. ``--local_devices=L`` plans a multi-host layout of hosts with L devices
each: the learner's programs on the whole mesh, the sampler's turn on one host's copy.

``--topology=v5e:2x4`` compiles with the TPU compiler instead, ahead of time, for that slice's
chips (``--devices`` must equal their number; needs libtpu: ``pip install -e '.[tpu_plan]'``): the
memory analysis is then the TPU's own, with its bfloat16 kernels and fusions, not the CPU
compiler's estimate.
"""

import os
import sys


def _fake_devices(argv: list[str]) -> None:
    """N fake CPU devices for ``--devices=N``: XLA reads its flags once, before jax starts."""
    values = [a.split("=", 1)[1] for a in argv if a.startswith("--devices=")]
    if values and values[-1].isdigit():
        flag = f"--xla_force_host_platform_device_count={values[-1]}"
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()
        os.environ["JAX_PLATFORMS"] = "cpu"


_fake_devices(sys.argv)

import json  # noqa: E402
import math  # noqa: E402

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from agentrl_jax.run.config import ConfigError, from_config_dict  # noqa: E402
from launch import cli  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "A configs/*.py file.", lock_config=True)
_DEVICES = flags.DEFINE_integer("devices", None, "Fake CPU devices to plan for (the mesh's size).")
_OUT = flags.DEFINE_string("out", None, "Where to write the plan's JSON.")
_PROGRAMS = flags.DEFINE_list(
    "programs", None, "Only these programs (sampler_turn, sft_step, score, rl_update)."
)
_PROMPT = flags.DEFINE_integer(
    "prompt_tokens", 512, "Prompt tokens the planned sampler turn prefills."
)
_TOPOLOGY = flags.DEFINE_string(
    "topology",
    None,
    "Compile for this TPU slice (e.g. v5e:2x4) with the TPU compiler, ahead of time, instead of "
    "on fake CPU devices.",
)
_LOCAL = flags.DEFINE_integer(
    "local_devices",
    None,
    "Plan a multi-host run: hosts of this many devices (the sampler runs on one host's).",
)


def main(argv):
    del argv
    logging.set_verbosity(logging.INFO)  # each program as it compiles
    if _CONFIG.value is None or not _DEVICES.value or _DEVICES.value < 1:
        raise app.UsageError("--config=configs/<name>.py and --devices=N (N >= 1) are required")
    if _PROMPT.value < 1:
        cli.fail(f"--prompt_tokens={_PROMPT.value}: expected >= 1")
    try:
        config = from_config_dict(_CONFIG.value, num_devices=_DEVICES.value)
    except ConfigError as e:
        cli.fail(f"config error: {e}")

    from agentrl_jax.experiments import plan

    programs = tuple(_PROGRAMS.value) if _PROGRAMS.value else None
    unknown = sorted(set(programs or ()) - set(plan.PROGRAMS))
    if unknown:
        cli.fail(f"--programs: {unknown} unknown; expected names from {list(plan.PROGRAMS)}")
    try:
        plan.check_local_devices(_LOCAL.value, math.prod(config.mesh))
    except ValueError as e:
        cli.fail(f"--{e}")
    devices = None
    if _TOPOLOGY.value:
        try:
            devices = plan.tpu_devices(_TOPOLOGY.value)
        except ValueError as e:
            cli.fail(f"--{e}")
        if len(devices) != _DEVICES.value:
            cli.fail(
                f"--topology={_TOPOLOGY.value} has {len(devices)} chips; "
                f"--devices={_DEVICES.value} (the config's mesh is sized for --devices): "
                f"expected them equal"
            )
    result = plan.memory_plan(
        config,
        prompt_tokens=_PROMPT.value,
        programs=programs,
        local_devices=_LOCAL.value,
        devices=devices,
    )
    print(plan.format_table(result))
    if _OUT.value:
        with open(_OUT.value, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
        print(f"wrote {_OUT.value}")


if __name__ == "__main__":
    app.run(main, flags_parser=cli.parse_flags)
