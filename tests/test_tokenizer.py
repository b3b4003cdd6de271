"""The built-in byte-level BPE tokenizer and the shared loading path."""

import json

import pytest
import transformers

from agentrl_jax.models import tokenizer as tk
from agentrl_jax.models.config import preset

TEXTS = [
    "You are in a kitchen. There is a closed fridge and a wooden table here.",
    "> open fridge\nYou open the fridge, revealing a red apple and 12 eggs.",
    "Your score has just gone up by 1 point. *** You have won ***",
    "go north",
    "take red apple from fridge",
    "put red apple on wooden table",
    "Instructions: put a clean mug in the coffee machine.",
] * 30


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("tok")
    return tk.build_tokenizer(TEXTS, 512, out), out


def test_files_and_special_tokens(built):
    tok, out = built
    assert (out / "tokenizer.json").is_file() and (out / "tokenizer_config.json").is_file()
    assert json.loads((out / "tokenizer_config.json").read_text())["tokenizer_class"] == (
        "PreTrainedTokenizerFast"
    )
    assert tok.convert_tokens_to_ids(list(tk.SPECIAL_TOKENS)) == [0, 1, 2]
    assert tok.eos_token == tk.IM_END and tok.eos_token_id == 2
    assert tok.pad_token == tk.ENDOFTEXT and tok.pad_token_id == 0
    # Special tokens in text map to their single ids, never split into bytes.
    ids = tok("<|im_start|>user\ngo north<|im_end|>")["input_ids"]
    assert ids[0] == 1 and ids[-1] == 2 and 0 not in ids
    assert 3 + 256 < len(tok) <= 512
    assert len(tok) <= preset("tiny").vocab_size


def test_round_trip_any_text(built):
    tok, _ = built
    for text in ["take red apple", "  spaces\tand\nnewlines ", "ünïcödé 😀 ∑", "x=12345;", ""]:
        ids = tok.encode(text)
        assert tok.decode(ids) == text
    # Digits split one by one; frequent words merge into single tokens.
    assert len(tok.encode("12345")) == 5
    assert len(tok.encode(" fridge")) == 1  # byte-level BPE: the space is part of the word


def test_deterministic(built, tmp_path):
    _, out = built
    again = tk.build_tokenizer(TEXTS, 512, tmp_path)
    assert (tmp_path / "tokenizer.json").read_text() == (out / "tokenizer.json").read_text()
    assert again.encode("open the fridge") == built[0].encode("open the fridge")


def test_same_loading_path_as_checkpoints(built):
    tok, out = built
    auto = transformers.AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    fast = transformers.PreTrainedTokenizerFast.from_pretrained(str(out), local_files_only=True)
    text = "You open the fridge."
    assert auto.encode(text) == fast.encode(text) == tok.encode(text)
    assert tk.load_or_build_tokenizer(out, ["unused"], 300).encode(text) == tok.encode(text)


def test_chat_template(built):
    tok, _ = built
    messages = [{"role": "system", "content": "Play."}, {"role": "user", "content": "look"}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|im_start|>system\nPlay.<|im_end|>\n<|im_start|>user\nlook<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_saved_with_a_checkpoint(built, tmp_path):
    """A checkpoint written with its tokenizer loads through the same call as a downloaded one."""
    from agentrl_jax.models import CausalLM
    from agentrl_jax.models.hf_checkpoint import load_config, save_hf_checkpoint
    from agentrl_jax.models.testing import TEST_CONFIG, random_model

    tok, _ = built
    policy = random_model(CausalLM, TEST_CONFIG.replace(vocab_size=512, num_layers=1))
    save_hf_checkpoint(policy, tmp_path, tokenizer=tok)
    assert load_config(tmp_path).vocab_size == 512
    loaded = tk.load_tokenizer(tmp_path)
    assert loaded.encode("go north") == tok.encode("go north")
    assert loaded.eos_token == tk.IM_END


def test_bad_input(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer directory .*missing does not exist"):
        tk.load_tokenizer(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="no tokenizer.json or tokenizer_config.json"):
        tk.load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{broken")
    with pytest.raises(ValueError, match="cannot load the tokenizer in"):
        tk.load_tokenizer(tmp_path)
    with pytest.raises(ValueError, match="vocab_size=100 must be at least 259"):
        tk.build_tokenizer(TEXTS, 100, tmp_path / "x")
    with pytest.raises(ValueError, match="non-empty iterable of strings"):
        tk.build_tokenizer([], 300, tmp_path / "y")
