r"""Does the small model learn with adapters? LoRA RL after full SFT against full RL.

    python -m launch.study --study=configs/studies/lora.py --workdir=studies/lora

The built-in default (``configs/tiny_textworld.py``: 60 demonstrations of full SFT, then 20
GRPO iterations of 64 episodes on simple games) against the same run whose RL phase trains
rank-16 adapters on every projection (``model.lora.rank=16``, ``alpha=32``, PEFT's customary
alpha of twice the rank) over the frozen SFT weights, at the same learning rate. The KL
reference, the sampler and the evaluation are as in any LoRA run (docs/models.md, "LoRA").

200 simple test games, constrained decoding, greedy, seeds 0, 1, 2; the difference is paired by
seed. About 60 minutes on 2 cores; docs/results.md.
"""


def get_study():
    return dict(
        baseline="configs/tiny_textworld.py",
        overrides={},
        variants={
            "full_rl": {},
            "lora_r16": {"model.lora.rank": 16, "model.lora.alpha": 32.0},
        },
        reference="full_rl",
        seeds=(0, 1, 2),
        evaluation=dict(split="test", num_tasks=200, levels=("simple",), decoding="constrained"),
    )
