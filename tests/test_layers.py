"""The house's layers (issue #33, docs/architecture.md "Where each piece lives"): each folder of
agentrl_jax is one stage of the data flow, and nothing imports from a layer above its own.

    parts        models/ sampling/ kernels/ envs/ swe/ sharding timing chaos stats compile_cache
    rl, rollout  the learner's math; episodes, waves, tasks by family, chat templates
    run          config, the trainer's assembly and phase loop, held-out evaluation and its
                 reports, checkpoints, multi-host, ...
    experiments  learning curves, studies and their tables, the memory plan; benchmarks/ (tooling)
    api          agentrl_jax/__init__.py (lazy re-exports) and the deprecated agentrl_jax.training
    launch/      outside the package: the entry points, cli.py and launchers.py

Every import of every module counts, at the top and inside functions alike (a deferred import is
still a dependency). Today's code breaks the rule in a few places, and had a few import cycles:
they are listed below, each with its reason. The lists only shrink: a new violation or cycle
fails, and so does a listed one that is gone (delete it from the list, that is the point).

The old ``agentrl_jax.training.X`` names, and the launch code's old names in the package
(``agentrl_jax.launchers``, ``agentrl_jax.run.cli``), are aliases of the moved modules for one
release: they import as the new module and warn (the last tests here).
"""

from __future__ import annotations

import ast
import importlib
import os
import pathlib
import subprocess
import sys
import textwrap

REPO = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = REPO / "agentrl_jax"

# Top-level part of agentrl_jax -> its layer; a higher layer may import a lower or its own.
LAYER_OF = {
    **dict.fromkeys(
        (
            "models",
            "sampling",
            "kernels",
            "envs",
            "swe",
            "sharding",
            "timing",
            "chaos",
            "stats",
            "compile_cache",
        ),
        "parts",
    ),
    "rl": "rl",
    "rollout": "rollout",
    "run": "run",
    "experiments": "experiments",
    "benchmarks": "experiments",  # tooling, run by launch.bench
    "": "api",  # agentrl_jax/__init__.py: the public names (imported lazily, by name)
    "_aliases": "api",  # the import hook of the old names below
    "training": "api",  # the deprecated aliases, for users only
}
# rl and rollout share a layer: rl/ reads rollout/'s Trajectory and ChatTemplate (the hand-over
# between the two), and rollout/ imports nothing of rl/ today.
LEVEL = {"parts": 0, "rl": 1, "rollout": 1, "run": 2, "experiments": 3, "api": 4}

# Imports from a layer above the importer's: none left (issue #33's follow-ups removed the last).
KNOWN_VIOLATIONS: set[str] = set()

# Import cycles between modules (strongly connected components), as they stand: none left.
KNOWN_CYCLES: set[frozenset[str]] = set()


def _modules() -> dict[str, pathlib.Path]:
    """``{dotted module name: file}`` of every module of the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: pathlib.Path) -> set[str]:
    """The package's modules that module ``name`` imports, anywhere in its body."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            # ``from a import b``: the module a.b if there is one, else a name of a.
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names
            ]
        else:
            continue
        for target in targets:
            # ``import a.b.c`` of a name that is not a module: its longest module prefix.
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _layer(name: str) -> str:
    top = name.split(".")[1] if "." in name else ""
    assert top in LAYER_OF, (
        f"{name}: agentrl_jax/{top} has no layer; place it in LAYER_OF (tests/test_layers.py) "
        f"and in docs/architecture.md's table"
    )
    return LAYER_OF[top]


def _violations() -> set[str]:
    return {
        f"{a} -> {b}"
        for a, targets in GRAPH.items()
        for b in targets
        if LEVEL[_layer(b)] > LEVEL[_layer(a)]
    }


def _cycles() -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), set()

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(GRAPH[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                out.add(frozenset(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return out


def test_the_import_graph_is_read():
    """A guard on the parser: edges the package is known to have are found."""
    assert "agentrl_jax.rl.learner" in GRAPH["agentrl_jax.run.trainer"]
    assert "agentrl_jax.kernels" in GRAPH["agentrl_jax.rl.learner"]  # from agentrl_jax import x
    assert "agentrl_jax.swe.grading" in GRAPH["agentrl_jax.swe.tasks"]  # deferred
    assert all(name.startswith("agentrl_jax") for name in MODULES)


def test_every_module_has_a_layer():
    for name in MODULES:
        _layer(name)


def test_no_import_from_a_layer_above():
    found = _violations()
    new, gone = sorted(found - KNOWN_VIOLATIONS), sorted(KNOWN_VIOLATIONS - found)
    assert not new, (
        "imports from a layer above the importer's (parts < rl, rollout < run < experiments): "
        + "; ".join(new)
        + ". Move the shared piece down, or pass it in from above."
    )
    assert not gone, (
        "fixed, well done: delete these from KNOWN_VIOLATIONS in tests/test_layers.py: "
        + "; ".join(gone)
    )


def test_no_new_import_cycle():
    found = _cycles()
    new, gone = found - KNOWN_CYCLES, KNOWN_CYCLES - found
    assert not new, f"import cycles between modules: {_show(new)}"
    assert not gone, f"cycles gone (or changed): delete them from KNOWN_CYCLES: {_show(gone)}"


def _show(cycles: set[frozenset[str]]) -> str:
    return "; ".join(" <-> ".join(sorted(c)) for c in sorted(cycles, key=sorted))


def test_nothing_in_the_repository_uses_the_old_names():
    """The ``agentrl_jax.training`` aliases are for users: the package, launchers, configs,
    scripts, notebooks and tests (this file aside) import the new paths, and training/ holds no
    module of its own (a new one goes to the folder of its job)."""
    assert sorted(p.name for p in (PACKAGE / "training").glob("*.py")) == ["__init__.py"]
    assert not any(t == "agentrl_jax.training" for targets in GRAPH.values() for t in targets), (
        "a module of the package imports agentrl_jax.training"
    )
    here = pathlib.Path(__file__).resolve()
    old = []
    for folder in ("agentrl_jax", "launch", "configs", "scripts", "notebooks", "tests"):
        for path in sorted((REPO / folder).rglob("*")):
            if path.suffix not in (".py", ".ipynb", ".sh") or path == here:
                continue
            if path.parent == PACKAGE / "training":
                continue
            text = path.read_text()
            if "agentrl_jax.training" in text or "agentrl_jax/training" in text:
                old.append(str(path.relative_to(REPO)))
    assert not old, f"old agentrl_jax.training names in {old}"


def test_old_names_are_the_moved_modules():
    import warnings

    from agentrl_jax import training

    assert len(training.MOVED) == 30  # every module training/ had, its __init__.py aside
    for old in training.MOVED:
        new = training.new_name(old)
        assert (REPO / (new.replace(".", os.sep) + ".py")).is_file(), new
    for old in ("paths", "stats", "chaos"):  # light ones; the subprocess below imports them all
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            alias = importlib.import_module(f"agentrl_jax.training.{old}")
        assert alias is importlib.import_module(training.new_name(old))
        assert getattr(training, old) is alias and old in dir(training)


def test_old_names_import_warn_once_and_share_the_module():
    """In a fresh interpreter: every old name imports (``from agentrl_jax.training.X import Y``
    and ``import agentrl_jax.training.X`` alike) as the moved module itself, warns once, naming
    the new path, at the importing line; a monkeypatch through the old name reaches the new."""
    code = textwrap.dedent(
        """
        import importlib, warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            from agentrl_jax.training.trainer import Trainer
            import agentrl_jax.training.trainer
            from agentrl_jax.training import trainer
        import agentrl_jax.run.trainer as new
        assert trainer is new and agentrl_jax.training.trainer is new and Trainer is new.Trainer
        assert [str(w.message).split(" ")[:1] for w in caught] == [["agentrl_jax.training.trainer"]]
        assert "import agentrl_jax.run.trainer" in str(caught[0].message)
        assert caught[0].category is DeprecationWarning and caught[0].filename == "<string>"
        from agentrl_jax import training
        for old in training.MOVED:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                alias = importlib.import_module("agentrl_jax.training." + old)
            assert alias is importlib.import_module(training.new_name(old)), old
        import pytest
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr("agentrl_jax.training.paths.is_url", lambda path: "patched")
            from agentrl_jax.run import paths
            assert paths.is_url("x") == "patched"
        print("ok")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_the_launch_codes_old_names_import_the_moved_modules_and_warn_once():
    """``agentrl_jax.launchers`` and ``agentrl_jax.run.cli`` moved to launch/ (nothing below the
    launch layer uses them); the old names import as the new modules, warning once each."""
    code = textwrap.dedent(
        """
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            from agentrl_jax import launchers
            import agentrl_jax.launchers
            from agentrl_jax.run import cli
            from agentrl_jax.run.cli import fail
        import launch.cli, launch.launchers
        assert launchers is launch.launchers and agentrl_jax.launchers is launch.launchers
        assert cli is launch.cli and fail is launch.cli.fail
        messages = [str(w.message) for w in caught]
        old = ["agentrl_jax.launchers", "agentrl_jax.run.cli"]
        assert [m.split(" ")[0] for m in messages] == old
        assert "import launch.launchers" in messages[0] and "import launch.cli" in messages[1]
        assert all(w.category is DeprecationWarning and w.filename == "<string>" for w in caught)
        print("ok")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
    assert not (PACKAGE / "launchers.py").exists() and not (PACKAGE / "run" / "cli.py").exists()


def test_modules_moved_down_import_under_their_old_names_and_warn_once():
    """``agentrl_jax.experiments.stats`` moved down to the parts (``agentrl_jax.stats``: the run's
    evaluation reads it); the old name imports as the new module, warning once."""
    code = textwrap.dedent(
        """
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            from agentrl_jax.experiments import stats
            import agentrl_jax.experiments.stats
            from agentrl_jax.experiments.stats import wilson_interval
        import agentrl_jax.stats as new
        assert stats is new and agentrl_jax.experiments.stats is new
        assert wilson_interval is new.wilson_interval
        messages = [str(w.message) for w in caught]
        assert [m.split(" ")[0] for m in messages] == ["agentrl_jax.experiments.stats"], messages
        assert "import agentrl_jax.stats" in messages[0]
        assert all(w.category is DeprecationWarning and w.filename == "<string>" for w in caught)
        print("ok")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
    assert not (PACKAGE / "experiments" / "stats.py").exists()
