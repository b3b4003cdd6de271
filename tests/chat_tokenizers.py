"""Local stand-ins for real checkpoints' tokenizers, with the checkpoints' own chat templates.

Nothing can be downloaded, so each family's tokenizer is a byte-level BPE trained here with the
``tokenizers`` library on a small corpus, with that family's pre-tokenizer (the split regex from
its ``tokenizer.json``) and its special tokens, saved as a transformers fast tokenizer. The chat
templates in ``tests/data/chat_templates/`` are the checkpoints' jinja text, verbatim:

- ``qwen2_5_instruct.jinja``: Qwen/Qwen2.5-*-Instruct ``tokenizer_config.json`` ``chat_template``;
- ``qwen3.jinja``: Qwen/Qwen3-0.6B's (the Qwen3 family's, with its ``<think>`` handling);
- ``llama3_instruct.jinja``: meta-llama/Meta-Llama-3-8B-Instruct's;
- ``llama3_1_instruct.jinja``: meta-llama/Llama-3.1-8B-Instruct's (3.3-70B ships the same);
- ``deepseek_r1_distill_qwen.jinja``: deepseek-ai/DeepSeek-R1-Distill-Qwen-*'s (its generation
  prompt opens ``<think>\n``; the assistant turns it renders keep only the text after
  ``</think>``), on Qwen2's pre-tokenizer with the distill tokenizer's own markers.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

import transformers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from tokenizers import trainers as bpe_trainers

from agentrl_jax.models.tokenizer import load_tokenizer

TEMPLATES = pathlib.Path(__file__).parent / "data" / "chat_templates"

# The pre-tokenizer split of Qwen2/2.5/3 (digits one by one) and of Llama 3 (up to 3 digits).
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# GPT-2's split (what ByteLevel(use_regex=True) applies): a run of whitespace before a word keeps
# its last character for the word, so "\n\n" + "go" splits as "\n", "\n", "go", but "\n\n"
# alone stays one piece.
GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
QWEN_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
LLAMA3_SPECIAL = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
)
# DeepSeek-R1-Distill-Qwen: Qwen2's vocabulary with DeepSeek's sentence and role markers (the
# role markers and think tags are added tokens that are not special, as in its tokenizer.json).
DEEPSEEK_BOS, DEEPSEEK_EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
DEEPSEEK_SPECIAL = (DEEPSEEK_EOS, DEEPSEEK_BOS)
DEEPSEEK_ADDED = ("<｜User｜>", "<｜Assistant｜>", "<think>", "</think>")


@dataclasses.dataclass(frozen=True)
class Family:
    """A checkpoint family's tokenizer conventions.

    Attributes:
      template: the chat template's file in tests/data/chat_templates.
      split: the pre-tokenizer's split regex.
      special: special tokens (ids 0, 1, ...).
      added: added tokens that are not special (Qwen3's think tags: one id each, kept on decode).
      bos, eos, pad: the tokenizer's special-token roles.
    """

    template: str
    split: str
    special: tuple[str, ...]
    added: tuple[str, ...] = ()
    bos: str | None = None
    eos: str | None = None
    pad: str | None = None


FAMILIES = {
    "qwen2_5": Family("qwen2_5_instruct.jinja", QWEN2_SPLIT, QWEN_SPECIAL, eos="<|im_end|>",
                      pad="<|endoftext|>"),
    "qwen3": Family("qwen3.jinja", QWEN2_SPLIT, QWEN_SPECIAL, added=("<think>", "</think>"),
                    eos="<|im_end|>", pad="<|endoftext|>"),
    "llama3": Family("llama3_instruct.jinja", LLAMA3_SPLIT, LLAMA3_SPECIAL,
                     bos="<|begin_of_text|>", eos="<|eot_id|>"),
    "llama3_1": Family("llama3_1_instruct.jinja", LLAMA3_SPLIT, LLAMA3_SPECIAL,
                       bos="<|begin_of_text|>", eos="<|eot_id|>"),
    # Llama 3's template on a tokenizer with GPT-2's split: the bug class of a newline run that
    # encodes differently alone than before a word.
    "llama3_gpt2_split": Family("llama3_instruct.jinja", GPT2_SPLIT, LLAMA3_SPECIAL,
                                bos="<|begin_of_text|>", eos="<|eot_id|>"),
    "deepseek_r1_distill_qwen": Family("deepseek_r1_distill_qwen.jinja", QWEN2_SPLIT,
                                       DEEPSEEK_SPECIAL, added=DEEPSEEK_ADDED, bos=DEEPSEEK_BOS,
                                       eos=DEEPSEEK_EOS, pad=DEEPSEEK_EOS),
}  # fmt: skip

# Text like the environments' (observations, commands, goals), with runs of newlines and spaces.
CORPUS = [
    "-= Kitchen =-\nYou are in a kitchen. There is a closed fridge and a wooden table here.\n\n",
    "You open the fridge, revealing a red apple, 12 eggs and a carton of milk.\n",
    "go north\ngo south\nopen fridge\ntake red apple from fridge\nput apple on table\nlook\n",
    "Your score has just gone up by 1 point. *** The End *** You won!\n\n",
    "You are carrying:\n  a brass key\n  a loaf of bread\n\nExits: north, south and east.",
    "Goal: put a clean mug in the coffee machine. You arrive at countertop 1.\n\n\n",
    "You see a mug 2, a knife 1 and a plate 3. Nothing happens. That's not a verb I recognise.",
    "You are playing a text game. Reply with one command. The door is locked.",
    "Commands: go north | open chest | take coin | inventory | examine table | go west",
] * 40


def template_text(family: str) -> str:
    return (TEMPLATES / FAMILIES[family].template).read_text(encoding="utf-8")


def make_tokenizer_dir(
    family: str,
    out_dir: str | pathlib.Path,
    *,
    template: str | None = None,
    template_in: str = "jinja",
    vocab_size: int = 700,
) -> transformers.PreTrainedTokenizerBase:
    """Trains ``family``'s stand-in tokenizer, saves it with a chat template, loads it back.

    Args:
      family: a key of ``FAMILIES``.
      out_dir: the directory to write (a checkpoint's tokenizer files).
      template: the chat template's text (default: the family's own).
      template_in: ``"jinja"`` (``chat_template.jinja``, as recent transformers write) or
        ``"config"`` (the ``chat_template`` field of ``tokenizer_config.json``).
      vocab_size: the BPE's vocabulary size at most.

    Returns:
      The tokenizer loaded through ``load_tokenizer``, the trainer's path.
    """
    fam = FAMILIES[family]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(fam.split), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = bpe_trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(fam.special),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    if fam.bos:  # Llama 3 adds <|begin_of_text|> when asked for special tokens.
        bos = (fam.bos, tok.token_to_id(fam.bos))
        tok.post_processor = processors.TemplateProcessing(
            single=f"{fam.bos} $A", pair=f"{fam.bos} $A {fam.bos} $B", special_tokens=[bos]
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    if fam.added:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in fam.added])
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=fam.bos,
        eos_token=fam.eos,
        pad_token=fam.pad,
        additional_special_tokens=[t for t in fam.special if t not in (fam.bos, fam.eos, fam.pad)],
        clean_up_tokenization_spaces=False,
    )
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out_dir))
    write_template(out_dir, template_text(family) if template is None else template, template_in)
    return load_tokenizer(out_dir)


def write_template(out_dir: pathlib.Path, text: str, where: str) -> None:
    """Puts ``text`` in ``chat_template.jinja`` or ``tokenizer_config.json`` only."""
    config_file = out_dir / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config.pop("chat_template", None)
    (out_dir / "chat_template.jinja").unlink(missing_ok=True)
    if where == "jinja":
        (out_dir / "chat_template.jinja").write_text(text, encoding="utf-8")
    elif where == "config":
        config["chat_template"] = text
    else:
        raise ValueError(f"template_in is {where!r}; expected 'jinja' or 'config'")
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_file.write_text(json.dumps(config, indent=2) + "\n")
