"""The SWE coding domain: bug-fix tasks in real repositories, graded by their own unit tests.

Public API (see docs/swe.md):

    tasks.load_jsonl(path) -> list[SweTask]            SWE-Gym / SWE-bench records
    env.SweEnv(tasks, runtime_factory, max_turns, reward)    the Env contract
    runtime.LocalRuntime / docker_runtime.DockerRuntime      reset, exec, files, diff, evaluate
    sandbox.Sandbox(workspace, Limits(...)).run(command)     the jail around untrusted code
    build.build_tasks(package_dir, out_dir, config=BuildConfig(...))   SWE-smith-style builder
"""
