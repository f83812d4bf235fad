"""What a first training step leans on: support objects cached on disk by
``llvm.compile_ir``, each module compiled once per process (docs/performance.md, "First
step")."""

import ctypes
import hashlib
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
from util import errors_in_threads, run_fresh

import hologram
from hologram.backends.cpu import elf, llvm, loader
from hologram.backends.cpu import target as targets
from hologram.compiler import cache as cache_mod
from hologram.errors import CompileError
from hologram.frontend.graph import Graph

IR = """
define i64 @twice(i64 %x) {
  %y = add i64 %x, %x
  ret i64 %y
}
"""


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("HOLOGRAM_DISABLE_DISK_CACHE", raising=False)
    monkeypatch.setenv("HOLOGRAM_CACHE_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The tiers of the objects LLVM actually compiles from here on (none compiled before
    in this process)."""
    made: list[str] = []
    real = llvm._compile_ir
    monkeypatch.setattr(llvm, "_objects", OrderedDict())

    def counting(ir, target, allowed, dump, tier):
        made.append(tier)
        return real(ir, target, allowed, dump, tier)

    monkeypatch.setattr(llvm, "_compile_ir", counting)
    return made


def _new_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a later process starts from: a new cache object on the same directory, no
    object compiled yet."""
    monkeypatch.setattr(cache_mod, "_default", None)
    llvm._objects.clear()


def test_compile_ir_reads_objects_back_from_disk(cache_dir, builds, monkeypatch) -> None:
    before = cache_mod.cache_info()
    first = llvm.compile_ir(IR)
    _new_process(monkeypatch)
    assert llvm.compile_ir(IR) == first
    assert builds == ["full"]
    # Support code is not a program: the program counts do not move.
    after = cache_mod.cache_info()
    assert (after["misses"], after["disk_hits"]) == (before["misses"], before["disk_hits"])
    address = llvm.load_object(first, ["twice"])["twice"]
    assert ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(address)(21) == 42


def test_compile_ir_keys_tier_and_allowed_symbols(cache_dir, builds) -> None:
    llvm.compile_ir(IR)
    llvm.compile_ir(IR, tier="quick")
    llvm.compile_ir(IR, allowed={"memset"})
    llvm.compile_ir(IR + "\n; another module\n")
    assert builds == ["full", "quick", "full", "full"]
    llvm.compile_ir(IR, tier="quick")
    assert len(builds) == 4


def test_compile_ir_uncached_builds_once_per_process_and_dumped_ones_compile(
        cache_dir, builds, monkeypatch) -> None:
    first = llvm.compile_ir(IR, cached=False)
    assert llvm.compile_ir(IR, cached=False) == first
    assert builds == ["full"]
    stages = {}
    llvm.compile_ir(IR, dump=lambda stage, text: stages.setdefault(stage, text))
    assert builds == ["full"] * 2
    assert "cpu.opt.ll" in stages
    _new_process(monkeypatch)
    llvm.compile_ir(IR, cached=False)
    assert builds == ["full"] * 3


def test_compile_ir_keeps_the_latest_objects(cache_dir, builds, monkeypatch) -> None:
    monkeypatch.setattr(llvm, "OBJECTS_KEPT", 2)
    modules = [IR + f"\n; module {i}\n" for i in range(3)]
    for ir in modules + modules[1:]:
        llvm.compile_ir(ir, cached=False)
    assert len(builds) == 3
    llvm.compile_ir(modules[0], cached=False)  # the oldest, dropped
    assert len(builds) == 4


def test_programs_that_render_alike_compile_one_module(cache_dir, builds) -> None:
    """An elementwise op on tensors of other shapes with as many elements renders the
    same IR (whatever the program's name): its kernels are named after the IR, and LLVM
    compiles the module once."""
    results = []
    for shape in ((4, 16), (64,), (2, 2, 16)):
        g = Graph(f"sqrt_{len(shape)}")
        x = g.input("x", "f32", shape)
        g.output("y", g.unary("sqrt", x))
        compiled = hologram.compile(g.program(), backend="cpu")
        results.append(compiled(np.arange(64, dtype=np.float32).reshape(shape)))
    assert len(builds) == 1
    for got in results:
        np.testing.assert_array_equal(got.reshape(-1), np.sqrt(np.arange(64, dtype=np.float32)))


def test_compile_ir_without_disk_cache(cache_dir, builds, monkeypatch) -> None:
    monkeypatch.setenv("HOLOGRAM_DISABLE_DISK_CACHE", "1")
    first = llvm.compile_ir(IR)
    _new_process(monkeypatch)
    assert llvm.compile_ir(IR) == first
    assert builds == ["full", "full"]


def test_damaged_cached_object_is_rebuilt(cache_dir, builds, monkeypatch) -> None:
    obj = llvm.compile_ir(IR)
    for path in cache_dir.rglob("*.bin"):
        data = bytearray(path.read_bytes())
        data[-1] ^= 0xFF
        path.write_bytes(bytes(data))
    _new_process(monkeypatch)
    assert llvm.compile_ir(IR) == obj
    assert builds == ["full", "full"]


def test_object_needing_a_symbol_not_allowed_is_refused(cache_dir) -> None:
    # The allowed symbols are part of the key: an object cached for callers that allow
    # a symbol is never handed to one that does not.
    ir = ("declare void @hg_elsewhere()\n"
          "define void @f() {\n  call void @hg_elsewhere()\n  ret void\n}\n")
    assert llvm.compile_ir(ir, targets.host(), allowed={"hg_elsewhere"})
    with pytest.raises(CompileError, match="hg_elsewhere"):
        llvm.compile_ir(ir, targets.host(), allowed=())


@pytest.mark.parametrize("text", [
    "%y = fadd float %a, %b", "%y = fadd fast float %a, %b", "%y = add nsw i64 %a, 1",
    "call float @llvm.fmuladd.f32(float %a, float %b, float %c)", "@fastest_kernel",
    "%nsw_sum = add i64 %a, 1", "attributes #0 = { \"unsafe-fp-math\"=\"true\" }",
    "%y = or disjoint i64 %a, %b", "; exactly", "%x = fmul contract float %a, %b", "",
])
def test_tier_check_agrees_with_its_pattern(text: str) -> None:
    # The substring pre-check only skips the regex where it cannot match.
    assert llvm.same_bits_at_every_tier(text) == (llvm._TIER_SENSITIVE.search(text) is None)


def test_shard_directory_is_made_when_missing(tmp_path: Path) -> None:
    store = cache_mod.ProgramCache(tmp_path / "store")
    key = cache_mod.CacheKey("p", "cpu", "t", "o", "v")
    assert store.get(key, lambda: b"first", bytes) == b"first"
    for shard in (tmp_path / "store").iterdir():  # removed behind the cache's back
        for entry in shard.iterdir():
            entry.unlink()
        shard.rmdir()
    store._write(key.digest(), b"again")
    assert cache_mod.ProgramCache(tmp_path / "store").get(key, lambda: b"rebuilt", bytes) \
        == b"again"


# --- loading objects without MCJIT (backends/cpu/loader.py) -----------------------------

def _module(i: int) -> str:
    """A function using what kernels use: constants from memory, a call within the
    object, memset from the process; and a counter in writable data."""
    return f"""
@calls_{i} = global i64 0
declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)
define internal double @scale_{i}(double %x) noinline {{
  %y = fmul double %x, {i + 0.5:e}
  ret double %y
}}
define double @f_{i}(double %x, ptr %buf) {{
  call void @llvm.memset.p0.i64(ptr %buf, i8 {i % 200 + 1}, i64 4096, i1 false)
  %n = load i64, ptr @calls_{i}
  %m = add i64 %n, 1
  store i64 %m, ptr @calls_{i}
  %a = fadd double %x, 0x400921FB54442D18
  %b = call double @scale_{i}(double %a)
  ret double %b
}}
"""


def _check_call(address: int, i: int, times: int = 1) -> None:
    fn = ctypes.CFUNCTYPE(ctypes.c_double, ctypes.c_double, ctypes.c_void_p)(address)
    for _ in range(times):
        buf = (ctypes.c_uint8 * 4096)()
        assert fn(1.0, ctypes.addressof(buf)) == (1.0 + 3.141592653589793) * (i + 0.5)
        assert bytes(buf) == bytes([i % 200 + 1]) * 4096


needs_loader = pytest.mark.skipif(not loader.supported(), reason="x86-64 Linux only")


@needs_loader
@pytest.mark.parametrize("tier", llvm.TIERS)
def test_loader_runs_what_mcjit_runs(tier: str, monkeypatch) -> None:
    host = targets.host()
    for i, own in ((1, True), (2, False)):
        monkeypatch.setattr(llvm, "use_own_loader", own)
        obj = llvm.compile_ir(_module(i), host, tier=tier, cached=False)
        _check_call(llvm.load_object(obj, [f"f_{i}"])[f"f_{i}"], i, times=3)


@needs_loader
def test_loader_many_objects_from_several_threads() -> None:
    host = targets.host()
    objects = {i: llvm.compile_ir(_module(i), host, tier=llvm.TIERS[i % 2], cached=False)
               for i in range(10, 50)}

    def work(part: int) -> None:
        for i in list(objects)[part::4]:
            _check_call(llvm.load_object(objects[i], [f"f_{i}"])[f"f_{i}"], i)

    errors = errors_in_threads(work, 4)
    assert not errors, errors
    # Every one still runs once all are loaded (none was overwritten by a later one).
    for i, obj in objects.items():
        _check_call(llvm.load_object(obj, [f"f_{i}"])[f"f_{i}"], i)


@needs_loader
def test_loader_refuses_what_it_does_not_handle() -> None:
    with pytest.raises(loader.Unsupported):
        loader.load(b"not an object", [], llvm._process_symbol)
    foreign = llvm.compile_ir(_module(3), targets.named("neoverse-v1"), cached=False)
    with pytest.raises(loader.Unsupported):
        loader.load(foreign, ["f_3"], llvm._process_symbol)


@needs_loader
def test_unsupported_objects_go_to_mcjit(monkeypatch) -> None:
    def refuse(obj, names, resolve, label=""):
        raise loader.Unsupported("a test")

    monkeypatch.setattr(loader, "load", refuse)
    obj = llvm.compile_ir(_module(4), targets.host(), cached=False)
    _check_call(llvm.load_object(obj, ["f_4"])["f_4"], 4)


@needs_loader
def test_loader_errors_name_what_is_missing() -> None:
    host = targets.host()
    obj = llvm.compile_ir(_module(5), host, cached=False)
    with pytest.raises(CompileError, match="f_missing"):
        llvm.load_object(obj, ["f_5", "f_missing"])
    ir = ("declare void @hg_nowhere()\n"
          "define void @g() {\n  call void @hg_nowhere()\n  ret void\n}\n")
    obj = llvm.compile_ir(ir, host, allowed={"hg_nowhere"}, cached=False)
    with pytest.raises(CompileError, match="hg_nowhere"):
        llvm.load_object(obj, ["g"], allowed={"hg_nowhere"})


@needs_loader
def test_perf_map_names_loaded_functions(tmp_path: Path, monkeypatch) -> None:
    """With HOLOGRAM_PERF_MAP=1 each function loaded is a line ``START SIZE name`` of the
    process's perf map, covering exactly its code; without it nothing is written."""
    path = tmp_path / "perf.map"
    monkeypatch.setattr(loader, "perf_map_path", lambda: str(path))
    host = targets.host()
    obj = llvm.compile_ir(_module(60), host, cached=False)
    llvm.load_object(obj, ["f_60"])
    assert not path.exists()
    monkeypatch.setenv("HOLOGRAM_PERF_MAP", "1")
    obj = llvm.compile_ir(_module(61), host, cached=False)
    address = llvm.load_object(obj, ["f_61"])["f_61"]
    start, size, name = path.read_text().splitlines()[-1].split()
    symbol = next(s for s in elf.read(obj).symbols if s.name == "f_61")
    assert (int(start, 16), int(size, 16)) == (address, symbol.size) and symbol.size > 0
    assert name == f"hologram:{hashlib.sha256(obj).hexdigest()[:12]}:f_61"


# --- reading ELF objects without lief (backends/cpu/elf.py) ----------------------------

@pytest.mark.parametrize("name", ["x86-64", "x86-64-v4", "znver4", "neoverse-n1"])
def test_elf_reader_reads_what_lief_reads(name: str) -> None:
    """Sections, symbols and relocations as lief reads them, on objects for x86-64 and
    AArch64 Linux (the relocations' types by their psABI numbers)."""
    lief = pytest.importorskip("lief")
    obj = llvm.compile_ir(_module(7), targets.named(name), cached=False)
    mine, theirs = elf.read(obj), lief.parse(obj)
    assert [(s.name, s.size, s.offset, s.alignment) for s in mine.sections] == \
        [(s.name, s.size, s.offset, s.alignment) for s in theirs.sections]
    for section, other in zip(mine.sections, theirs.sections, strict=True):
        assert mine.content(obj, section) == bytes(other.content) or section.type == elf.NOBITS
        assert bool(section.flags & elf.ALLOC) == other.has(lief.ELF.Section.FLAGS.ALLOC)
    assert [(s.name, s.shndx, s.value, s.size, s.type == elf.STT_FUNC)
            for s in mine.symbols] == \
        [(s.name, s.shndx, s.value, s.size, s.type == lief.ELF.Symbol.TYPE.FUNC)
         for s in theirs.symtab_symbols]
    index = {(s.name, s.offset): s.index for s in mine.sections}
    want = [(index[r.section.name, r.section.offset], r.address, r.symbol.name, r.addend)
            for r in theirs.relocations]
    assert [(r.section, r.offset, r.symbol.name, r.addend) for r in mine.relocations] == want
    assert want  # the module's constants, call and memset are relocated
    if name != "neoverse-n1":  # x86-64: the types the loader handles
        assert {r.type for r in mine.relocations} <= set(loader._RELOCATIONS)
    assert set(llvm.undefined_symbols(obj)) - {"_GLOBAL_OFFSET_TABLE_"} == {"memset"}


def test_elf_reader_refuses_damaged_objects() -> None:
    obj = llvm.compile_ir(_module(8), targets.named("x86-64"), cached=False)
    for damaged in (obj[:40], obj[:len(obj) // 2], b"\x7fELF\x01\x01" + obj[6:]):
        with pytest.raises(ValueError):
            elf.read(damaged)
    with pytest.raises(CompileError, match="cannot read the symbol table"):
        llvm.undefined_symbols(obj[:40])


@pytest.mark.skipif(not loader.supported(), reason="ELF hosts (x86-64 Linux) only")
def test_first_kernels_of_a_process_do_not_import_lief(tmp_path: Path) -> None:
    """Compiling, checking and loading kernels reads ELF objects itself: lief's import
    (0.3-0.7 s) was most of a model's first step from the disk cache."""
    code = ("import sys, numpy as np, hologram\n"
            "from hologram.frontend.graph import Graph\n"
            "g = Graph('f')\n"
            "x = g.input('x', 'f32', (64, 100))\n"
            "g.output('y', g.sum(g.unary('exp', x), 1))\n"
            "f = hologram.compile(g.program(), backend='cpu')\n"
            "x = np.random.rand(64, 100).astype(np.float32)\n"
            "assert np.allclose(f(x), np.exp(x).sum(1), rtol=1e-5)\n"
            "print('lief' in sys.modules, hologram.cache_info()['disk_hits'])\n")
    env = {"HOLOGRAM_CACHE_DIR": str(tmp_path), "HOLOGRAM_DISABLE_DISK_CACHE": None}
    for hits in ("0", "1"):  # a cold cache, then a warm one
        done = run_fresh(code, env, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.split() == ["False", hits], done.stdout
