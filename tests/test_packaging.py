"""The distribution: one version source, the changelog, the program cache keyed by the
version, the name and extras, and (where a compiler is present) that a wheel carries the
native parts prebuilt. The wheel installed without a compiler is checked by .ci/package."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import tomllib

import hologram
from hologram.compiler import cache as cache_mod
from hologram.frontend.graph import Graph
from hologram.runtime import launch
from hologram.version import DISTRIBUTION

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_version_has_one_source():
    project = PYPROJECT["project"]
    assert "version" not in project and "version" in project["dynamic"]
    dynamic = PYPROJECT["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "hologram.version.__version__"}
    assert importlib.metadata.version(DISTRIBUTION) == hologram.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", hologram.__version__)


def test_changelog_heads_with_this_version():
    text = (ROOT / "CHANGELOG.md").read_text()
    releases = re.findall(r"^## (\S+)", text, re.M)
    assert releases[0] == hologram.__version__
    assert "0.1.0" in releases


def test_extras_refer_to_this_distribution():
    project = PYPROJECT["project"]
    assert project["name"] == DISTRIBUTION == "hologram-tensor"
    extras = project["optional-dependencies"]
    assert extras["all"] == [f"{DISTRIBUTION}[torch,bench,webgpu,cuda]"]
    assert set(extras) >= {"torch", "bench", "webgpu", "cuda", "docs", "all", "test"}
    # every torch requirement is the one supported release (constraints.txt pins it)
    for name, requirements in extras.items():
        for requirement in requirements:
            if requirement.startswith("torch"):
                assert requirement == "torch>=2.13,<2.14", (name, requirement)


def _build_once() -> hologram.Artifact:
    g = Graph("version_keyed")
    x = g.input("x", "f32", (8,))
    g.output("y", x * 2.0)
    return hologram.build(g.program(), "interp")


def test_cache_entries_are_keyed_by_the_version(monkeypatch, tmp_path):
    """An upgrade never loads an artifact another release built: the same program under
    another version is a miss and a new disk entry."""
    monkeypatch.setenv("HOLOGRAM_CACHE_DIR", str(tmp_path))
    hologram.clear_cache(disk=False)
    first = _build_once()
    assert first.key.version.startswith(hologram.__version__ + "+")
    assert hologram.cache_info()["disk_entries"] == 1
    hologram.clear_cache(disk=False)
    _build_once()
    assert hologram.cache_info()["disk_hits"] == 1  # same version: served from disk

    # compiler_version() is computed once, at import (see its module); its formula is
    # called here directly, and launches take its value through the name they imported.
    monkeypatch.setattr(cache_mod, "__version__", "99.0.0")
    upgraded = cache_mod.compiler_version.__wrapped__("cpu")
    assert upgraded.startswith("99.0.0+")
    monkeypatch.setattr(launch, "compiler_version", lambda backend: upgraded)
    hologram.clear_cache(disk=False)
    second = _build_once()
    info = hologram.cache_info()
    assert second.key.version == upgraded
    assert second.key.digest() != first.key.digest()
    assert (info["disk_hits"], info["misses"], info["disk_entries"]) == (0, 1, 2)


def test_prebuilt_hooks_are_loaded_only_for_their_torch(monkeypatch, tmp_path):
    """A wheel's library is used when it is named for this torch build; one for another
    torch is not, and a machine without a compiler is told which torch it is for."""
    import hologram_torch.native as native

    monkeypatch.setattr(native, "PREBUILT", tmp_path)
    monkeypatch.setattr(native, "MANIFEST", tmp_path / "hooks.json")
    (tmp_path / "hooks.json").write_text('{"torch": "2.13.0+cu999", "library": "x.so"}')
    (tmp_path / "hologram_torch_hooks_0000000000000000.so").write_bytes(b"")
    assert native.library_path().parent == native.build_directory()
    assert native.prebuilt_for() == "2.13.0+cu999"

    monkeypatch.setenv("CXX", "no-such-compiler-here")
    monkeypatch.setattr(native, "library_path", lambda: tmp_path / "absent" / "lib.so")
    try:
        native.build()
    except hologram.CompileError as err:
        message = str(err)
    else:
        raise AssertionError("build() without a compiler did not raise")
    assert "no-such-compiler-here" in message
    assert "prebuilt hooks are for torch 2.13.0+cu999" in message
    assert "install torch==2.13.0+cu999, or install a C++ compiler" in message

    monkeypatch.undo()
    monkeypatch.setattr(native, "PREBUILT", tmp_path)
    mine = tmp_path / f"{native._name()}.so"
    mine.write_bytes(b"")
    assert native.library_path() == native.prebuilt_path() == mine
    assert native.build() == mine
    assert native.state()["origin"] == "prebuilt"
