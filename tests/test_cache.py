from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hologram import cache as cache_mod
from hologram.cache import MAGIC, CacheKey, ProgramCache

REPO_ROOT = Path(__file__).resolve().parent.parent
HEADER_SIZE = 48


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
    assert info["disk_bytes"] == HEADER_SIZE + len(build.payload)
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
    assert data[:8] == MAGIC
    assert int.from_bytes(data[8:16], "little") == len(payload)
    assert data[16:48] == hashlib.sha256(payload).digest()
    assert data[48:] == payload
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


CORRUPTIONS: dict[str, Callable[[bytes], bytes]] = {
    "flipped-payload": _flip_payload_byte,
    "flipped-checksum": _flip_checksum_byte,
    "truncated-payload": lambda d: d[:-3],
    "truncated-header": lambda d: d[:20],
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
from hologram.cache import CacheKey, ProgramCache

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
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), *sys.path]))
    start = time.time() + 1.0
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(tmp_path), str(start)],
            cwd=REPO_ROOT,
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
    data = entry_path(tmp_path, key).read_bytes()
    assert data[:8] == MAGIC
    assert data[16:48] == hashlib.sha256(payload).digest()
    assert data[48:] == payload

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
