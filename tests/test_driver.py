"""hologram.compile: calling convention, errors, and the program cache end to end."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

import hologram
from hologram.errors import DeviceError, DTypeError, ShapeError
from hologram.frontend.graph import Graph

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    directory = tmp_path / "cache"
    monkeypatch.setenv("HOLOGRAM_CACHE_DIR", str(directory))
    hologram.clear_cache()
    yield directory
    hologram.clear_cache()


def axpy(spelling: str, names="xyz"):
    g = Graph("axpy")
    x, y = g.input(names[0], "f32", (64,)), g.input(names[1], "f32", (64,))
    g.output(names[2], x * 2.0 + y if spelling == "a" else y + (x + x))
    return g.program()


def test_compile_and_call():
    compiled = hologram.compile(axpy("a"))
    x = np.arange(64, dtype=np.float32)
    y = np.ones(64, dtype=np.float32)
    np.testing.assert_array_equal(compiled(x, y), 2 * x + y)
    out = np.empty(64, dtype=np.float32)
    assert compiled(x, y, out) is out
    np.testing.assert_array_equal(out, 2 * x + y)


def test_spellings_share_one_cache_entry(cache_dir):
    first = hologram.compile(axpy("a"))
    second = hologram.compile(axpy("b", names="abc"))
    assert first.key == second.key
    info = hologram.cache_info()
    assert info["misses"] == 1 and info["hits"] == 1
    assert info["disk_entries"] == 1
    assert hologram.compile(axpy("a")) is first  # the exact program: in-process memo


def test_options_and_backend_are_part_of_the_key():
    plain = hologram.compile(axpy("a"))
    fast = hologram.compile(axpy("a"), options=hologram.CompileOptions(fast_math=True))
    assert plain.key.digest() != fast.key.digest()
    assert plain.key.version.startswith(hologram.__version__ + "+")
    with pytest.raises(DeviceError, match=r"unknown backend 'tpu'.*interp"):
        hologram.compile(axpy("a"), backend="tpu")


def test_the_code_generators_sources_are_part_of_the_key(tmp_path, monkeypatch):
    # A copy of the package with one backend source changed gets another version for that
    # backend (and for all of them together), the same for another backend.
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    package = Path(hologram.__file__).parent
    shutil.copytree(package, tmp_path / "hologram", ignore=shutil.ignore_patterns("__pycache__"))
    code = ("from hologram.compiler.cache import compiler_version as v; "
            "print(v(), v('cpu'), v('cuda'))")

    def versions() -> list[str]:
        return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True,
                              capture_output=True, text=True).stdout.split()

    from hologram.compiler.cache import compiler_version

    before = versions()
    assert before == [compiler_version(), compiler_version("cpu"), compiler_version("cuda")]
    assert len(set(before)) == 3
    with open(tmp_path / "hologram/backends/cpu/mathlib.py", "a") as f:
        f.write("\n# changed\n")
    after = versions()  # every backend's and cpu's change; cuda's artifacts stay valid
    assert after[0] != before[0] and after[1] != before[1] and after[2] == before[2]
    with open(tmp_path / "hologram/codegen/numerics.py", "a") as f:
        f.write("\n# changed\n")
    assert all(a != b for a, b in zip(versions(), after))  # shared: all change


def test_bad_arrays_are_rejected_with_the_parameter_named():
    compiled = hologram.compile(axpy("a"))
    x = np.zeros(64, dtype=np.float32)
    with pytest.raises(DTypeError, match=r"parameter y \(in f32\[64\]\): expected f32.*float64"):
        compiled(x, np.zeros(64))
    with pytest.raises(ShapeError, match=r"parameter x .*: expected 64 elements"):
        compiled(np.zeros(63, dtype=np.float32), x)
    with pytest.raises(ShapeError, match="takes 3 arrays"):
        compiled(x)
    with pytest.raises(ShapeError, match="C-contiguous"):
        compiled(np.zeros(128, dtype=np.float32)[::2], x)
    with pytest.raises(DTypeError, match="NumPy array"):
        compiled([0.0] * 64, x)


def _spawn(code: str, cache_dir: Path) -> subprocess.Popen:
    """A fresh Python process sharing the cache directory, running ``code``."""
    prelude = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT / "tests")!r})
        import numpy as np, hologram
        from test_driver import axpy
    """)
    env = {"HOLOGRAM_CACHE_DIR": str(cache_dir), "PATH": "/usr/bin:/bin",
           "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", prelude + textwrap.dedent(code)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _child(code: str, cache_dir: Path) -> tuple[list[str], str]:
    """Run ``code`` in a new process; its stdout words (it must exit 0)."""
    proc = _spawn(code, cache_dir)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return out.split(), err


def test_a_new_process_loads_from_disk(cache_dir):
    hologram.compile(axpy("a"))
    out, _ = _child("""
        c = hologram.compile(axpy("b"))
        x = np.arange(64, dtype=np.float32)
        assert (c(x, x) == 3 * x).all()
        info = hologram.cache_info()
        print(info["disk_hits"], info["misses"])
    """, cache_dir)
    assert out == ["1", "0"]


def test_a_corrupted_entry_is_recompiled(cache_dir):
    compiled = hologram.compile(axpy("a"))
    (entry,) = cache_dir.rglob("*.bin")
    data = bytearray(entry.read_bytes())
    data[-5] ^= 0xFF
    entry.write_bytes(bytes(data))
    out, _ = _child("""
        c = hologram.compile(axpy("a"))
        x = np.arange(64, dtype=np.float32)
        assert (c(x, x) == 3 * x).all()
        info = hologram.cache_info()
        print(info["corrupt"], info["misses"])
    """, cache_dir)
    assert out == ["1", "1"]
    # the entry is the program's quick build on the cpu (docs/compiler.md, "Tiers")
    assert entry.stem in (compiled.key.digest(), compiled.key.quick().digest())


def test_a_valid_entry_that_does_not_parse_is_recompiled(cache_dir):
    from hologram.compiler.cache import _pack

    hologram.compile(axpy("a"))
    (entry,) = cache_dir.rglob("*.bin")
    # An intact file written for this very key, but not a program.
    entry.write_bytes(_pack(entry.stem, b"program broken {"))
    out, _ = _child("""
        c = hologram.compile(axpy("a"))
        x = np.arange(64, dtype=np.float32)
        assert (c(x, x) == 3 * x).all()
        print(hologram.cache_info()["corrupt"])
    """, cache_dir)
    assert out == ["1"]


def test_two_processes_compiling_at_once_both_succeed(cache_dir):
    code = """
        c = hologram.compile(axpy("a"))
        x = np.arange(64, dtype=np.float32)
        assert (c(x, x) == 3 * x).all()
        print(hologram.cache_info()["misses"])
    """
    procs = [_spawn(code, cache_dir) for _ in range(3)]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert out.split() in (["0"], ["1"])
    assert len(list(cache_dir.rglob("*.bin"))) == 1
    assert not list(cache_dir.rglob(".tmp-*"))


def test_clear_cache_forgets_everything(cache_dir):
    hologram.compile(axpy("a"))
    hologram.clear_cache()
    assert not list(cache_dir.rglob("*.bin"))
    hologram.compile(axpy("a"))
    assert hologram.cache_info()["misses"] == 1


def _cpu_only():
    if "cpu" not in hologram.backends.available():
        pytest.skip("the cpu backend cannot run here")


def test_a_hot_program_is_promoted_to_the_full_build(cache_dir, monkeypatch):
    """Compiled quickly first, in full after HOLOGRAM_PROMOTE_AFTER calls (on the
    background thread), with the same results; the full build replaces the quick one on
    disk, and a new process loads it."""
    from hologram.backends.cpu import backend as cpu

    _cpu_only()
    monkeypatch.setenv("HOLOGRAM_PROMOTE_AFTER", "3")
    compiled = hologram.compile(axpy("a"), backend="cpu")
    assert compiled.executable.tier == "quick"
    assert [p.name for p in cache_dir.rglob("*.bin")] == [f"{compiled.key.quick().digest()}.bin"]
    x = np.linspace(-3, 3, 64, dtype=np.float32)
    y = np.float32(1) / np.arange(1, 65, dtype=np.float32)
    results = [compiled(x, y) for _ in range(2)]
    assert cpu.wait_for_promotions(60)
    assert compiled.executable.tier == "quick"  # two calls: not hot yet
    results += [compiled(x, y) for _ in range(3)]
    assert cpu.wait_for_promotions(60)
    assert compiled.executable.tier == "full"
    results.append(compiled(x, y))
    for r in results:
        np.testing.assert_array_equal(r.view(np.uint32), (x * 2 + y).view(np.uint32))
    assert [p.name for p in cache_dir.rglob("*.bin")] == [f"{compiled.key.digest()}.bin"]
    out, _ = _child("""
        c = hologram.compile(axpy("a"), backend="cpu")
        info = hologram.cache_info()
        print(c.executable.tier, info["disk_hits"], info["misses"])
    """, cache_dir)
    assert out == ["full", "1", "0"]


def test_a_promotion_asked_for_is_made_without_more_calls(cache_dir, monkeypatch):
    """``promote_now``: the full build is made at once (recorded execution asks for it
    before timing a region's ops one by one); ``final`` says when it is in."""
    from hologram.backends.cpu import backend as cpu

    _cpu_only()
    monkeypatch.setenv("HOLOGRAM_PROMOTE_AFTER", "1000")
    compiled = hologram.compile(axpy("b"), backend="cpu")
    x = np.linspace(-3, 3, 64, dtype=np.float32)
    compiled(x, x)
    assert compiled.executable.tier == "quick" and not compiled.executable.final
    compiled.executable.promote_now()
    assert cpu.wait_for_promotions(60)
    assert compiled.executable.tier == "full" and compiled.executable.final
    compiled.executable.promote_now()  # nothing left to promote
    np.testing.assert_array_equal(compiled(x, x), x * 2 + x)


def test_calls_while_a_program_is_promoted_stay_right(cache_dir, monkeypatch):
    from hologram.backends.cpu import backend as cpu

    _cpu_only()
    monkeypatch.setenv("HOLOGRAM_PROMOTE_AFTER", "1")
    g = Graph("chain")
    x = g.input("x", "i32", (4096,))
    g.output("y", (x * 3 + 7) * x - (x + 1))
    compiled = hologram.compile(g.program(), backend="cpu")
    assert compiled.executable.tier == "quick"
    data = np.arange(-2048, 2048, dtype=np.int32) * 40503  # wraps
    want = ((data * 3 + 7) * data - (data + 1)).astype(np.int32)
    failures = []

    def calls():
        for _ in range(300):
            if not np.array_equal(compiled(data), want):
                failures.append(1)

    threads = [threading.Thread(target=calls) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert cpu.wait_for_promotions(60)
    assert compiled.executable.tier == "full"
    assert not failures
    assert np.array_equal(compiled(data), want)
    assert cpu.promotion_stats()["failed"] == 0


def test_quick_compiles_can_be_turned_off(cache_dir, monkeypatch):
    _cpu_only()
    monkeypatch.setenv("HOLOGRAM_QUICK_COMPILE", "0")
    compiled = hologram.compile(axpy("a"), backend="cpu")
    assert compiled.executable.tier == "full"
    assert [p.name for p in cache_dir.rglob("*.bin")] == [f"{compiled.key.digest()}.bin"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_compiles_and_promotes(cache_dir, monkeypatch):
    """A child forked after promotions ran (and while one may run) has its own promotion
    thread and LLVM lock: it compiles, promotes and exits."""
    from hologram.backends.cpu import backend as cpu

    _cpu_only()
    monkeypatch.setenv("HOLOGRAM_PROMOTE_AFTER", "1")
    compiled = hologram.compile(axpy("a"), backend="cpu")
    x = np.arange(64, dtype=np.float32)
    compiled(x, x)
    g = Graph("other")
    g.output("y", g.input("x", "f32", (64,)) * 3.0)
    pid = os.fork()
    if pid == 0:  # the child: exit code 0 only if everything worked
        code = 1
        try:
            child = hologram.compile(g.program(), backend="cpu")
            ok = (child(x) == 3 * x).all()
            child(x)
            code = 0 if ok and cpu.wait_for_promotions(60) and child.executable.tier == "full" \
                else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert cpu.wait_for_promotions(60) and compiled.executable.tier == "full"
