"""The disk cache of compiled cuda kernels (:mod:`hologram.backends.cuda.kernels`): a
fresh process finds what another compiled (no Triton process started), and a different
CUDA driver, toolkit or architecture is a miss. Compiles for sm_90 with Triton (no GPU
needed); the driver versions come from the recording fake driver."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_cuda_runtime import FakeDriver, needs_triton

from hologram import backends
from hologram.backends.cuda import backend as cuda
from hologram.backends.cuda import kernels, triton_process
from hologram.frontend.graph import Graph

pytestmark = needs_triton

ROOT = Path(__file__).resolve().parents[1]

_BUILD = textwrap.dedent("""
    import hashlib, json
    from hologram import backends
    from hologram.backends.cuda import kernels, triton_process
    from hologram.frontend.graph import Graph

    g = Graph("cached")
    x = g.input("x", "f32", (64, 300))
    g.output("s", g.sum(x * 2.0, 1))
    g.output("y", x + 1.0)
    artifact = backends.builder("cuda").compile(g.program(), "sm_90")
    print(json.dumps({"info": kernels.info(), "started": sorted(triton_process._workers),
                      "digest": hashlib.sha256(artifact).hexdigest(),
                      "kernels": len(json.loads(artifact)["compiled"])}))
""")


def build_in_a_fresh_process(cache: Path) -> dict:
    env = dict(os.environ, HOLOGRAM_CACHE_DIR=str(cache))
    env.pop("HOLOGRAM_CUDA_EMULATE", None)
    env.pop("HOLOGRAM_DISABLE_DISK_CACHE", None)
    done = subprocess.run([sys.executable, "-c", _BUILD], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_fresh_process_finds_the_kernels_another_compiled(tmp_path):
    first = build_in_a_fresh_process(tmp_path)
    n = first["kernels"]
    assert n >= 2 and first["info"] == {"hits": 0, "misses": n, "stores": n}
    assert first["started"] == ["compile"]
    assert len(list((tmp_path / "cuda-kernels").glob("*/*.json"))) == n
    second = build_in_a_fresh_process(tmp_path)
    assert second["info"] == {"hits": n, "misses": 0, "stores": 0}
    assert second["started"] == []  # Triton never ran
    assert second["digest"] == first["digest"]  # the same artifact, byte for byte


def _program(name: str):
    g = Graph(name)
    g.output("y", g.input("x", "f32", (1000,)) * 3.0 - 1.0)
    return g.program()


@pytest.fixture
def compiles(monkeypatch, tmp_path):
    """Counts the requests that reach Triton."""
    monkeypatch.setenv("HOLOGRAM_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("HOLOGRAM_DISABLE_DISK_CACHE", raising=False)
    calls = []
    real = triton_process.call

    def call(mode, request, source):
        calls.append([k["name"] for k in request["kernels"]])
        return real(mode, request, source)

    monkeypatch.setattr(triton_process, "call", call)
    return calls


def test_a_different_driver_version_misses(monkeypatch, compiles):
    builder = backends.builder("cuda")
    program = _program("per_driver")
    for version in (12040, 12040, 12080, None):
        monkeypatch.setitem(cuda._GPU, "found",
                            (FakeDriver(version=version), "sm_90") if version else None)
        artifact = builder.compile(program, "sm_90")
        assert json.loads(artifact)["compiled"][0]["cubin"]
    # 12040 compiled, 12040 again found it, 12080 and no driver (an ahead-of-time build)
    # compiled afresh.
    assert len(compiles) == 3


def test_a_different_toolkit_or_architecture_misses(monkeypatch, compiles):
    builder = backends.builder("cuda")
    monkeypatch.setitem(cuda._GPU, "found", None)
    program = _program("per_toolkit")
    builder.compile(program, "sm_90")
    builder.compile(program, "sm_90")
    assert len(compiles) == 1
    builder.compile(program, "sm_80")
    assert len(compiles) == 2
    assert kernels.toolkit_version() != "unknown"
    monkeypatch.setattr(kernels, "toolkit_version", lambda: "99.0.0")
    builder.compile(program, "sm_90")
    assert len(compiles) == 3


def test_a_damaged_or_misfiled_entry_is_a_miss(monkeypatch, compiles, tmp_path):
    monkeypatch.setitem(cuda._GPU, "found", None)
    builder = backends.builder("cuda")
    builder.compile(_program("damaged"), "sm_90")
    entry, *others = sorted((tmp_path / "cuda-kernels").glob("*/*.json"))
    stored = json.loads(entry.read_text())
    digest = entry.stem
    assert kernels.load(digest) == stored["kernel"]
    other = "0" * 64  # the same file under another key's name is not that key's entry
    moved = tmp_path / "cuda-kernels" / "00" / f"{other}.json"
    moved.parent.mkdir(exist_ok=True)
    moved.write_bytes(entry.read_bytes())
    assert kernels.load(other) is None
    stored["kernel"]["cubin"] = stored["kernel"]["cubin"][:-8] + "AAAAAAA="
    entry.write_text(json.dumps(stored))
    assert kernels.load(digest) is None
    entry.write_bytes(b"\x00not json")
    assert kernels.load(digest) is None
    # Only that kernel is compiled again (the others are found), and stored again.
    builder.compile(_program("damaged"), "sm_90")
    assert compiles[1] == [stored["kernel"]["name"]] and len(compiles[0]) == 1 + len(others)
    assert kernels.load(digest)["cubin"] != stored["kernel"]["cubin"]


def test_the_disk_cache_can_be_turned_off(monkeypatch, compiles, tmp_path):
    monkeypatch.setenv("HOLOGRAM_DISABLE_DISK_CACHE", "1")
    monkeypatch.setitem(cuda._GPU, "found", None)
    builder = backends.builder("cuda")
    builder.compile(_program("uncached"), "sm_90")
    builder.compile(_program("uncached"), "sm_90")
    assert len(compiles) == 2 and not (tmp_path / "cuda-kernels").exists()
