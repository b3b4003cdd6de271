"""notebooks/quickstart.ipynb, executed top to bottom with nbclient at its smallest size."""

import json
import os
import pathlib
import re
import sys

import pytest

from agentrl_jax.run.tensorboard import read_scalars

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

REPO = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "quickstart.ipynb"
KERNEL = "agentrl-jax-test"


def _parameters_cell(nb):
    cells = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1, "the notebook needs exactly one cell tagged 'parameters'"
    return cells[0]


def test_notebook_is_stored_without_outputs_and_sized_by_one_cell():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, cell.source[:80]
    params = _parameters_cell(nb)
    assert re.search(r'^SIZE = "smoke"  # "test" \| "smoke" \| "full"$', params.source, re.M)


def _kernelspec(root: pathlib.Path) -> pathlib.Path:
    """A kernelspec for this interpreter under ``root`` (nothing downloaded, nothing user-wide)."""
    from ipykernel.kernelspec import write_kernel_spec

    path = write_kernel_spec(root / "kernels" / KERNEL)
    spec = json.loads((pathlib.Path(path) / "kernel.json").read_text())
    assert spec["argv"][0] == sys.executable  # the venv's python, with this checkout's deps
    return root


def _text(nb) -> str:
    """Every stream and text/plain output, in order."""
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                parts.append(out.text)
            elif "text/plain" in out.get("data", {}):
                parts.append(out.data["text/plain"])
    return "".join(parts)


def test_quickstart_runs_top_to_bottom(textworld_games, tmp_path, monkeypatch):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    workdir = tmp_path / "run"
    _parameters_cell(nb).source = f'SIZE = "test"\nWORKDIR = {str(workdir)!r}'
    monkeypatch.setenv("JUPYTER_PATH", str(_kernelspec(tmp_path / "jupyter")))
    monkeypatch.setenv("AGENTRL_CACHE", str(textworld_games["root"]))  # the session's games
    monkeypatch.setenv("XLA_FLAGS", "")  # one CPU device, as in Colab's CPU runtime
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    # This checkout's package (the venv may have another checkout installed in editable mode).
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    client = nbclient.NotebookClient(
        nb, kernel_name=KERNEL, timeout=600, resources={"metadata": {"path": str(tmp_path)}}
    )
    try:
        client.execute()
    finally:  # the executed notebook, to read what a failing (or passing) run printed
        nbformat.write(nb, tmp_path / "quickstart.executed.ipynb")
    text = _text(nb)

    assert "agentrl_jax is already importable: nothing to install" in text  # guarded install
    assert "RL gain" in text  # the before/after table
    # The played episode: a header, at least one turn with an observation and a command, the end.
    assert re.search(r"^EPISODE on held-out simple game \S+/\d+$", text, re.M), text[-3000:]
    turns = re.findall(r"^turn (\d+)\n  observation: (.+)\n  agent> '(.*)'  \(reward ", text, re.M)
    assert turns and [int(t[0]) for t in turns] == list(range(1, len(turns) + 1)), text[-3000:]
    assert all(obs.strip() for _, obs, _ in turns)
    assert re.search(rf"^END: {len(turns)} turns, return ", text, re.M)
    # The learning curve was drawn inline and saved.
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) == 1
    assert (workdir / "learning_curve.png").read_bytes().startswith(b"\x89PNG")

    # The run's workdir: checkpoints, TensorBoard events with SFT and RL scalars, the config.
    checkpoints = [p for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()]
    assert checkpoints and all((p / "meta").is_dir() for p in checkpoints)
    assert any("tfevents" in p.name for p in (workdir / "tensorboard").iterdir())
    scalars = read_scalars(str(workdir / "tensorboard"))
    assert sorted(step for step, _ in scalars["rollout/return"]) == [1, 2, 3]
    assert scalars["sft/nll"] and "eval/success_rate" in scalars
    assert json.loads((workdir / "config.json").read_text())["budget"]["total"] == 24
