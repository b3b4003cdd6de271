"""The ALFWorld env family: the data and the task source in spread order (``data.py``), the
engine's lock (``engine.py``), the env (``env.py``), its games and scenes (``games.py``,
``scenes.py``) and the engine's memoized parses and on-disk PDDL translations
(``speedups.py``), registered by path in ``envs/registry.py``."""
