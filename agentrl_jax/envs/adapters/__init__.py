"""Other people's environments as env families: Gymnasium text envs, OpenEnv servers, TextArena
games and verifiers tasksets, each a thin adapter from its protocol to the ``Env`` contract
(``envs/base.py``) that refuses, with the reason, what it cannot translate (docs/environments.md,
"Adapters").

    gymnasium_env.GymnasiumEnv   any registered gymnasium env with Text observations and actions
    openenv_env.OpenEnvEnv       an OpenEnv server's reset/step/state, through openenv's client
    textarena_env.TextArenaEnv   TextArena's single-player games
    verifiers_env.VerifiersEnv   a verifiers taskset's tasks, replies scored by its rewards
    tasks                        the seeded task source and splits they share

Nothing here is imported until a task or an env of one of them is asked for (the registry names
them by import path), so a run that uses none of them needs none of their packages.
"""
