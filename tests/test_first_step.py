"""What a first training step leans on: support objects cached on disk by
``llvm.compile_ir`` (docs/performance.md, "First step")."""

import ctypes
from pathlib import Path

import pytest

from hologram.backends.cpu import llvm
from hologram.backends.cpu import target as targets
from hologram.compiler import cache as cache_mod
from hologram.errors import CompileError

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
    """The tiers of the objects LLVM actually compiles from here on."""
    made: list[str] = []
    real = llvm._compile_ir

    def counting(ir, target, allowed, dump, tier):
        made.append(tier)
        return real(ir, target, allowed, dump, tier)

    monkeypatch.setattr(llvm, "_compile_ir", counting)
    return made


def test_compile_ir_reads_objects_back_from_disk(cache_dir, builds, monkeypatch) -> None:
    before = cache_mod.cache_info()
    first = llvm.compile_ir(IR)
    # A later process: a new cache object on the same directory.
    monkeypatch.setattr(cache_mod, "_default", None)
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


def test_compile_ir_uncached_and_dumped_builds_compile(cache_dir, builds) -> None:
    llvm.compile_ir(IR, cached=False)
    llvm.compile_ir(IR, cached=False)
    stages = {}
    llvm.compile_ir(IR, dump=lambda stage, text: stages.setdefault(stage, text))
    assert builds == ["full"] * 3
    assert "cpu.opt.ll" in stages


def test_compile_ir_without_disk_cache(cache_dir, builds, monkeypatch) -> None:
    monkeypatch.setenv("HOLOGRAM_DISABLE_DISK_CACHE", "1")
    assert llvm.compile_ir(IR) == llvm.compile_ir(IR)
    assert builds == ["full", "full"]


def test_damaged_cached_object_is_rebuilt(cache_dir, builds, monkeypatch) -> None:
    obj = llvm.compile_ir(IR)
    for path in cache_dir.rglob("*.bin"):
        data = bytearray(path.read_bytes())
        data[-1] ^= 0xFF
        path.write_bytes(bytes(data))
    monkeypatch.setattr(cache_mod, "_default", None)
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
