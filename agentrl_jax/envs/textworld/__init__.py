"""The TextWorld env family: generated text games (``games.py``: games, their cache and the
family's task source) and the env (``env.py``), registered by path in ``envs/registry.py``."""
