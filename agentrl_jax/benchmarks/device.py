"""Accelerator check: Qwen2.5 shapes on whatever chip JAX sees, with model FLOP utilisation.

    python -m launch.bench device --out device.json

For the ``qwen2.5-0.5b`` and ``qwen2.5-1.5b`` presets (their real vocabulary of 151,936, random
weights; ``--quick``: the 1-layer tiny preset, the plumbing check the tests run on a CPU):

- ``<preset>/sampler_tokens_per_s``: multi-turn rollouts as the trainer plays them, 64 episodes of
  4 turns, each a 128-token observation then 32 sampled action tokens, the cache kept across
  turns; parameters and cache in bfloat16. Tokens/s counts every token the model processes
  (observations prefilled and actions decoded). The reference is transformers' ``generate`` on
  the same chip, on the same bf16 weights, given the whole conversation every turn as a user of
  ``generate`` would; it runs only where PyTorch sees the chip (CUDA), else the row has none.
- ``<preset>/rl_update_tokens_per_s``: one RL update exactly as the trainer runs it
  (``RLUpdate``: rows, old/reference log-probs, advantages, the shuffled minibatch steps) on the
  built-in default's episodes (64 synthetic constrained episodes, ``benchmarks.learner``) with
  the shipped Qwen configs' numerics: float32 master weights, bfloat16 compute, scanned layers,
  full remat. Tokens/s counts the episodes' real tokens once per epoch. No reference: the CPU
  learner benchmark (``launch.bench learner``) measures the path against one device program.

The sampler row also carries ``roofline_fraction``: the workload's lower bound from the chip's
limits (``sampler_roofline_s``: prefill FLOPs at the dense peak, each decode step's weights and
keys/values read at the memory bandwidth of ``HBM_TBPS``, or its FLOPs where they take longer)
over our seconds.

With ``AGENTRL_PROFILE_DIR`` set, one more untimed sampler workload and one more update per
preset run under ``jax.profiler.trace`` into ``$AGENTRL_PROFILE_DIR/<preset>_{sampler,update}``
(``scripts/device_check.sh`` packs them into ``$OUT/profile.tar.gz``).

Each row carries ``mfu``: model FLOPs per second over the chip's peak dense bfloat16 FLOP/s
(``PEAK_BF16_TFLOPS``, from the vendors' data sheets; a chip not in the table, or ``--quick``,
uses ``matmul_peak_tflops``, a measured bf16 matmul). Model FLOPs are the matmuls' 2 x
parameters per token (the embedding lookup excluded, the LM head included for tokens whose
logits are needed) plus causal attention, 4 x heads x head_dim x keys per token and layer; the
update counts a forward for the old log-probs (and one for the reference when the config has a
KL term) and forward + backward (3 forwards) per epoch, not remat's recomputation.

Timing as in ``benchmarks.sampler``: warm-up (compilation) untimed, then 3 timed runs (the
reference alternating with ours), medians, every run's seconds in the JSON.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from agentrl_jax.benchmarks import learner as learner_bench
from agentrl_jax.benchmarks.report import Report, Row, peak_rss_mb, timed
from agentrl_jax.benchmarks.sampler import Runs, Sizes, _multi_turn, _reference_model
from agentrl_jax.models import registry
from agentrl_jax.models.config import ModelConfig, preset
from agentrl_jax.rl.rl_update import RLUpdate
from agentrl_jax.run.build import model_config, rl_learner
from agentrl_jax.run.config import from_config_dict, load_config_file
from agentrl_jax.sampling import Sampler, SamplingParams
from agentrl_jax.sampling.testing import random_policy

# Peak dense bfloat16 TFLOP/s per chip, by the start of ``jax.Device.device_kind``.
PEAK_BF16_TFLOPS = {
    "NVIDIA H200": 989.0,
    "NVIDIA H100": 989.0,  # SXM; the PCIe card is 756
    "NVIDIA A100": 312.0,
    "NVIDIA L4": 121.0,
    "NVIDIA A10G": 125.0,
    "TPU v6 lite": 918.0,  # v6e
    "TPU v5 lite": 197.0,  # v5e
    "TPU v5p": 459.0,
    "TPU v5": 459.0,
    "TPU v4": 275.0,
}


@dataclasses.dataclass(frozen=True)
class DeviceSizes:
    presets: tuple[str, ...] = ("qwen2.5-0.5b", "qwen2.5-1.5b")
    batch: int = 64
    turns: int = 4
    obs_len: int = 128
    action_len: int = 32
    config_arg: str = ""  # configs/tiny_textworld.py's argument: the update's episodes
    microbatch_size: int = 8  # the update's rows per microbatch (bounds its memory)
    repeats: int = 3
    matmul_n: int = 8192


QUICK = DeviceSizes(
    presets=("tiny",),
    batch=2,
    turns=2,
    obs_len=8,
    action_len=4,
    config_arg="test",
    repeats=1,
    matmul_n=256,
)


# Peak HBM bandwidth per chip in TB/s, from the same data sheets (the sampler's roofline).
HBM_TBPS = {
    "NVIDIA H200": 4.8,
    "NVIDIA H100": 3.35,  # SXM
    "NVIDIA A100": 2.039,  # 80 GB SXM
    "NVIDIA L4": 0.3,
    "NVIDIA A10G": 0.6,
    "TPU v6 lite": 1.64,
    "TPU v5 lite": 0.819,
    "TPU v5p": 2.765,
    "TPU v5": 2.765,
    "TPU v4": 1.2,
}


PROFILE_DIR = "AGENTRL_PROFILE_DIR"


def _profiled(name: str):
    """A ``jax.profiler`` trace of the block into ``$AGENTRL_PROFILE_DIR/<name>`` (for
    TensorBoard's profile plugin or Perfetto), or nothing when the variable is unset."""
    root = os.environ.get(PROFILE_DIR)
    if not root:
        return contextlib.nullcontext()
    return jax.profiler.trace(os.path.join(root, name))


def chip_hbm_tbps(device: jax.Device) -> float | None:
    """The chip's data-sheet memory bandwidth in TB/s, or None for a chip not in the table."""
    kind = getattr(device, "device_kind", "")
    return next((tbps for name, tbps in HBM_TBPS.items() if kind.startswith(name)), None)


def read_tbps(nbytes: int = 1 << 28) -> float:
    """A jitted sum's read of ``nbytes`` of bf16, in TB/s: the memory's practical bandwidth."""
    x = jnp.ones((nbytes // 2,), jnp.bfloat16)
    total = jax.jit(lambda a: jnp.sum(a, dtype=jnp.float32))
    seconds = timed(lambda: total(x).block_until_ready(), repeats=5, warmup=2)
    return nbytes / seconds / 1e12


def sampler_roofline_s(cfg: ModelConfig, sizes: DeviceSizes, peak_tflops: float, tbps: float):
    """The multi-turn workload's lower bound in seconds, from the chip's limits.

    Each turn prefills its observation at the dense peak (its FLOPs as in ``sampler_flops``);
    each decode step takes the longer of its FLOPs at the peak and its bytes at the memory's
    bandwidth: every matmul weight (bf16) once, and each row's keys and values so far.
    """
    trunk, head = matmul_params(cfg)
    weight_bytes = 2 * (trunk + head)
    kv_bytes_per_token = 2 * cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim  # k, v bf16
    per_turn = sizes.obs_len + sizes.action_len
    flop_s, byte_s = peak_tflops * 1e12, tbps * 1e12
    total = 0.0
    for turn in range(sizes.turns):
        start = turn * per_turn
        prefill = sum(2 * trunk + attention_flops(cfg, start + i + 1) for i in range(sizes.obs_len))
        total += (prefill + 2 * head) * sizes.batch / flop_s
        for step in range(1, sizes.action_len):
            keys = start + sizes.obs_len + step
            flops = (2 * (trunk + head) + attention_flops(cfg, keys)) * sizes.batch
            nbytes = weight_bytes + kv_bytes_per_token * keys * sizes.batch
            total += max(flops / flop_s, nbytes / byte_s)
    return total


def chip_peak_tflops(device: jax.Device) -> float | None:
    """The chip's data-sheet peak dense bf16 TFLOP/s, or None for a chip not in the table."""
    kind = getattr(device, "device_kind", "")
    for name, tflops in PEAK_BF16_TFLOPS.items():
        if kind.startswith(name):
            return tflops
    return None


def matmul_peak_tflops(n: int) -> float:
    """A jitted [n, n] @ [n, n] bfloat16 matmul's TFLOP/s: the chip's practical peak."""
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.bfloat16)
    matmul = jax.jit(lambda x, y: x @ y)
    seconds = timed(lambda: matmul(a, a).block_until_ready(), repeats=5, warmup=2)
    return 2 * n**3 / seconds / 1e12


def matmul_params(cfg: ModelConfig) -> tuple[int, int]:
    """(trunk, head): parameters in the decoder layers' matmuls, and in the LM head's."""
    if cfg.num_experts:
        raise ValueError(
            f"FLOPs are counted for dense MLPs; a model with routed experts (num_experts="
            f"{cfg.num_experts}) is not counted here"
        )
    d, f, h, kv, hd = (
        cfg.hidden_size,
        cfg.intermediate_size,
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.head_dim,
    )
    layer = d * h * hd + 2 * d * kv * hd + h * hd * d + 3 * d * f
    return cfg.num_layers * layer, cfg.vocab_size * d


def attention_flops(cfg: ModelConfig, keys: float) -> float:
    """Forward FLOPs of one token attending to ``keys`` keys, over all layers (QK^T and AV)."""
    return 4.0 * cfg.num_layers * cfg.num_heads * cfg.head_dim * keys


def sampler_flops(cfg: ModelConfig, sizes: DeviceSizes) -> float:
    """Model FLOPs of one multi-turn workload: every token through the trunk, the sampled
    tokens (and each turn's last observation token) through the head, causal attention."""
    trunk, head = matmul_params(cfg)
    per_turn = sizes.obs_len + sizes.action_len
    total = 0.0
    for turn in range(sizes.turns):
        for i in range(per_turn):
            total += 2 * trunk + attention_flops(cfg, turn * per_turn + i + 1)
        total += 2 * head * sizes.action_len  # logits of the last observation + all but one
    return total * sizes.batch


def update_flops(cfg: ModelConfig, lengths: list[int], epochs: int, kl: bool) -> float:
    """Model FLOPs of one RL update over rows of ``lengths`` real tokens: the old (and
    reference) log-prob forwards, then forward and backward (3 forwards) per epoch."""
    trunk, head = matmul_params(cfg)
    forward = sum(n * 2 * (trunk + head) + attention_flops(cfg, n * (n + 1) / 2) for n in lengths)
    return forward * ((2 if kl else 1) + 3 * epochs)


def _mfu(flops: float, seconds: float, peak_tflops: float) -> float:
    return flops / seconds / (peak_tflops * 1e12)


def _torch_device() -> str | None:
    """'cuda' where PyTorch sees a GPU, else None (no reference on this chip)."""
    try:
        import torch  # noqa: PLC0415 - the test extra's; optional on an accelerator image
    except ImportError:
        return None
    return "cuda" if torch.cuda.is_available() else None


def _sampler_row(
    name: str, cfg: ModelConfig, sizes: DeviceSizes, peak: float, tbps: float, ref_device
):
    policy = random_policy(cfg, std=0.02)
    sampler = Sampler(policy, sampling=SamplingParams(temperature=1.0))
    reference = None
    if ref_device is not None:
        import torch  # noqa: PLC0415

        reference = _reference_model(policy, dtype=torch.bfloat16, device=ref_device)
    timing = Sizes(batch=sizes.batch, repeats=sizes.repeats)
    ours, ref = _multi_turn(
        sampler,
        reference,
        cfg,
        timing,
        np.random.default_rng(0),
        turns=sizes.turns,
        obs_len=sizes.obs_len,
        action=sizes.action_len,
    )
    with _profiled(f"{name}_sampler"):  # one more workload, ours alone, its programs compiled
        _multi_turn(
            sampler,
            None,
            cfg,
            Sizes(batch=sizes.batch, repeats=1),
            np.random.default_rng(0),
            turns=sizes.turns,
            obs_len=sizes.obs_len,
            action=sizes.action_len,
        )
    tokens = sizes.batch * sizes.turns * (sizes.obs_len + sizes.action_len)
    flops = sampler_flops(cfg, sizes)
    extra = {
        "ours_s": [round(x, 5) for x in ours.seconds],
        "ours_spread": round(ours.spread, 3),
        "mfu": _mfu(flops, ours.median, peak),
        "model_tflop": flops / 1e12,
        "batch": sizes.batch,
        "turns": sizes.turns,
        "obs_len": sizes.obs_len,
        "action_len": sizes.action_len,
        "compilations": sampler.num_traces,
        "roofline_s": (roofline := sampler_roofline_s(cfg, sizes, peak, tbps)),
        "roofline_fraction": roofline / ours.median,  # of the chip's limit reached
        "hbm_tbps": tbps,
    }
    if ref is not None:
        extra.update(
            reference_s=[round(x, 5) for x in ref.seconds],
            reference_spread=round(ref.spread, 3),
            reference_mfu=_mfu(flops, ref.median, peak),
            reference_is=f"transformers generate (bf16, {ref_device}), whole conversation a turn",
        )
    del sampler, policy, reference
    return Row(
        f"{name}/sampler_tokens_per_s",
        tokens / ours.median,
        None if ref is None else tokens / ref.median,
        "tokens/s",
        extra=extra,
    )


def _update_row(name: str, sizes: DeviceSizes, peak: float) -> Row:
    arg = f":{sizes.config_arg}" if sizes.config_arg else ""
    config = load_config_file(learner_bench.CONFIG + arg)
    config.model.update(preset=name, dtype="bfloat16", remat="full", scan_layers=True)
    if name != "tiny":  # the preset as shipped (the default's overrides shrink the tiny one)
        config.model.overrides = {}
        config.rl.microbatch_size = sizes.microbatch_size
    config = from_config_dict(config)
    cfg = model_config(config)  # the preset's own vocabulary
    if name == "tiny":
        cfg = cfg.replace(num_layers=1)
    family = registry.family(cfg)
    policy = family.policy(cfg, rngs=nnx.Rngs(0))
    critic = family.critic.from_policy(policy, rngs=nnx.Rngs(1)) if config.needs_critic else None
    learner = rl_learner(config, policy, critic)
    spec = learner.spec
    update = RLUpdate(spec, learner, learner_bench.PAD)
    trajs = learner_bench.synthetic_episodes(
        config.rl.tasks_per_iteration,
        config.rollout.group_size,
        cfg.vocab_size,
        config.rollout.max_turns,
    )
    ref_policy = nnx.state(policy, nnx.Param)
    state = {"train": learner.init(policy, critic)}
    del policy, critic

    def one_update() -> float:
        t0 = time.perf_counter()
        state["train"], state["metrics"] = update(
            state["train"], ref_policy, trajs, np.random.default_rng(0), 0
        )
        jax.block_until_ready(state["train"])
        return time.perf_counter() - t0

    one_update()  # compiles
    runs = Runs([one_update() for _ in range(sizes.repeats)])
    with _profiled(f"{name}_update"):
        one_update()
    lengths = [t.num_tokens for t in trajs]
    tokens = sum(lengths) * spec.epochs
    flops = update_flops(cfg, lengths, spec.epochs, kl=spec.kl.needs_reference)
    return Row(
        f"{name}/rl_update_tokens_per_s",
        tokens / runs.median,
        None,
        "tokens/s",
        extra={
            "ours_s": [round(x, 5) for x in runs.seconds],
            "ours_spread": round(runs.spread, 3),
            "mfu": _mfu(flops, runs.median, peak),
            "model_tflop": flops / 1e12,
            "episodes": len(trajs),
            "real_tokens": sum(lengths),
            "epochs": spec.epochs,
            "minibatch_size": spec.minibatch_size,
            "microbatch_size": spec.microbatch_size,
            "updates": state["metrics"]["train/updates"],
        },
    )


def run(quick: bool, model: str | None = None) -> Report:
    """``model``: one preset (``--model=qwen2.5-1.5b``) instead of both."""
    sizes = QUICK if quick else DeviceSizes()
    if model:
        sizes = dataclasses.replace(sizes, presets=(model,))
    device = jax.devices()[0]
    report = Report("device")
    measured = matmul_peak_tflops(sizes.matmul_n)
    report.add(Row("matmul_peak_tflops", measured, None, "TFLOP/s", extra={"n": sizes.matmul_n}))
    sheet = None if quick else chip_peak_tflops(device)
    peak = sheet or measured
    hbm_sheet = None if quick else chip_hbm_tbps(device)
    tbps = hbm_sheet or read_tbps(1 << 24 if quick else 1 << 30)
    ref_device = _torch_device()
    if quick and ref_device is None:
        ref_device = "cpu"  # the plumbing check runs the reference on the CPU
    for name in sizes.presets:
        cfg = preset(name, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
        if quick:
            cfg = cfg.with_layers(1)
        report.add(_sampler_row(name, cfg, sizes, peak, tbps, ref_device))
        report.add(_update_row(name, sizes, peak))
    report.facts.update(
        backend=jax.default_backend(),
        device_kind=getattr(device, "device_kind", "unknown"),
        devices=jax.device_count(),
        jax_version=jax.__version__,
        peak_tflops=peak,
        peak_from="data sheet" if sheet else "measured bf16 matmul",
        hbm_tbps=tbps,
        hbm_from="data sheet" if hbm_sheet else "measured jitted sum",
        reference_device=ref_device or "none (PyTorch sees no GPU)",
        peak_rss_mb=round(peak_rss_mb(), 1),
        load_average=os.getloadavg(),
    )
    return report
