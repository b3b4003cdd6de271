r"""Exports a trained run's policy for serving, in the formats transformers, PEFT and vLLM read.

    python -m launch.export --workdir=runs/tiny_textworld --out=runs/tiny_textworld/hf
    python -m launch.export --workdir=runs/lora --out=runs/lora/peft --what=adapter

``--what=merged`` (the default): the policy of the run's newest checkpoint as a plain Hugging
Face checkpoint of its family in ``--out`` (``config.json``, ``generation_config.json``,
safetensors), with the run's tokenizer and its chat template beside it. Both configs name the
chat template's stop token as ``eos_token_id``, so ``generate`` stops where the rollouts did.
A LoRA run's adapters are merged into the base first (``W + A B alpha / r``, summed in f32).
``AutoModelForCausalLM.from_pretrained(OUT)`` and ``vllm serve OUT`` load it.

``--what=adapter`` (LoRA runs): ``OUT/base``, the frozen base the adapters were trained on (the
SFT policy, in the run's base dtype) as a Hugging Face checkpoint with the tokenizer, and
``OUT/adapter``, the adapters in PEFT's format (``adapter_config.json``,
``adapter_model.safetensors``) naming ``OUT/base`` as their base model:
``PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(OUT/base), OUT/adapter)``, or
vLLM's ``--enable-lora --lora-modules agent=OUT/adapter`` over ``OUT/base``.

``--dtype``: the weights' storage dtype in the files (``float32`` or ``bfloat16``), the merged
model's, or the base's and the adapter's tensors alike; default: the parameters' own (a LoRA
run's merged weights and adapters in their f32, its base in the run's base dtype).
docs/models.md, "Serve the result", has the serving commands.
"""

from absl import app, flags, logging

from agentrl_jax.run import logs, paths
from agentrl_jax.run.config import ConfigError, from_config_dict, import_plugins
from launch import cli

WHAT = ("merged", "adapter")

_WORKDIR = flags.DEFINE_string("workdir", None, "The run's workdir (from launch.train).")
_OUT = flags.DEFINE_string("out", None, "The directory to write (created if needed).")
_WHAT = flags.DEFINE_enum(
    "what", "merged", WHAT, "merged: one HF checkpoint; adapter: a LoRA run's base and adapter."
)
_DTYPE = flags.DEFINE_enum(
    "dtype", None, ("float32", "bfloat16"), "Storage dtype of the weights (default: their own)."
)


def restore_policy(config, workdir: str):
    """``(policy, tokenizer, restored)``: the policy of the newest checkpoint of the run in
    ``workdir`` (a LoRA policy once RL has started in a LoRA run), built as the run builds it,
    its tokenizer, and the restored checkpoint (``state.Restored``)."""
    from flax import nnx

    from agentrl_jax.run import build
    from agentrl_jax.run.state import restore_to_play

    def no_corpus():
        cli.fail(f"export: {workdir}/tokenizer: the run's tokenizer is missing")

    checkpointer = build.checkpointer(config, workdir)
    try:
        if checkpointer.latest_step() is None:
            cli.fail(f"export: no checkpoint under {workdir}/checkpoints")
        tok = build.tokenizer(config, workdir, no_corpus)
        mesh = build.device_mesh(config)
        policy = build.policy(config, len(tok), mesh)
        restored, learner = restore_to_play(checkpointer, config, policy=policy, mesh=mesh)
    finally:
        checkpointer.close()
    if restored.meta.run.phase == "sft":  # the plain policy's state
        return nnx.merge(nnx.split(policy)[0], restored.train.policy), tok, restored
    return learner.policy_module(restored.train), tok, restored


def export(config, workdir: str, out: str, what: str = "merged", dtype: str | None = None):
    """Writes the newest checkpoint's policy of the run in ``workdir`` to ``out`` (see the
    module docstring); returns the paths written ({"checkpoint": ...} or {"base": ...,
    "adapter": ...})."""
    from agentrl_jax.models import hf_checkpoint, peft
    from agentrl_jax.run import build

    if what == "adapter" and not config.model.lora.enabled:
        cli.fail(
            f"export: --what=adapter needs a LoRA run; {workdir} trained every parameter "
            "(config.model.lora.rank is 0): use --what=merged"
        )
    model, tok, restored = restore_policy(config, workdir)
    logging.info(
        "exporting checkpoint %d (phase %s, after %d RL iterations)",
        restored.step,
        restored.meta.run.phase,
        restored.meta.run.rl_iteration,
    )
    storage = None if dtype is None else build.DTYPES[dtype]
    # Serving stops where the rollouts stopped: at the chat template's stop token.
    stop = build.chat_template(config, tok).stop_id(tok)
    if what == "merged":
        if storage is None and model.cfg.lora is not None:
            storage = model.cfg.lora.param_dtype  # the merge's f32 sums, not the base's dtype
        written = hf_checkpoint.save_hf_checkpoint(
            model, out, dtype=storage, tokenizer=tok, eos_token_id=stop
        )
        return {"checkpoint": str(written)}
    if model.cfg.lora is None:  # a LoRA run stopped during SFT: no adapters yet
        cli.fail(
            f"export: {workdir}'s newest checkpoint {restored.step} is of the SFT phase, before "
            "the adapters exist; use --what=merged"
        )
    base_dir, adapter_dir = peft.save_base_and_adapter(
        model, out, dtype=storage, tokenizer=tok, eos_token_id=stop
    )
    return {"base": str(base_dir), "adapter": str(adapter_dir)}


def main(argv):
    del argv
    logs.setup()
    workdir, out = _WORKDIR.value, _OUT.value
    if not workdir or not out:
        cli.fail("export: --workdir=DIR (a launch.train workdir) and --out=DIR are required")
    cd = cli.run_config_dict(workdir, "export")
    try:
        import_plugins(tuple(cd.get("plugins", ()) or ()))
        import jax

        config = from_config_dict(cd, num_devices=jax.device_count())
    except ConfigError as e:
        cli.fail(f"config error: {e}")
    written = export(config, paths.absolute(workdir), out, _WHAT.value, _DTYPE.value)
    for name, path in written.items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    app.run(main, flags_parser=cli.parse_flags)
