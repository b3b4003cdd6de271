"""The launch code: thin command-line entry points, what they share on the command line
(``cli``) and the per-host command lines of a multi-host run (``launchers``); the logic lives in
``agentrl_jax``."""
