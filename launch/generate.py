r"""Generation demo: the tiny policy answers a few prompts, then continues each conversation.

    python -m launch.generate
    python -m launch.generate --checkpoint=/path/to/Qwen2.5-0.5B-Instruct --max_new_tokens=64

By default the policy is the tiny preset with random weights (so the text is gibberish: this
shows the machinery, not a trained agent) and the tokenizer is the built-in byte-level BPE,
trained once on a small sample of text-game lines and kept in ``--workdir``. Turn 2 appends an
observation to each conversation and prefills only that, on the cache kept from turn 1.
"""

from __future__ import annotations

import os
import time

import jax
import numpy as np
from absl import app, flags

from agentrl_jax.models.config import preset
from agentrl_jax.models.tokenizer import IM_END, load_or_build_tokenizer, load_tokenizer
from agentrl_jax.sampling import DoneReason, Sampler, SamplingParams, StopConfig
from agentrl_jax.sampling.testing import random_policy

_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "Hugging Face checkpoint directory.")
_WORKDIR = flags.DEFINE_string("workdir", "runs/generate", "Where the built-in tokenizer is kept.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 24, "Tokens per answer.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.8, "0 for greedy.")
_TOP_K = flags.DEFINE_integer("top_k", 0, "Keep the k most likely tokens (0: all).")
_TOP_P = flags.DEFINE_float("top_p", 0.95, "Nucleus sampling mass.")
_SEED = flags.DEFINE_integer("seed", 0, "Weights (random policy) and sampling seed.")

PROMPTS = (
    "You are in a kitchen. There is a closed fridge here. What do you do?",
    "Your task is to: put a clean mug on the coffee machine.",
    "You see a locked wooden door to the north and a key on the table.",
    "> inventory",
)
OBSERVATION = "Nothing happens. Try something else."

# A sample of text-game lines for the built-in tokenizer (the trainer builds its own from the
# training environments' expert episodes).
_CORPUS = PROMPTS + (
    OBSERVATION,
    "You open the fridge, revealing an apple, a carton of milk and a red potato.",
    "You take the key from the table. You unlock the wooden door with the key.",
    "You are carrying: a brass key, a loaf of bread and a wet towel.",
    "> go north\n> open door\n> take apple from fridge\n> look\n> examine mug",
    "You arrive at countertop 1. On the countertop 1, you see a mug 2 and a knife 1.",
    "Your score has just gone up by one point. *** The End *** You won!",
    "The room is dark. Exits: north, south, east and west. There is a chest here.",
)


def main(argv):
    del argv
    if _CHECKPOINT.value:
        from agentrl_jax.models.hf_checkpoint import load_hf_model  # noqa: PLC0415

        policy = load_hf_model(_CHECKPOINT.value)
        tokenizer = load_tokenizer(_CHECKPOINT.value)
    else:
        cfg = preset("tiny")
        tokenizer = load_or_build_tokenizer(
            os.path.join(_WORKDIR.value, "tokenizer"), list(_CORPUS) * 20, vocab_size=1024
        )
        policy = random_policy(cfg, seed=_SEED.value, std=0.02)
    sampling = SamplingParams(_TEMPERATURE.value, _TOP_K.value, _TOP_P.value)
    stop_id = tokenizer.convert_tokens_to_ids(IM_END)
    sampler = Sampler(
        policy,
        sampling=sampling,
        stop=StopConfig(eos_ids=(stop_id,)),
        pad_id=tokenizer.pad_token_id,
    )

    def encode(role: str, text: str, first: bool) -> list[int]:
        messages = [{"role": role, "content": text}]
        chat = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        # After turn 1 the cache ends with the model's own <|im_end|>; continue on a new line.
        return tokenizer.encode(chat if first else "\n" + chat, add_special_tokens=False)

    max_new = _MAX_NEW.value
    turn1 = [encode("user", p, True) for p in PROMPTS]
    turn2 = [encode("user", OBSERVATION, False) for _ in PROMPTS]
    cache = sampler.start(len(PROMPTS), max(map(len, turn1)) + len(turn2[0]) + 2 * max_new)
    rng = jax.random.key(_SEED.value)
    for turn, feed in enumerate((turn1, turn2)):
        t0 = time.perf_counter()
        out = sampler.step_turn(cache, feed, max_new, jax.random.fold_in(rng, turn))
        actions = out.token_lists()  # waits for the device
        seconds = time.perf_counter() - t0
        cache = out.cache
        print(f"\n=== turn {turn + 1}: {seconds:.2f}s (includes compilation on first use) ===")
        for b, ids in enumerate(actions):
            shown = PROMPTS[b] if turn == 0 else OBSERVATION
            reason = DoneReason(int(out.done_reason[b])).name
            mean_lp = float(np.mean(np.asarray(out.policy_logprobs[b, : len(ids)]))) if ids else 0.0
            print(f"[{b}] user: {shown}")
            print(
                f"    policy ({len(ids)} tokens, {reason}, mean log-prob {mean_lp:.2f}): "
                f"{tokenizer.decode(ids, skip_special_tokens=True)!r}"
            )
    print(f"\ncache: {cache.size} slots per row, conversation lengths {cache.lengths.tolist()}")
    print(f"compilations: {sampler.num_traces}")


if __name__ == "__main__":
    app.run(main)
