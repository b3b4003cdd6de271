"""``config.model``: the policy's shape, numerics, tokenizer and chat template, and its LoRA
adapters (``config.model.lora``), each field checked beside it (``run/config_checks.py``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from agentrl_jax.models.config import MOE_IMPLS, PRESETS, REMAT_POLICIES
from agentrl_jax.run import config_checks as checks
from agentrl_jax.run.config_checks import ConfigError

DTYPES = ("float32", "bfloat16")
# Chat templates (rollout/chat.py): fixed layouts, or the checkpoint's own jinja template.
TEMPLATES = ("checkpoint", "plain", "qwen")
# How a checkpoint's template is held to the rollout's context (rollout/chat_checkpoint.py):
# "exact", every turn as the template renders it once later turns follow (prefix-stable), or
# "append_only", each turn as the policy saw and wrote it, the generation prompt from the
# template (for a template that rewrites history: Qwen3 thinking, DeepSeek-R1-Distill).
TEMPLATE_MODES = ("exact", "append_only")


@dataclasses.dataclass(frozen=True)
class LoraSection:
    """``config.model.lora``: low-rank adapters on the policy (``models/lora.py``; rank 0: off).

    With ``rank`` > 0 the RL phase trains adapters only: they are applied to the policy as it
    enters RL (after the full-parameter SFT, or on the checkpoint's weights when SFT has no
    steps), B at zero, so RL starts from exactly the SFT policy; the base stays frozen, stored in
    ``base_dtype``, and the KL reference is that base. SFT stays a full fine-tune.
    """

    rank: int = 0  # the adapters' inner width; 0 turns LoRA off
    alpha: float = 8.0  # the scale's numerator: adapters add x A B * alpha / rank
    # PEFT's lora_dropout: each RL step's forward pass drops an adapter's input entries with
    # this probability (masks from the run's seed and the step; scoring and sampling never drop,
    # so it is refused with rl.loss='ppo', whose ratio it would bias)
    dropout: float = 0.0
    targets: str = "all"  # some of q,k,v,o,gate,up,down (comma-separated), or "all"
    # The frozen base's storage dtype (the adapters stay float32); empty: model.dtype, the
    # compute dtype (a bf16 base under bf16 compute: half the memory of the f32 weights SFT
    # trained).
    base_dtype: str = ""

    def __post_init__(self):
        from agentrl_jax.models.config import LORA_TARGETS

        if self.base_dtype:
            checks.choice("config.model.lora.base_dtype", self.base_dtype, DTYPES)

        checks.integer("config.model.lora.rank", self.rank, 0)
        checks.positive("config.model.lora.alpha", self.alpha)
        checks.number(
            "config.model.lora.dropout",
            self.dropout,
            lambda v: 0 <= v < 1,
            "a probability in [0, 1)",
        )
        targets = self.targets
        if isinstance(targets, (list, tuple)):
            targets = ",".join(str(t) for t in targets)
        if not isinstance(targets, str) or not targets.strip():
            raise ConfigError(
                f"config.model.lora.targets is {self.targets!r}; expected some of "
                f"{list(LORA_TARGETS)}, comma-separated, or 'all'"
            )
        if targets.strip() != "all":
            names = [t.strip() for t in targets.split(",")]
            unknown = [t for t in names if t not in LORA_TARGETS]
            if unknown or len(set(names)) != len(names):
                raise ConfigError(
                    f"config.model.lora.targets is {self.targets!r}: "
                    + (f"{unknown} not among" if unknown else "repeated names; expected some of")
                    + f" the projections {list(LORA_TARGETS)} (comma-separated), or 'all'"
                )
            targets = ",".join(t for t in LORA_TARGETS if t in names)
        object.__setattr__(self, "targets", targets.strip())

    @property
    def enabled(self) -> bool:
        """Whether this is a LoRA run (``rank`` > 0: the RL phase trains adapters only): the
        one test of it, for the config's checks, the RL policy, the trainer's adapter export,
        ``launch.export`` and the memory plan."""
        return self.rank > 0

    def lora_config(self):
        """The model's ``LoraConfig``, or None when this is no LoRA run."""
        from agentrl_jax.models.config import LoraConfig

        if not self.enabled:
            return None
        return LoraConfig(
            rank=self.rank, alpha=self.alpha, dropout=self.dropout, targets=self.targets
        )


_LORA = "config.model.lora"


@dataclasses.dataclass(frozen=True)
class ModelSection:
    preset: str = "tiny"
    checkpoint: str = ""  # a local Hugging Face directory; empty: a fresh preset model
    tokenizer: str = ""  # a local tokenizer dir; empty: the checkpoint's, or built from env text
    # The vocabulary of a tokenizer built from the env text (no checkpoint, no tokenizer given).
    tokenizer_vocab: int = 1024
    # The train tasks (each level's first) whose expert episodes that tokenizer learns from; 0: all
    # of them. A family whose words are few (ALFWorld's 3,553 games) needs a few hundred.
    tokenizer_tasks: int = 0
    # The chat template: "checkpoint" (the checkpoint's or tokenizer's own jinja template, checked
    # when the run starts), "qwen" or "plain"; empty: "checkpoint" when model.checkpoint is set,
    # else "plain".
    template: str = ""
    # "exact" or "append_only" (TEMPLATE_MODES): append-only is opt-in, for template "checkpoint"
    template_mode: str = "exact"
    dtype: str = "float32"
    remat: str = "none"  # what each layer keeps for the backward pass: REMAT_POLICIES
    scan_layers: bool = False  # the layers as one scanned stack (ModelConfig.scan_layers)
    # How routed experts are computed (ModelConfig.moe_impl, MOE_IMPLS): "dense", every expert on
    # every token, or "grouped", a grouped matmul over the tokens sorted by expert. A model
    # without routed experts ignores it.
    moe_impl: str = "dense"
    # The learner runs the LM head over this many positions at a time (and recomputes them in the
    # backward pass), so its logits peak at [B, logits_chunk, V], never [B, T, V].
    logits_chunk: int = 256
    overrides: tuple[tuple[str, Any], ...] = (
        checks.mapping()
    )  # preset fields to change: num_layers=2
    # LoRA adapters for the RL phase (LoraSection); rank 0, the default: full fine-tuning.
    lora: LoraSection = checks.section_field(LoraSection)

    def __post_init__(self):
        if not isinstance(self.lora, LoraSection):  # a dict, or its sorted (key, value) pairs
            object.__setattr__(self, "lora", checks.section(LoraSection, dict(self.lora), _LORA))
        if not self.checkpoint:
            checks.choice("config.model.preset", self.preset, PRESETS)
        checks.choice("config.model.dtype", self.dtype, DTYPES)
        if not self.lora.base_dtype:
            object.__setattr__(self, "lora", dataclasses.replace(self.lora, base_dtype=self.dtype))
        if not self.template:
            object.__setattr__(self, "template", "checkpoint" if self.checkpoint else "plain")
        checks.choice("config.model.template", self.template, TEMPLATES)
        if self.template == "checkpoint" and not (self.checkpoint or self.tokenizer):
            raise ConfigError(
                "config.model.template is 'checkpoint' (the chat template of "
                "config.model.checkpoint or config.model.tokenizer) but neither is set; expected "
                "a checkpoint or tokenizer directory, or template 'qwen' or 'plain'"
            )
        checks.choice("config.model.template_mode", self.template_mode, TEMPLATE_MODES)
        if self.template_mode == "append_only" and self.template != "checkpoint":
            raise ConfigError(
                f"config.model.template_mode is 'append_only' but config.model.template is "
                f"{self.template!r}, which renders every turn as it was fed; expected template "
                "'checkpoint' (a checkpoint's own template that rewrites earlier turns)"
            )
        checks.choice("config.model.remat", self.remat, REMAT_POLICIES)
        checks.choice("config.model.moe_impl", self.moe_impl, MOE_IMPLS)
        if not isinstance(self.scan_layers, bool):
            raise ConfigError(f"config.model.scan_layers is {self.scan_layers!r}; expected a bool")
        checks.integer("config.model.logits_chunk", self.logits_chunk, 1)
        checks.integer("config.model.tokenizer_tasks", self.tokenizer_tasks, 0)
        if not self.checkpoint and not self.tokenizer:
            from agentrl_jax.models.tokenizer import MIN_VOCAB_SIZE

            if isinstance(self.tokenizer_vocab, bool) or not (
                isinstance(self.tokenizer_vocab, int) and self.tokenizer_vocab >= MIN_VOCAB_SIZE
            ):
                raise ConfigError(
                    f"config.model.tokenizer_vocab is {self.tokenizer_vocab!r}; expected an int "
                    f">= {MIN_VOCAB_SIZE} (the tokenizer built from the env text holds the "
                    "special tokens and 256 bytes)"
                )
