r"""ALFWorld (the real json_2.1.1 tasks) with GRPO: ``configs/alfworld_gagpo.py`` with
``rl.algo='grpo'`` and a token-level PPO ratio (everything else is shared, so the three ALFWorld
runs differ only in credit assignment).

    python -m launch.train --config=configs/alfworld_grpo.py --workdir=runs/alfworld_grpo \
        --config.model.checkpoint=/models/Qwen2.5-1.5B-Instruct
"""

import ml_collections

from configs import alfworld_gagpo


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = alfworld_gagpo.get_config(arg)
    c.rl.update(algo="grpo", ratio_level="token")
    return c
