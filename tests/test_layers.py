"""The house's layers (issue #33, docs/architecture.md "Where each piece lives"): each folder of
agentrl_jax is one stage of the data flow, and nothing imports from a layer above its own.

    parts        models/ sampling/ kernels/ envs/ sharding timing chaos stats compile_cache
                 (envs/: the contract, registry and actor pool; each env family a subpackage)
    rl, rollout  the learner's math; episodes, waves, tasks by family, chat templates
    run          config, the trainer's assembly and phase loop, held-out evaluation and its
                 reports, checkpoints, multi-host, ...
    experiments  learning curves, studies and their tables, the memory plan; benchmarks/ (tooling)
    api          agentrl_jax/__init__.py (lazy re-exports)
    launch/      outside the package: the entry points, cli.py and launchers.py

Every import of every module counts, at the top and inside functions alike (a deferred import is
still a dependency). Today's code breaks the rule in a few places, and had a few import cycles:
they are listed below, each with its reason. The lists only shrink: a new violation or cycle
fails, and so does a listed one that is gone (delete it from the list, that is the point).

A thing has one name: the old names of moved modules (``agentrl_jax.training.X``,
``agentrl_jax.launchers``, ...) are gone, not aliases (the last test here).
"""

from __future__ import annotations

import ast
import os
import pathlib

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
    assert "agentrl_jax.envs.swe.grading" in GRAPH["agentrl_jax.envs.swe.tasks"]  # deferred
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


# The env families, each a subpackage of envs/ (registered by import path in envs/registry.py).
ENV_FAMILIES = ("textworld", "alfworld", "swe")


def _family(name: str) -> str | None:
    """The env family module ``name`` belongs to, or None."""
    parts = name.split(".")
    if parts[:2] == ["agentrl_jax", "envs"] and len(parts) > 2 and parts[2] in ENV_FAMILIES:
        return parts[2]
    return None


def test_envs_imports_no_env_family():
    """envs/ outside the family subpackages (the contract, the registry, the actor pool) imports
    no family, and a family imports no other family: the registry names them by path."""
    assert {_family(n) for n in MODULES} >= set(ENV_FAMILIES), "a family subpackage is missing"
    found = sorted(
        f"{a} -> {b}"
        for a, targets in GRAPH.items()
        if a.startswith("agentrl_jax.envs")
        for b in targets
        if _family(b) and _family(b) != _family(a)
    )
    assert not found, f"envs/ imports an env family: {found}"


# A package file over this many lines is split by job (STYLE.md: files of a few hundred lines).
MAX_LINES = 800


def test_no_package_file_over_800_lines():
    long = {
        str(path.relative_to(REPO)): n
        for path in MODULES.values()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"files over {MAX_LINES} lines (split them by job): {long}"


# Module names that were moved (issue #33) and are no more: one name per thing.
OLD_NAMES = (
    "agentrl_jax.training",
    "agentrl_jax.training.trainer",
    "agentrl_jax.launchers",
    "agentrl_jax.run.cli",
    "agentrl_jax.run.defaults",
    "agentrl_jax.experiments.stats",
    "agentrl_jax.swe",
    "agentrl_jax.envs.games",
    "agentrl_jax.envs.textworld_env",
    "agentrl_jax.envs.alfworld_data",
)


def test_the_old_names_are_gone():
    """Nothing in the repository uses a moved module's old name, and no module has it."""
    here = pathlib.Path(__file__).resolve()
    old = []
    for folder in ("agentrl_jax", "launch", "configs", "scripts", "notebooks", "tests", "docs"):
        for path in sorted((REPO / folder).rglob("*")):
            if path.suffix not in (".py", ".ipynb", ".sh", ".md") or path == here:
                continue
            text = path.read_text()
            old += [f"{path.relative_to(REPO)}: {name}" for name in OLD_NAMES if name in text]
    assert not old, f"old module names in {old}"
    for name in OLD_NAMES:
        path = REPO / name.replace(".", os.sep)
        assert not path.with_suffix(".py").exists() and not path.is_dir(), f"{name} is back"
