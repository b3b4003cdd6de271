r"""A config saved as JSON: a run's ``config.json``, or a study cell's ``cell_config.json``.

    python -m launch.train --config=configs/from_json.py:runs/tiny/config.json --workdir=runs/again

``launch.study`` runs every cell of a study this way: it writes the cell's whole config (the
baseline with the study's and the variant's overrides, the seed, the evaluation settings) to the
cell's folder and starts ``launch.train`` on it, so the file records exactly what the cell ran.
"""

import json

import ml_collections


def get_config(path: str | None = None) -> ml_collections.ConfigDict:
    if not path:
        raise ValueError(
            "configs/from_json.py needs the JSON's path: --config=configs/from_json.py:PATH"
        )
    with open(path) as f:
        return ml_collections.ConfigDict(json.load(f))
