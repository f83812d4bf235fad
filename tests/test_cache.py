from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import hologram
from hologram import backends
from hologram.compiler import cache as cache_mod
from hologram.compiler.cache import MAGIC, CacheKey, ProgramCache
from hologram.frontend.graph import Graph

# Backends that run here on host memory (their programs are called with NumPy arrays).
HOST_BACKENDS = [b for b in backends.available() if backends.get(b).allocator().host_visible]

# Children import the hologram this process imported: the checkout, or an installed wheel.
PACKAGE_ROOT = Path(hologram.__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
HEADER_SIZE = 48  # magic, body length, sha256 of the body
KEY_SIZE = 32  # the body starts with the key's digest


def make_key(program: str = "p0") -> CacheKey:
    return CacheKey(
        program=program,
        backend="interp",
        target="x86_64-linux cpu=test",
        options="{}",
        version="0.1.0",
    )


class Builder:
    """A build() that counts its calls, so tests can tell a hit from a rebuild."""

    def __init__(self, payload: bytes = b"artifact-bytes") -> None:
        self.payload = payload
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self) -> bytes:
        with self._lock:
            self.calls += 1
        return self.payload


def identity(b: bytes) -> bytes:
    return b


def entry_path(directory: Path, key: CacheKey) -> Path:
    d = key.digest()
    return directory / d[:2] / f"{d}.bin"


def test_memory_hits_are_counted(tmp_path: Path) -> None:
    cache = ProgramCache(tmp_path)
    build = Builder()
    key = make_key()
    for _ in range(3):
        assert cache.get(key, build, identity) == build.payload
    assert build.calls == 1
    info = cache.info()
    assert (info["hits"], info["misses"], info["disk_hits"]) == (2, 1, 0)
    assert info["entries"] == 1
    assert info["disk_entries"] == 1
    assert info["disk_bytes"] == HEADER_SIZE + KEY_SIZE + len(build.payload)
    assert info["directory"] == str(tmp_path)
    assert info["last_disk_error"] is None


def test_memory_only_cache(tmp_path: Path) -> None:
    cache = ProgramCache(None)
    build = Builder()
    cache.get(make_key(), build, identity)
    cache.get(make_key(), build, identity)
    info = cache.info()
    assert build.calls == 1
    assert info["directory"] is None
    assert info["disk_entries"] == 0


def test_disk_hit_in_fresh_cache(tmp_path: Path) -> None:
    build = Builder()
    ProgramCache(tmp_path).get(make_key(), build, identity)
    fresh = ProgramCache(tmp_path)
    assert fresh.get(make_key(), build, lambda b: ("loaded", b)) == ("loaded", build.payload)
    assert build.calls == 1
    assert fresh.get(make_key(), build, identity) == ("loaded", build.payload)
    info = fresh.info()
    assert (info["hits"], info["disk_hits"], info["misses"]) == (1, 1, 0)


def test_file_format(tmp_path: Path) -> None:
    payload = b"\x00\x01payload"
    ProgramCache(tmp_path).get(make_key(), Builder(payload), identity)
    data = entry_path(tmp_path, make_key()).read_bytes()
    body = bytes.fromhex(make_key().digest()) + payload
    assert data[:8] == MAGIC == b"HGCACHE2"
    assert int.from_bytes(data[8:16], "little") == len(body)
    assert data[16:48] == hashlib.sha256(body).digest()
    assert data[48:] == body
    # No temp files are left behind.
    assert [p.name for p in entry_path(tmp_path, make_key()).parent.iterdir()] == [
        f"{make_key().digest()}.bin"
    ]


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(CacheKey)])
def test_every_key_field_changes_digest(field: str) -> None:
    key = make_key()
    other = dataclasses.replace(key, **{field: getattr(key, field) + "x"})
    assert key.digest() != other.digest()
    assert len(key.digest()) == 64


def test_digest_is_unambiguous() -> None:
    a = CacheKey("ab", "c", "t", "o", "v")
    b = CacheKey("a", "bc", "t", "o", "v")
    assert a.digest() != b.digest()
    assert a.digest() == CacheKey("ab", "c", "t", "o", "v").digest()


def _flip_payload_byte(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 0xFF])


def _flip_checksum_byte(data: bytes) -> bytes:
    return data[:20] + bytes([data[20] ^ 0xFF]) + data[21:]


def _wrong_length(data: bytes) -> bytes:
    return data[:8] + (len(data) - HEADER_SIZE + 1).to_bytes(8, "little") + data[16:]


def _body_cut_into_key(data: bytes) -> bytes:
    # Intact by its own checksum, but too short to hold a key.
    body = data[HEADER_SIZE : HEADER_SIZE + KEY_SIZE // 2]
    return cache_mod._HEADER.pack(MAGIC, len(body), hashlib.sha256(body).digest()) + body


CORRUPTIONS: dict[str, Callable[[bytes], bytes]] = {
    "flipped-payload": _flip_payload_byte,
    "flipped-checksum": _flip_checksum_byte,
    "truncated-payload": lambda d: d[:-3],
    "truncated-header": lambda d: d[:20],
    "truncated-key": lambda d: d[: HEADER_SIZE + KEY_SIZE // 2],
    "body-cut-into-key": _body_cut_into_key,
    "garbage-magic": lambda d: b"GARBAGE!" + d[8:],
    "wrong-length": _wrong_length,
    "empty": lambda d: b"",
}


@pytest.mark.parametrize("mutate", CORRUPTIONS.values(), ids=CORRUPTIONS.keys())
def test_damaged_file_is_rebuilt(tmp_path: Path, mutate: Callable[[bytes], bytes]) -> None:
    build = Builder(b"x" * 1000)
    ProgramCache(tmp_path).get(make_key(), build, identity)
    path = entry_path(tmp_path, make_key())
    path.write_bytes(mutate(path.read_bytes()))

    fresh = ProgramCache(tmp_path)
    assert fresh.get(make_key(), build, identity) == build.payload
    assert build.calls == 2
    info = fresh.info()
    assert (info["corrupt"], info["misses"], info["disk_hits"]) == (1, 1, 0)
    # The rebuild left a valid entry behind.
    again = ProgramCache(tmp_path)
    again.get(make_key(), build, identity)
    assert build.calls == 2
    assert again.info()["disk_hits"] == 1


def test_failing_load_of_disk_entry_is_recovered(tmp_path: Path) -> None:
    build = Builder()
    ProgramCache(tmp_path).get(make_key(), build, identity)
    calls = []

    def flaky_load(b: bytes) -> bytes:
        calls.append(b)
        if len(calls) == 1:
            raise ValueError("incompatible artifact")
        return b

    fresh = ProgramCache(tmp_path)
    assert fresh.get(make_key(), build, flaky_load) == build.payload
    assert build.calls == 2
    assert fresh.info()["corrupt"] == 1


def test_lru_eviction() -> None:
    cache = ProgramCache(None, max_entries=2)
    build = Builder()
    k1, k2, k3 = make_key("1"), make_key("2"), make_key("3")
    cache.get(k1, build, identity)
    cache.get(k2, build, identity)
    cache.get(k1, build, identity)  # k1 is now the most recently used
    cache.get(k3, build, identity)  # evicts k2
    assert cache.info()["entries"] == 2
    assert build.calls == 3
    cache.get(k1, build, identity)
    assert build.calls == 3
    cache.get(k2, build, identity)
    assert build.calls == 4


def test_clear_removes_only_cache_files(tmp_path: Path) -> None:
    cache = ProgramCache(tmp_path)
    build = Builder()
    for i in range(3):
        cache.get(make_key(str(i)), build, identity)
    (tmp_path / "notes.txt").write_text("user data")
    (tmp_path / "ab").mkdir(exist_ok=True)
    (tmp_path / "ab" / "other.bin").write_bytes(b"user data")
    assert cache.info()["disk_entries"] == 3

    cache.clear()
    info = cache.info()
    assert (info["entries"], info["disk_entries"], info["misses"]) == (0, 0, 0)
    assert (tmp_path / "notes.txt").exists()
    assert (tmp_path / "ab" / "other.bin").exists()
    cache.get(make_key("0"), build, identity)
    assert build.calls == 4


def test_clear_memory_only_keeps_disk(tmp_path: Path) -> None:
    cache = ProgramCache(tmp_path)
    build = Builder()
    cache.get(make_key(), build, identity)
    cache.clear(disk=False)
    cache.get(make_key(), build, identity)
    assert build.calls == 1
    assert cache.info()["disk_hits"] == 1


def test_uncreatable_directory_falls_back_to_memory(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    cache = ProgramCache(blocker / "cache")
    build = Builder()
    assert cache.get(make_key(), build, identity) == build.payload
    assert cache.get(make_key(), build, identity) == build.payload
    info = cache.info()
    assert build.calls == 1
    assert info["directory"] is None
    assert info["last_disk_error"] is not None
    assert info["hits"] == 1


def test_unwritable_entry_keeps_in_memory_result(tmp_path: Path) -> None:
    cache = ProgramCache(tmp_path)
    # A regular file where the shard directory should be makes every write fail.
    (tmp_path / make_key().digest()[:2]).write_text("in the way")
    build = Builder()
    assert cache.get(make_key(), build, identity) == build.payload
    assert cache.get(make_key(), build, identity) == build.payload
    info = cache.info()
    assert build.calls == 1
    assert info["last_disk_error"] is not None
    assert info["disk_entries"] == 0


def test_non_bytes_build_is_rejected() -> None:
    with pytest.raises(cache_mod.CacheError):
        ProgramCache(None).get(make_key(), lambda: "text", identity)  # type: ignore[arg-type,return-value]


_WORKER = """
import sys, time
from pathlib import Path
from hologram.compiler.cache import CacheKey, ProgramCache

directory, start = Path(sys.argv[1]), float(sys.argv[2])
payload = bytes(range(256)) * 4096  # 1 MiB

def build():
    time.sleep(0.05)
    return payload

key = CacheKey("p", "interp", "t", "o", "v")
while time.time() < start:
    time.sleep(0.001)
for _ in range(3):
    assert ProgramCache(directory).get(key, build, lambda b: b) == payload
"""


def test_concurrent_processes(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PACKAGE_ROOT), *sys.path]))
    start = time.time() + 1.0
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(tmp_path), str(start)],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(4)
    ]
    for p in procs:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err.decode()

    payload = bytes(range(256)) * 4096
    key = CacheKey("p", "interp", "t", "o", "v")
    assert entry_path(tmp_path, key).read_bytes() == cache_mod._pack(key.digest(), payload)

    def must_not_build() -> bytes:
        raise AssertionError("entry should be on disk")

    assert ProgramCache(tmp_path).get(key, must_not_build, identity) == payload
    leftovers = [p for p in tmp_path.rglob("*") if p.name.startswith(".tmp-")]
    assert leftovers == []


@pytest.mark.parametrize("with_disk", [False, True])
def test_concurrent_threads(tmp_path: Path, with_disk: bool) -> None:
    cache = ProgramCache(tmp_path if with_disk else None)
    barrier = threading.Barrier(8)

    def slow_build() -> bytes:
        time.sleep(0.02)
        return b"y" * 4096

    results: list[object] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            barrier.wait()
            results.append(cache.get(make_key(), slow_build, lambda b: {"obj": b}))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(results) == 8
    # Every caller gets the same shared object, even when several built it.
    assert all(r is results[0] for r in results)
    info = cache.info()
    assert info["hits"] + info["disk_hits"] + info["misses"] == 8
    assert info["entries"] == 1
    assert info["corrupt"] == 0


def test_default_cache_follows_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HOLOGRAM_DISABLE_DISK_CACHE", raising=False)
    monkeypatch.setenv("HOLOGRAM_CACHE_DIR", str(tmp_path / "one"))
    first = cache_mod.default_cache()
    assert cache_mod.default_cache() is first
    assert cache_mod.cache_info()["directory"] == str(tmp_path / "one")
    first.get(make_key(), Builder(), identity)
    assert cache_mod.cache_info()["disk_entries"] == 1
    cache_mod.clear_cache()
    assert cache_mod.cache_info()["disk_entries"] == 0

    monkeypatch.setenv("HOLOGRAM_CACHE_DIR", str(tmp_path / "two"))
    assert cache_mod.default_cache() is not first
    assert cache_mod.cache_info()["directory"] == str(tmp_path / "two")

    monkeypatch.setenv("HOLOGRAM_DISABLE_DISK_CACHE", "1")
    assert cache_mod.cache_info()["directory"] is None

    monkeypatch.setenv("HOLOGRAM_CACHE_SIZE", "3")
    assert cache_mod.default_cache().max_entries == 3


# Integrity: what is at an entry's path is used only if it is a regular file holding an
# intact entry written for the key looked up. Anything else is damaged: counted, removed
# and rebuilt, never run, never allowed to hang or exhaust memory.


def test_another_entrys_file_under_this_name_is_rebuilt(tmp_path: Path) -> None:
    a, b = make_key("a"), make_key("b")
    build_a, build_b = Builder(b"program a"), Builder(b"program b")
    ProgramCache(tmp_path).get(a, build_a, identity)
    ProgramCache(tmp_path).get(b, build_b, identity)
    shutil.copyfile(entry_path(tmp_path, a), entry_path(tmp_path, b))

    fresh = ProgramCache(tmp_path)
    assert fresh.get(b, build_b, identity) == b"program b"
    assert build_b.calls == 2
    assert fresh.info()["corrupt"] == 1
    # The rebuild replaced the copy, and a's own entry is untouched.
    assert ProgramCache(tmp_path).get(b, build_b, identity) == b"program b"
    assert ProgramCache(tmp_path).get(a, build_a, identity) == b"program a"
    assert (build_a.calls, build_b.calls) == (1, 2)


def test_an_old_format_entry_is_rebuilt(tmp_path: Path) -> None:
    payload = b"compiled by an older hologram"
    path = entry_path(tmp_path, make_key())
    path.parent.mkdir(parents=True)
    path.write_bytes(b"HGCACHE1" + struct.pack("<Q", len(payload))
                     + hashlib.sha256(payload).digest() + payload)
    build = Builder(b"current")
    cache = ProgramCache(tmp_path)
    assert cache.get(make_key(), build, identity) == b"current"
    assert (build.calls, cache.info()["corrupt"]) == (1, 1)
    assert path.read_bytes()[:8] == MAGIC


def test_a_directory_at_the_entry_path_is_damaged(tmp_path: Path) -> None:
    path = entry_path(tmp_path, make_key())
    (path / "inside").mkdir(parents=True)
    build = Builder()
    for _ in range(2):
        cache = ProgramCache(tmp_path)
        assert cache.get(make_key(), build, identity) == build.payload
        info = cache.info()
        assert info["corrupt"] == 1
        # Not removed (it may hold someone's files), so the entry cannot be written.
        assert "writing" in info["last_disk_error"]
    assert build.calls == 2
    assert (path / "inside").is_dir()


def test_a_symlink_to_a_regular_file_is_followed(tmp_path: Path) -> None:
    # The documented choice: its contents are checked like any entry's.
    build = Builder()
    ProgramCache(tmp_path / "cache").get(make_key(), build, identity)
    path = entry_path(tmp_path / "cache", make_key())
    path.rename(tmp_path / "elsewhere.bin")
    path.symlink_to(tmp_path / "elsewhere.bin")
    cache = ProgramCache(tmp_path / "cache")
    assert cache.get(make_key(), build, identity) == build.payload
    assert (build.calls, cache.info()["disk_hits"]) == (1, 1)


@pytest.mark.parametrize(("function", "error"), [
    pytest.param("_read_entry_file", MemoryError, id="read-MemoryError"),
    pytest.param("_unpack", struct.error, id="parse-struct.error"),
    pytest.param("_unpack", ValueError, id="parse-ValueError"),
])
def test_any_error_reading_an_entry_is_a_damaged_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, function: str, error: type[Exception]
) -> None:
    build = Builder()
    ProgramCache(tmp_path).get(make_key(), build, identity)

    def fail(*args: object) -> bytes:
        raise error("while reading the entry")

    monkeypatch.setattr(cache_mod, function, fail)
    cache = ProgramCache(tmp_path)
    assert cache.get(make_key(), build, identity) == build.payload
    assert (build.calls, cache.info()["corrupt"]) == (2, 1)
    monkeypatch.undo()
    # Removed and written again by the rebuild.
    assert ProgramCache(tmp_path).get(make_key(), build, identity) == build.payload
    assert build.calls == 2


def test_entries_over_the_size_limit_are_neither_read_nor_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build = Builder(b"x" * 1000)
    ProgramCache(tmp_path).get(make_key(), build, identity)
    monkeypatch.setattr(cache_mod, "MAX_ENTRY_BYTES", 500)
    cache = ProgramCache(tmp_path)
    assert cache.get(make_key(), build, identity) == build.payload
    info = cache.info()
    assert (build.calls, info["corrupt"], info["disk_entries"]) == (2, 1, 0)
    assert "MAX_ENTRY_BYTES" in info["last_disk_error"]


# A reader that opens a FIFO blocks forever and one that reads /dev/zero runs out of memory,
# so these run in a child process with a timeout and a bound on its address space: a
# regression fails the test instead of hanging or starving the machine.
_GET_IN_CHILD = """
import os, resource, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_cache import identity, make_key
from hologram.compiler.cache import ProgramCache

if os.path.exists("/proc/self/statm"):
    with open("/proc/self/statm") as f:
        mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (mapped + (1 << 30), -1))
cache = ProgramCache(Path({directory!r}))
print(cache.get(make_key(), lambda: b"rebuilt", identity).decode(), cache.info()["corrupt"])
"""


def _get_in_child(directory: Path) -> list[str]:
    code = _GET_IN_CHILD.format(tests=str(TESTS), directory=str(directory))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PACKAGE_ROOT), *sys.path]))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_at_the_entry_path_is_damaged_and_never_opened(tmp_path: Path) -> None:
    path = entry_path(tmp_path, make_key())
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    assert _get_in_child(tmp_path) == ["rebuilt", "1"]
    assert ProgramCache(tmp_path).get(make_key(), Builder(), identity) == b"rebuilt"


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero here")
def test_a_symlink_to_dev_zero_is_damaged_and_never_read(tmp_path: Path) -> None:
    path = entry_path(tmp_path, make_key())
    path.parent.mkdir(parents=True)
    path.symlink_to("/dev/zero")
    assert _get_in_child(tmp_path) == ["rebuilt", "1"]
    assert not path.is_symlink()  # the link was replaced, /dev/zero left alone
    assert ProgramCache(tmp_path).get(make_key(), Builder(), identity) == b"rebuilt"


# End to end: a compiled program's file copied over another's name. Pairs share a signature,
# so running the wrong artifact would return wrong numbers rather than crash the test run.
BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "max": np.maximum}
SWAPS = [("float32", "add", "mul"), ("float32", "mul", "sub"), ("float32", "sub", "max"),
         ("float64", "max", "add"), ("int32", "add", "sub"), ("int64", "mul", "add")]


def binary_program(op: str, dtype: str):
    g = Graph(op)
    x, y = g.input("x", dtype, (64,)), g.input("y", dtype, (64,))
    g.output("z", g.binary(op, x, y))
    return g.program()


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    directory = tmp_path / "cache"
    monkeypatch.delenv("HOLOGRAM_DISABLE_DISK_CACHE", raising=False)
    monkeypatch.setenv("HOLOGRAM_CACHE_DIR", str(directory))
    hologram.clear_cache()
    yield directory
    hologram.clear_cache()


@pytest.mark.parametrize("backend", HOST_BACKENDS)
@pytest.mark.parametrize(("dtype", "first", "second"), SWAPS)
def test_a_swapped_program_entry_is_recompiled(
    cache_dir: Path, backend: str, dtype: str, first: str, second: str
) -> None:
    a = hologram.compile(binary_program(first, dtype), backend)
    b = hologram.compile(binary_program(second, dtype), backend)
    # cpu programs are stored as their quick builds first (docs/compiler.md, "Tiers")
    keys = [k for k in (a.key, a.key.quick()) if entry_path(cache_dir, k).exists()]
    swapped = b.key.quick() if keys[0] != a.key else b.key
    shutil.copyfile(entry_path(cache_dir, keys[0]), entry_path(cache_dir, swapped))
    hologram.clear_cache(disk=False)  # forget the loaded programs, keep the files

    rng = np.random.default_rng(16)
    x, y = (rng.integers(-50, 50, 64).astype(dtype) for _ in range(2))
    for op in (second, first):
        z = hologram.compile(binary_program(op, dtype), backend)(x, y)
        np.testing.assert_array_equal(z, BINARY[op](x, y))
    info = hologram.cache_info()
    assert (info["corrupt"], info["misses"], info["disk_hits"]) == (1, 1, 1)


class Quick:
    """A quick build and the loaded programs it makes: strings that record the promotion
    they were given (``full``), so a test can run it."""

    def __init__(self, payload: bytes = b"quick-bytes", final: bool = False) -> None:
        self.payload, self.final, self.calls = payload, final, 0

    def __call__(self) -> tuple[bytes, bool]:
        self.calls += 1
        return self.payload, self.final


class Loaded:
    def __init__(self, payload: bytes) -> None:
        self.payload = payload
        self.full: Callable[[], Loaded] | None = None

    def promote_when_hot(self, full: Callable[[], Loaded]) -> None:
        self.full = full


def test_a_quick_build_is_kept_under_its_own_key_and_promoted_to_the_full_one(
        tmp_path: Path) -> None:
    key, build, quick = make_key(), Builder(b"full-bytes"), Quick()
    cache = ProgramCache(tmp_path)
    obj = cache.get(key, build, Loaded, quick=quick)
    assert (obj.payload, quick.calls, build.calls) == (b"quick-bytes", 1, 0)
    # never under the full build's key
    assert not entry_path(tmp_path, key).exists()
    assert entry_path(tmp_path, key.quick()).exists()
    assert cache.get(key, build, Loaded, quick=quick) is obj  # a memory hit
    # a new process finds the quick build on disk and promotes it too
    again = ProgramCache(tmp_path).get(key, build, Loaded, quick=quick)
    assert (again.payload, quick.calls, build.calls) == (b"quick-bytes", 1, 0)
    assert again.full is not None
    promoted = obj.full()
    assert (promoted.payload, build.calls) == (b"full-bytes", 1)
    assert entry_path(tmp_path, key).exists()
    assert not entry_path(tmp_path, key.quick()).exists()
    # from now on the full build is what every lookup finds
    fresh = ProgramCache(tmp_path).get(key, build, Loaded, quick=quick)
    assert (fresh.payload, fresh.full, quick.calls, build.calls) == (b"full-bytes", None, 1, 1)


def test_a_quick_build_that_is_the_full_one_is_stored_as_such(tmp_path: Path) -> None:
    key, build, quick = make_key(), Builder(), Quick(b"full-bytes", final=True)
    obj = ProgramCache(tmp_path).get(key, build, Loaded, quick=quick)
    assert (obj.payload, obj.full, build.calls) == (b"full-bytes", None, 0)
    assert entry_path(tmp_path, key).exists()
    assert not entry_path(tmp_path, key.quick()).exists()


def test_the_quick_key_differs_from_the_full_one() -> None:
    key = make_key()
    assert key.quick().digest() != key.digest()
    assert key.quick().options.startswith(key.options)
    assert key.quick().program == key.program


# Deferred writes (the torch device's compiles): on a background thread, in order.
def test_deferred_writes_are_found_before_they_land_and_flushed(tmp_path: Path,
                                                                 monkeypatch) -> None:
    gate = threading.Event()
    real = ProgramCache._write
    written: list[str] = []

    def slow(self, digest: str, payload: bytes) -> None:
        gate.wait(10)
        real(self, digest, payload)
        written.append(digest)

    monkeypatch.setattr(ProgramCache, "_write", slow)
    keys = [make_key(f"p{i}") for i in range(3)]
    cache = ProgramCache(tmp_path)
    with cache_mod.deferred_writes():
        for i, key in enumerate(keys):
            assert cache.get(key, Builder(b"x%d" % i), identity) == b"x%d" % i
    assert not written and not entry_path(tmp_path, keys[0]).exists()  # not yet on disk
    # Another cache on the directory (a lookup after the memory LRU forgot) finds them.
    again = ProgramCache(tmp_path)
    assert again.get(keys[1], Builder(b"rebuilt"), identity) == b"x1"
    gate.set()
    assert cache.flush(10)
    assert written == [k.digest() for k in keys]  # in order
    for i, key in enumerate(keys):
        assert entry_path(tmp_path, key).read_bytes() == cache_mod._pack(key.digest(),
                                                                         b"x%d" % i)
    # Outside the block, writes happen before get() returns.
    cache.get(make_key("p9"), Builder(), identity)
    assert entry_path(tmp_path, make_key("p9")).exists()


def test_info_and_clear_wait_for_deferred_writes(tmp_path: Path) -> None:
    cache = ProgramCache(tmp_path)
    with cache_mod.deferred_writes():
        for i in range(5):
            cache.get(make_key(f"q{i}"), Builder(), identity)
    assert cache.info()["disk_entries"] == 5
    with cache_mod.deferred_writes():
        cache.get(make_key("q9"), Builder(), identity)
    cache.clear()
    assert cache.info()["disk_entries"] == 0
