"""notebooks/pytorch_vs_atlas.ipynb executes end to end (small sizes:
HOLOGRAM_BENCH_QUICK=1) in a copy of notebooks/, so its saved results stay out of the tree."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")
pytest.importorskip("pandas")
pytest.importorskip("torch")

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def test_pytorch_vs_atlas_notebook_runs(tmp_path, monkeypatch):
    for name in ("pytorch_vs_atlas.ipynb", "benchmark_utils.py"):
        shutil.copy(NOTEBOOKS / name, tmp_path / name)
    monkeypatch.setenv("HOLOGRAM_BENCH_QUICK", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    # The kernel imports hologram from this checkout even when it is not installed.
    root = str(NOTEBOOKS.parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [root,
                                                                  os.environ.get("PYTHONPATH")])))
    nb = nbformat.read(tmp_path / "pytorch_vs_atlas.ipynb", as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    text = "\n".join(str(output.get("text", "")) + str(output.get("data", {}))
                     for cell in nb.cells if cell.cell_type == "code"
                     for output in cell.get("outputs", []))
    assert "Key findings (measured)" in text
    assert "All 40 cases verified" in text
    assert list(tmp_path.glob("benchmark_results_*.json"))
