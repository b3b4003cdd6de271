"""Each family end to end: ``launch.train`` (SFT, RL, evaluations) on a tiny random checkpoint
that transformers made, with a stand-in tokenizer carrying the checkpoint family's own chat
template (tests/chat_tokenizers.py), then ``launch.export``, whose checkpoint transformers loads
with the run's last policy's logits.

Gemma 3 runs with ChatML (the ``qwen`` template) on its own weights: its chat template folds the
system prompt into the first user turn, which the rollout's template check refuses (a rollout
encodes the system piece once, before the first observation), and tests/data has no Gemma
template to test that refusal against.
"""

import json

import ml_collections
import numpy as np
import pytest
import train_cli

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import chat_tokenizers  # noqa: E402

from agentrl_jax.models.testing import random_transformers_checkpoint  # noqa: E402
from agentrl_jax.run.config import from_config_dict  # noqa: E402

TOL = 1e-4  # the exported checkpoint's logits in transformers against the run's policy (f32)

# family -> (the stand-in tokenizer, the run's template, a transformers config of vocab V).
SHAPE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_hidden_layers=2,
    max_position_embeddings=4096,
    tie_word_embeddings=True,
)
FAMILIES = {
    "qwen3": ("qwen3", "checkpoint", lambda v: transformers.Qwen3Config(vocab_size=v, **SHAPE)),
    "llama": (
        "llama3_1",
        "checkpoint",
        lambda v: transformers.LlamaConfig(
            vocab_size=v,
            **SHAPE,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500_000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 256,
            },
        ),
    ),
    "gemma3_text": (
        "qwen2_5",
        "qwen",
        lambda v: transformers.Gemma3TextConfig(
            vocab_size=v,
            **SHAPE,
            head_dim=16,
            sliding_window=16,
            layer_types=["sliding_attention", "full_attention"],
        ),
    ),
}


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory):
    return dict(
        JAX_COMPILATION_CACHE_DIR=str(tmp_path_factory.mktemp("jax_cache")),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1",
    )


@pytest.mark.slow  # ~3 min a family on 2 cores
@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_trains_evaluates_and_exports(family, textworld_games, compile_cache, tmp_path):
    from launch import export as export_lib

    tok_family, template, make_config = FAMILIES[family]
    ckpt = tmp_path / "ckpt"
    tok = chat_tokenizers.make_tokenizer_dir(tok_family, ckpt)
    random_transformers_checkpoint(ckpt, make_config(len(tok)), std=0.02)
    workdir = tmp_path / "run"
    cmd = train_cli.train_cmd(
        workdir,
        f"--config.model.checkpoint={ckpt}",
        f"--config.model.template={template}",
    )
    (text,) = train_cli.finish(
        train_cli.start(cmd, textworld_games["root"], tmp_path / "run.log", **compile_cache)
    )
    report = json.loads((workdir / "report.json").read_text())
    assert report, text[-2000:]
    if template == "checkpoint":
        assert f"chat template: checkpoint from {ckpt}" in text

    config = from_config_dict(
        ml_collections.ConfigDict(json.loads((workdir / "config.json").read_text()))
    )
    written = export_lib.export(config, str(workdir), str(tmp_path / "export"))
    out = written["checkpoint"]
    hf_config = json.loads((tmp_path / "export" / "config.json").read_text())
    assert hf_config["model_type"] == family
    policy, run_tok, _ = export_lib.restore_policy(config, str(workdir))
    ids = run_tok("-= Kitchen =- You see a fridge. > open fridge")["input_ids"]
    ours = np.asarray(policy(np.asarray([ids], np.int32))[0])
    model = transformers.AutoModelForCausalLM.from_pretrained(
        out, attn_implementation="eager", dtype=torch.float32
    )
    with torch.no_grad():
        theirs = model.eval()(torch.tensor([ids])).logits.float().numpy()
    diff = float(np.abs(theirs - ours).max())
    print(f"{family}: exported checkpoint in transformers vs the run's policy: {diff:.1e}")
    assert diff <= TOL
