"""The benchmark notebooks execute end to end (small sizes: HOLOGRAM_BENCH_QUICK=1) in a copy
of notebooks/, so their saved results stay out of the tree: pytorch_vs_atlas.ipynb (Hologram
through the SDK) and pytorch_vs_hologram_torch.ipynb (the same PyTorch ops on
torch.device('hologram'))."""

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


def _execute(name: str, tmp_path: Path, monkeypatch) -> str:
    """Run notebook ``name`` in ``tmp_path``; returns the text of all its outputs."""
    shutil.copy(NOTEBOOKS / name, tmp_path / name)
    monkeypatch.setenv("HOLOGRAM_BENCH_QUICK", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    # The kernel imports hologram from this checkout even when it is not installed.
    root = str(NOTEBOOKS.parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [root,
                                                                  os.environ.get("PYTHONPATH")])))
    nb = nbformat.read(tmp_path / name, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    return "\n".join(str(output.get("text", "")) + str(output.get("data", {}))
                     for cell in nb.cells if cell.cell_type == "code"
                     for output in cell.get("outputs", []))


def test_pytorch_vs_atlas_notebook_runs(tmp_path, monkeypatch):
    text = _execute("pytorch_vs_atlas.ipynb", tmp_path, monkeypatch)
    assert "Key findings (measured)" in text
    assert "All 40 cases verified" in text
    assert list(tmp_path.glob("benchmark_results_*.json"))


def test_pytorch_vs_hologram_torch_notebook_runs(tmp_path, monkeypatch):
    pytest.importorskip("hologram_torch")
    text = _execute("pytorch_vs_hologram_torch.ipynb", tmp_path, monkeypatch)
    assert "device=hologram:0" in text
    assert "Key findings (measured)" in text
    # Every device result matched CPU torch's; a failed case would be listed instead.
    assert "All 40 cases verified against PyTorch CPU" in text
    assert "CPU fallback on the device" in text
    saved = list(tmp_path.glob("benchmark_results_*.json"))
    assert saved
    from hologram.bench import load_results

    records = load_results(saved[0])
    assert len(records) == 40 and {r["backend"] for r in records} == {"hologram:0"}


def test_pytorch_vs_atlas_notebook_runs_on_webgpu(tmp_path, monkeypatch):
    """The SDK notebook on the webgpu backend (Mesa's lavapipe in CI, where
    HOLOGRAM_REQUIRE_WEBGPU=1 makes a missing adapter a failure, not a skip): every case
    verifies, pow included."""
    from hologram.backends.webgpu.backend import WebGpuBackend

    if not WebGpuBackend.is_available():
        if os.environ.get("HOLOGRAM_REQUIRE_WEBGPU", "") not in ("", "0"):
            pytest.fail("HOLOGRAM_REQUIRE_WEBGPU is set but wgpu finds no adapter")
        pytest.skip("no WebGPU adapter here (install mesa-vulkan-drivers libvulkan1)")
    monkeypatch.setenv("HOLOGRAM_BACKEND", "webgpu")
    text = _execute("pytorch_vs_atlas.ipynb", tmp_path, monkeypatch)
    assert "(backend webgpu)" in text and "Key findings (measured)" in text
    failed = [line for line in text.splitlines() if "VERIFICATION FAILED" in line]
    assert not failed, failed
    assert "All 40 cases verified" in text
