r"""ALFWorld (the real json_2.1.1 tasks) with GiGPO: ``configs/alfworld_gagpo.py`` with
``rl.algo='gigpo'`` and a token-level PPO ratio (everything else is shared, so the three ALFWorld
runs differ only in credit assignment).

    python -m launch.train --config=configs/alfworld_gigpo.py --workdir=runs/alfworld_gigpo \
        --config.model.checkpoint=/models/Qwen2.5-1.5B-Instruct
"""

import ml_collections

from configs import alfworld_gagpo


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = alfworld_gagpo.get_config(arg)
    c.rl.update(algo="gigpo", ratio_level="token")
    return c
