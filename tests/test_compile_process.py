"""The compile helper process (hologram/runtime/compile_process.py): programs built there
into the disk cache, then loaded here without a compile."""

import pickle
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

import hologram
from hologram.compiler import cache as cache_mod
from hologram.frontend.graph import Graph
from hologram.runtime import compile_process, launch


def _softmax(rows: int) -> hologram.isa.ir.Program:
    g = Graph(f"softmax_{rows}")
    x = g.input("x", "f32", (rows, 37))
    e = g.unary("exp", x - g.max(x, 1, keepdim=True))
    g.output("y", e / g.sum(e, 1, keepdim=True))
    return g.program()


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("HOLOGRAM_DISABLE_DISK_CACHE", raising=False)
    monkeypatch.setenv("HOLOGRAM_CACHE_DIR", str(tmp_path))
    monkeypatch.setitem(compile_process._state, "failures", 0)
    launch.clear_memo()
    return tmp_path


def test_a_program_built_there_loads_here_from_disk(cache_dir) -> None:
    program = _softmax(5)
    builds = compile_process.stats()["builds"]
    assert compile_process.build(program, "cpu")
    assert compile_process.stats()["builds"] == builds + 1
    assert compile_process.stats()["running"]
    before = hologram.cache_info()
    compiled = hologram.compile(program, "cpu")
    after = hologram.cache_info()
    assert (after["disk_hits"], after["misses"]) == (before["disk_hits"] + 1, before["misses"])
    x = np.random.default_rng(0).standard_normal((5, 37)).astype(np.float32)
    want = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(compiled(x), want / want.sum(1, keepdims=True), rtol=1e-6)
    # The full build: nothing is left to promote.
    assert compiled.executable.final and compiled.executable.tier == "full"


def test_elementwise_programs_are_built_as_the_template_compile_loads(cache_dir) -> None:
    g = Graph("scale")
    x = g.input("x", "f32", (1000,))
    g.output("y", g.unary("exp", x) * 2.0)
    assert compile_process.build(g.program(), "cpu")
    before = hologram.cache_info()
    hologram.compile(g.program(), "cpu")
    assert hologram.cache_info()["misses"] == before["misses"]


def test_where_it_cannot_build_the_caller_compiles(cache_dir, monkeypatch) -> None:
    program = _softmax(6)
    assert not compile_process.build(program, "interp")  # not a backend built there
    monkeypatch.setenv("HOLOGRAM_DISABLE_DISK_CACHE", "1")
    assert not compile_process.build(program, "cpu")
    monkeypatch.delenv("HOLOGRAM_DISABLE_DISK_CACHE")
    # A cache directory that cannot be made: the helper answers that it wrote nothing.
    monkeypatch.setenv("HOLOGRAM_CACHE_DIR", "/proc/hologram-no-such-directory")
    failures = compile_process.stats()["failures"]
    assert not compile_process.build(program, "cpu")
    assert compile_process.stats()["failures"] == failures + 1
    monkeypatch.setitem(compile_process._state, "failures", compile_process.MAX_FAILURES)
    monkeypatch.setenv("HOLOGRAM_CACHE_DIR", str(cache_dir))
    assert not compile_process.build(program, "cpu")  # given up on after repeated failures


def test_a_helper_that_died_is_started_again(cache_dir) -> None:
    assert compile_process.build(_softmax(7), "cpu")
    process = compile_process._state["process"]
    process.kill()
    process.wait()
    assert compile_process.build(_softmax(8), "cpu")
    assert compile_process._state["process"] is not process
    before = cache_mod.cache_info()["misses"]
    hologram.compile(_softmax(8), "cpu")
    assert cache_mod.cache_info()["misses"] == before


def test_a_helper_whose_parent_left_before_the_reply_exits_quietly(cache_dir) -> None:
    """A parent that exits without stopping its helper (os._exit, a signal) leaves a build
    running; its reply then meets a closed pipe: the helper exits, printing nothing on the
    terminal it shares with the parent."""
    from hologram.compiler.options import CompileOptions

    process = compile_process._start(stderr=subprocess.PIPE)
    process.stdout.close()  # the parent's end of the replies: gone before the reply
    request = pickle.dumps({"program": _softmax(9), "backend": "cpu",
                            "options": CompileOptions.from_env(),
                            "environment": {"HOLOGRAM_CACHE_DIR": str(cache_dir)}})
    process.stdin.write(struct.pack("<Q", len(request)) + request)
    process.stdin.close()
    # (stderr captured, not inherited, to see what the helper would print)
    assert process.stderr.read() == b""
    assert process.wait() == 0
