"""Tokenizers: a real checkpoint's, or the built-in byte-level BPE trained on environment text.

Both kinds live in a local directory as ``tokenizer.json`` + ``tokenizer_config.json`` and are
loaded by the same call, ``load_tokenizer(dir)`` (transformers' AutoTokenizer, local files only),
so nothing downstream can tell them apart. No hub download happens anywhere.

The built-in tokenizer follows Qwen2's conventions: byte-level BPE (every byte string encodes, no
unknown token), digits split one by one, the special tokens ``<|endoftext|>`` (padding),
``<|im_start|>`` and ``<|im_end|>`` (end of a chat turn, the EOS), and a ChatML chat template.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterable, Sequence

import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)

# ChatML, as Qwen2.5-Instruct's template without its default system prompt or tool support.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_BYTE_ALPHABET = 256
# The smallest vocabulary ``build_tokenizer`` accepts: the special tokens and the 256 bytes.
MIN_VOCAB_SIZE = len(SPECIAL_TOKENS) + _BYTE_ALPHABET


def load_tokenizer(path: str | pathlib.Path) -> transformers.PreTrainedTokenizerBase:
    """Loads the tokenizer in a local directory (a Hugging Face checkpoint or ``build_tokenizer``).

    A tokenizer without a pad token (Llama 3's) pads with its eos token: padding is masked
    wherever it is read, and the sampler, SFT and RL batches need an id to fill with.

    Raises:
      FileNotFoundError: the directory or its tokenizer files are missing.
      ValueError: the files exist but transformers cannot load them.
    """
    path = pathlib.Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"tokenizer directory {path} does not exist")
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        raise FileNotFoundError(
            f"no tokenizer.json or tokenizer_config.json in {path} "
            f"(found: {sorted(p.name for p in path.iterdir())[:10]})"
        )
    try:
        tok = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"cannot load the tokenizer in {path}: {e}") from e
    if tok.pad_token is None and tok.eos_token is not None:
        tok.pad_token = tok.eos_token
    if tok.pad_token is None:
        raise ValueError(f"the tokenizer in {path} has neither a pad nor an eos token to pad with")
    return tok


def build_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    out_dir: str | pathlib.Path,
    *,
    min_frequency: int = 2,
) -> transformers.PreTrainedTokenizerBase:
    """Trains a byte-level BPE tokenizer on ``texts``, saves it to ``out_dir`` and loads it back.

    Deterministic for the same texts and settings. The vocabulary holds the three special tokens
    (ids 0, 1, 2), the 256 byte symbols, then merges, up to ``vocab_size`` entries in all (fewer if
    the texts have too few distinct pairs).

    Args:
      texts: training text (e.g. the environments' observations, commands and instructions).
      vocab_size: the largest vocabulary to build; must cover the specials and 256 bytes, and
        should not exceed the model's ``vocab_size``.
      out_dir: directory to write tokenizer.json and tokenizer_config.json into (created).
      min_frequency: pairs seen fewer times are not merged.

    Returns:
      The saved tokenizer, loaded through ``load_tokenizer`` (the same path as a checkpoint's).
    """
    if vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(
            f"vocab_size={vocab_size} must be at least {MIN_VOCAB_SIZE} (specials + bytes)"
        )
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_as_list(texts), trainer=trainer)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        additional_special_tokens=[IM_START, IM_END],
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 20,
    )
    fast.chat_template = CHAT_TEMPLATE
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out_dir))
    # transformers 5 records its internal backend class; the generic fast-tokenizer name loads
    # the same tokenizer.json under transformers 4 too (e.g. when vLLM serves the checkpoint).
    config_file = out_dir / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_file.write_text(json.dumps(config, indent=2) + "\n")
    return load_tokenizer(out_dir)


def load_or_build_tokenizer(
    out_dir: str | pathlib.Path, texts: Iterable[str], vocab_size: int
) -> transformers.PreTrainedTokenizerBase:
    """Loads the tokenizer in ``out_dir`` if one is there, else builds it from ``texts``."""
    out_dir = pathlib.Path(out_dir)
    if (out_dir / "tokenizer.json").is_file():
        return load_tokenizer(out_dir)
    return build_tokenizer(texts, vocab_size, out_dir)


def _as_list(texts: Iterable[str]) -> Sequence[str]:
    texts = list(texts)
    if not texts or not all(isinstance(t, str) for t in texts):
        raise ValueError("texts must be a non-empty iterable of strings")
    return texts
