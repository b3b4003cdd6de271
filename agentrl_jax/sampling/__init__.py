"""Jitted multi-turn generation over a KV cache kept between turns.

The API the trainer calls::

    from agentrl_jax.sampling import Sampler, SamplingParams, StopConfig

    sampler = Sampler(policy, sampling=SamplingParams(temperature=1.0, top_p=0.95),
                      stop=StopConfig(eos_ids=(im_end_id,)), pad_id=pad_id)
    cache = sampler.start(batch=B, cache_size=max_episode_tokens)
    out = sampler.step_turn(cache, first_prompt_ids_per_row, max_new_tokens=64, rng=key0)
    # out.tokens [B, W], out.logprobs [B, W], out.policy_logprobs [B, W], out.lengths [B],
    # out.done_reason [B] (DoneReason), out.cache
    out = sampler.step_turn(out.cache, env_reply_ids_per_row, max_new_tokens=64, rng=key1)
    sampler.set_state(new_policy_state)  # after a train step; no recompilation

Each turn prefills only the new tokens of each row (the first prompt, then the environment's
reply) after the row's cached conversation, in one forward pass, then decodes in a
``lax.while_loop``; every generated token, the last one included, is in the cache when the
turn returns, so the history is never re-encoded. Rows with no new tokens are inactive and
untouched. Chunk lengths, cache sizes and output widths are rounded up to buckets, so a new
compilation happens only for a new bucket (``Sampler.num_traces`` counts them).

Log-probs: ``logprobs`` are under the processed distribution actually sampled from (temperature,
top-k, top-p; equal to log_softmax(logits / T) when nothing is filtered), ``policy_logprobs``
under the raw policy at temperature 1 (what a teacher-forced forward pass gives). See
docs/sampler.md.
"""

from agentrl_jax.sampling.loop import TurnArrays, run_turn
from agentrl_jax.sampling.params import GREEDY, DoneReason, SamplingParams, StopConfig
from agentrl_jax.sampling.sampler import Sampler, TurnOutput

__all__ = [
    "GREEDY",
    "DoneReason",
    "Sampler",
    "SamplingParams",
    "StopConfig",
    "TurnArrays",
    "TurnOutput",
    "run_turn",
]
