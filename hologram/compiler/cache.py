"""The program cache: compiled artifacts kept in memory and on disk.

A compiled program is looked up by a :class:`CacheKey`, which covers everything that
decides whether an artifact may be reused: the program itself, the backend, the exact
target (CPU model and features, GPU architecture), the compile options and the Hologram
version. A cache entry must never run on a machine or under a version it was not built
for, so anything that changes the generated code belongs in the key.

:class:`ProgramCache` keeps loaded programs in an in-memory LRU and the raw artifacts
under ``<directory>/<digest[:2]>/<digest>.bin``. The disk is only an optimization: a
damaged file is discarded and rebuilt, and a disk that cannot be written is recorded in
:meth:`ProgramCache.info` and otherwise ignored.

A miss may be served by a *quick* build first (:meth:`ProgramCache.get`'s ``quick``): a
cheaper compile that computes the same results (the cpu backend's quick LLVM tier). It is
stored under its own key (:meth:`CacheKey.quick`), never under the full build's, and its
loaded program is asked to replace itself with the full build once hot; that build is then
written under the full key, which every later lookup finds first.

File format: ``b"HGCACHE2"``, body length (8 bytes, little endian), sha256 of the body
(32 bytes), body; the body is the key's digest (32 bytes) followed by the payload. The
key is inside the checksummed body because a file name proves nothing: a file copied
under another entry's name (a bad sync, a manual copy) would otherwise pass the checksum
and run the wrong program. Files of the old format fail on the magic and are rebuilt.

Writes may be deferred (:func:`deferred_writes`: the torch device's kernels, compiled
while a training step waits): the entry is then written on a background thread, in the
order the writes were made, and until it is, lookups in this process find it in memory
(reads of its path see the pending payload). :meth:`ProgramCache.flush` waits for them;
:meth:`ProgramCache.info` and :meth:`ProgramCache.clear` flush first, and so does the
process at exit. A fork's child leaves the parent's pending writes to the parent.

An entry's path is only ever opened if it is a regular file (symlinks followed) of at
most :data:`MAX_ENTRY_BYTES`, and never more than its size is read: a FIFO there would
block the read forever, and a device such as ``/dev/zero`` or a huge file would exhaust
memory. Anything else at the path, or any error reading or parsing it other than an
``OSError``, makes the entry damaged like a bad checksum does.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import os
import re
import stat
import struct
import tempfile
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, TypeVar

from hologram import config
from hologram.errors import CacheError
from hologram.version import __version__

T = TypeVar("T")

MAGIC = b"HGCACHE2"
_HEADER = struct.Struct("<8sQ32s")  # magic, body length, sha256 of the body
_KEY_SIZE = 32  # the body starts with the raw sha256 key digest
# A sanity bound on entry files, written and read: far above any real artifact, far below
# what a huge or sparse file at an entry's path would take to read into memory.
MAX_ENTRY_BYTES = 1 << 30
# No blocking open even if a FIFO replaces the entry between its stat and its open.
# (Windows has neither O_NONBLOCK nor FIFOs, but needs O_BINARY.)
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
_SHARD = re.compile(r"[0-9a-f]{2}")
_ENTRY = re.compile(r"[0-9a-f]{64}\.bin")
_MISSING = object()


@dataclass(frozen=True)
class CacheKey:
    """Identity of one compiled artifact; see the module docstring for why each field."""

    program: str  # hex digest of the canonical program (computed by the caller)
    backend: str  # e.g. "interp", "cpu"
    target: str  # e.g. "x86_64-linux cpu=znver4 +avx2,+avx512f", or a GPU arch
    options: str  # canonical repr of the compile options
    version: str  # compiler_version(): the release plus a digest of the code generator

    def __post_init__(self) -> None:
        for f in fields(self):
            if not isinstance(getattr(self, f.name), str):
                raise CacheError(f"CacheKey.{f.name} must be a str, got {getattr(self, f.name)!r}")

    def quick(self) -> CacheKey:
        """The key of this artifact's quick build (the options say so)."""
        return replace(self, options=f"{self.options};tier=quick")

    def digest(self) -> str:
        """sha256 hex over all fields; length prefixes keep ("ab", "c") != ("a", "bc").
        Made once per key (a lookup asks for it several times)."""
        digest = self.__dict__.get("_digest")
        if digest is None:
            h = hashlib.sha256(b"hologram-cache-key-v1\0")
            for value in (self.program, self.backend, self.target, self.options, self.version):
                data = value.encode("utf-8")
                h.update(struct.pack("<Q", len(data)))
                h.update(data)
            digest = self.__dict__["_digest"] = h.hexdigest()  # (frozen: not via setattr)
        return digest


class ProgramCache:
    """In-memory LRU of loaded programs in front of an optional on-disk artifact store.

    Safe to share between threads, and between processes through the same directory.
    """

    def __init__(self, directory: Path | None, max_entries: int = 512):
        if max_entries < 1:
            raise CacheError(f"ProgramCache max_entries must be >= 1, got {max_entries}")
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._memory: OrderedDict[str, Any] = OrderedDict()
        self._last_disk_error: str | None = None
        self._reset_counters()
        self.directory: Path | None = None
        if directory is not None:
            try:
                Path(directory).mkdir(parents=True, exist_ok=True)
                self.directory = Path(directory)
            except OSError as exc:
                self._last_disk_error = f"cannot create cache directory {directory}: {exc}"

    def _reset_counters(self) -> None:
        self._hits = self._disk_hits = self._misses = self._corrupt = 0

    def get(self, key: CacheKey, build: Callable[[], bytes], load: Callable[[bytes], T],
            quick: Callable[[], tuple[bytes, bool]] | None = None) -> T:
        """Return the loaded program for ``key``, building it only if no valid copy exists.

        ``build()`` produces the artifact bytes and ``load(bytes)`` turns them into the
        object returned. Neither is called under the lock, so concurrent misses on one key
        may both build; the first result stored wins.

        ``quick``, if given, serves a miss instead of ``build``: it returns an artifact
        and whether that is the full build after all. A quick artifact is kept under
        ``key.quick()`` (on disk, where a later process finds it when the full one is not
        there yet), and its loaded object must have ``promote_when_hot(full)``: ``full()``
        makes, stores and loads the full build (on the caller's thread of choice).
        """
        digest = key.digest()
        with self._lock:
            obj = self._memory.get(digest, _MISSING)
            if obj is not _MISSING:
                self._memory.move_to_end(digest)
                self._hits += 1
                return obj
        if self.directory is not None:
            payload = self._read(digest)
            if payload is not None:
                try:
                    obj = load(payload)
                except Exception:
                    # Bytes that pass the checksum but do not load were written by a
                    # broken or incompatible build; rebuilding replaces them.
                    self._discard(digest)
                else:
                    return self._remember(digest, obj, disk_hit=True)
        if quick is not None:
            return self._get_quick(key, build, load, quick)
        payload = _checked(build())
        # Load before writing so an artifact that cannot be loaded is never persisted.
        obj = load(payload)
        if self.directory is not None:
            self._store(digest, payload)
        return self._remember(digest, obj, disk_hit=False)

    def _get_quick(self, key: CacheKey, build: Callable[[], bytes], load: Callable[[bytes], T],
                   quick: Callable[[], tuple[bytes, bool]]) -> T:
        """:meth:`get` after a miss of the full build, with a quick build allowed."""
        digest, quick_digest = key.digest(), key.quick().digest()
        payload = self._read(quick_digest) if self.directory is not None else None
        disk_hit, final = payload is not None, False
        if payload is not None:
            try:
                obj = load(payload)
            except Exception:
                self._discard(quick_digest)
                payload = None
        if payload is None:
            payload, final = quick()
            payload = _checked(payload)
            obj = load(payload)
            if self.directory is not None:
                self._store(digest if final else quick_digest, payload)
        kept = self._remember(digest, obj, disk_hit=disk_hit)
        if kept is obj and not final:

            def full() -> T:
                artifact = _checked(build())
                promoted = load(artifact)
                if self.directory is not None:
                    # The quick entry's deferred write, if any, lands before it goes.
                    _writer.flush()
                    self._write(digest, artifact)
                    with contextlib.suppress(OSError):  # found after the full one anyway
                        self._path(quick_digest).unlink()
                return promoted

            obj.promote_when_hot(full)
        return kept

    def prepare(self, key: CacheKey, build: Callable[[], bytes]) -> bool:
        """Write ``build()``'s artifact to disk, where :meth:`get` finds it first, without
        loading it: the full build that another process then loads (a helper process's
        work). True when it is on disk (False: no directory, or the entry could not be
        written)."""
        if self.directory is None:
            return False
        digest = key.digest()
        return self._read(digest) is not None or self._write(digest, _checked(build()))

    def artifact(self, key: CacheKey, build: Callable[[], bytes], counted: bool = True) -> bytes:
        """The artifact bytes for ``key``: the disk copy if a valid one exists, else
        ``build()``'s, written to disk. Nothing is loaded (nor kept in memory): the
        artifact may be for a machine other than this one (:func:`hologram.build`).
        ``counted=False``: not counted in :meth:`info`'s hits and misses (a backend's own
        support code, which is not a program)."""
        digest = key.digest()
        if self.directory is not None:
            payload = self._read(digest)
            if payload is not None:
                with self._lock:
                    self._disk_hits += counted
                return payload
        payload = _checked(build())
        with self._lock:
            self._misses += counted
        if self.directory is not None:
            self._write(digest, payload)
        return payload

    def _remember(self, digest: str, obj: Any, *, disk_hit: bool) -> Any:
        with self._lock:
            if disk_hit:
                self._disk_hits += 1
            else:
                self._misses += 1
            # Another thread may have stored this key meanwhile; share its object.
            obj = self._memory.setdefault(digest, obj)
            self._memory.move_to_end(digest)
            while len(self._memory) > self.max_entries:
                self._memory.popitem(last=False)
            return obj

    def _path(self, digest: str) -> Path:
        assert self.directory is not None
        return self.directory / digest[:2] / f"{digest}.bin"

    def _note_disk_error(self, message: str) -> None:
        # One attribute store (atomic): no lock, which the writer thread would otherwise
        # take, and a fork could leave held in the child.
        self._last_disk_error = message

    def _read(self, digest: str) -> bytes | None:
        """Return the verified payload, or None if the entry is absent or damaged."""
        path = self._path(digest)
        pending = _writer.pending(path)
        if pending is not None:  # written soon (deferred_writes): as good as on disk
            return pending
        try:
            data = _read_entry_file(path)
            payload = None if data is None else _unpack(data, digest)
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._note_disk_error(f"reading {path}: {exc}")
            return None
        except Exception:
            # MemoryError, a parsing error: whatever the file holds, it cannot be used,
            # and rebuilding is always safe; failing the compile would not be.
            payload = None
        if payload is None:
            self._discard(digest)
        return payload

    def _discard(self, digest: str) -> None:
        with self._lock:
            self._corrupt += 1
        # Already gone (another process), or unremovable (a directory): the rebuild
        # overwrites it, or fails to and records why.
        with contextlib.suppress(OSError):
            self._path(digest).unlink()

    def _store(self, digest: str, payload: bytes) -> None:
        """Write the entry now, or on the background thread inside :func:`deferred_writes`."""
        if _deferring.on:
            _writer.submit(self, self._path(digest), digest, payload)
        else:
            self._write(digest, payload)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every deferred write (:func:`deferred_writes`) is on disk; False if
        ``timeout`` seconds passed first."""
        return _writer.flush(timeout)

    def _write(self, digest: str, payload: bytes) -> bool:
        """Write the entry (atomically); False, with the reason noted, where it could not
        be written."""
        path = self._path(digest)
        data = _pack(digest, payload)
        if len(data) > MAX_ENTRY_BYTES:
            # It could never be read back.
            self._note_disk_error(f"not writing {path}: {len(data)} bytes is over "
                                  f"MAX_ENTRY_BYTES ({MAX_ENTRY_BYTES})")
            return False
        tmp: str | None = None
        try:
            # A private temp file per writer plus an atomic rename means concurrent
            # processes never see each other's half-written files. No fsync, of the file
            # or the directory: an entry lost or torn by a crash fails the checksum and is
            # rebuilt, and a first training step writes a hundred entries (an fsync each
            # took ~4 ms of its wall time on a busy disk). The shard directory is made
            # only when missing (a mkdir that finds it cost ~0.15 ms per entry here).
            try:
                fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            except FileNotFoundError:
                path.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
            tmp = None
            return True
        except OSError as exc:
            self._note_disk_error(f"writing {path}: {exc}")
            return False
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)

    def _disk_files(self) -> Iterator[Path]:
        """Yield the cache's own entry files, never anything else in the directory."""
        if self.directory is None:
            return
        try:
            shards = [d for d in self.directory.iterdir() if _SHARD.fullmatch(d.name)]
            for shard in shards:
                if shard.is_dir():
                    for entry in shard.iterdir():
                        if _ENTRY.fullmatch(entry.name) and entry.name.startswith(shard.name):
                            yield entry
        except OSError as exc:
            self._note_disk_error(f"scanning {self.directory}: {exc}")

    def info(self) -> dict[str, Any]:
        """Counters since creation (or the last clear) and the current disk usage (deferred
        writes are waited for first)."""
        _writer.flush()
        disk_entries = disk_bytes = 0
        for path in self._disk_files():
            try:
                disk_bytes += path.stat().st_size
                disk_entries += 1
            except OSError:
                pass  # Removed by another process while scanning.
        with self._lock:
            return {
                "hits": self._hits,
                "disk_hits": self._disk_hits,
                "misses": self._misses,
                "corrupt": self._corrupt,
                "entries": len(self._memory),
                "disk_entries": disk_entries,
                "disk_bytes": disk_bytes,
                "directory": str(self.directory) if self.directory is not None else None,
                "last_disk_error": self._last_disk_error,
            }

    def clear(self, disk: bool = True) -> None:
        """Forget every entry (and, if ``disk``, delete this cache's files) and reset counters."""
        _writer.flush()
        with self._lock:
            self._memory.clear()
            self._reset_counters()
        if disk:
            for path in list(self._disk_files()):
                with contextlib.suppress(OSError):
                    path.unlink()
            # Shard directories stay: removing one could race with a writer that just
            # created it, and empty directories cost nothing.


class _Deferring(threading.local):
    on = False


_deferring = _Deferring()


@contextlib.contextmanager
def deferred_writes():
    """Inside this block (on this thread), entries the program cache makes are written to
    disk on a background thread instead of before the compile returns: the torch device
    compiles each kernel while a training step waits for it, and a first step writes a
    hundred entries (~0.3 ms each on a busy disk). See the module docstring."""
    before = _deferring.on
    _deferring.on = True
    try:
        yield
    finally:
        _deferring.on = before


class _Writer:
    """The background thread of deferred writes: entries written in the order submitted;
    ``pending`` maps each path to the payload not yet written there (the latest one)."""

    def __init__(self) -> None:
        self.forget()

    def forget(self) -> None:
        """No thread and nothing pending: in a forked child (the parent writes its own)."""
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._queue: deque = deque()
        self._pending: dict[Path, tuple[int, bytes]] = {}
        self._submitted = self._done = 0
        self._thread: threading.Thread | None = None

    def submit(self, cache: ProgramCache, path: Path, digest: str, payload: bytes) -> None:
        with self._lock:
            self._submitted += 1
            self._pending[path] = (self._submitted, payload)
            self._queue.append((self._submitted, cache, path, digest, payload))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="hologram-cache-writer",
                                                daemon=True)
                self._thread.start()
            self._changed.notify_all()

    def pending(self, path: Path) -> bytes | None:
        if not self._pending:  # (the usual case: no lock)
            return None
        with self._lock:
            entry = self._pending.get(path)
        return entry[1] if entry is not None else None

    def flush(self, timeout: float | None = None) -> bool:
        with self._lock:
            if self._thread is None or self._thread is threading.current_thread():
                return True
            target = self._submitted
            return self._changed.wait_for(lambda: self._done >= target, timeout)

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue:
                    self._changed.wait()
                number, cache, path, digest, payload = self._queue.popleft()
            try:
                cache._write(digest, payload)
            except Exception as exc:  # never the thread's end: later writes still happen
                cache._note_disk_error(f"writing {path}: {exc!r}")
            finally:
                with self._lock:
                    if self._pending.get(path, (None,))[0] == number:
                        del self._pending[path]
                    self._done = number
                    self._changed.notify_all()


_writer = _Writer()
atexit.register(_writer.flush)  # registered first: runs after the promotions' stop
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_writer.forget)


def _checked(payload: Any) -> bytes:
    """``payload`` as bytes; a builder that returns anything else is a bug."""
    if not isinstance(payload, bytes | bytearray):
        raise CacheError(f"build() must return bytes, got {type(payload).__name__}")
    return bytes(payload)


def _pack(digest: str, payload: bytes) -> bytes:
    """The entry file for ``payload`` stored under key digest ``digest``."""
    body = bytes.fromhex(digest) + payload
    return _HEADER.pack(MAGIC, len(body), hashlib.sha256(body).digest()) + body


def _unpack(data: bytes, digest: str) -> bytes | None:
    """The payload of entry file ``data``, or None unless it is intact and was written for
    key digest ``digest``."""
    if len(data) < _HEADER.size + _KEY_SIZE:
        return None
    magic, length, checksum = _HEADER.unpack_from(data)
    body = data[_HEADER.size :]
    if magic != MAGIC or length != len(body) or hashlib.sha256(body).digest() != checksum:
        return None
    if body[:_KEY_SIZE] != bytes.fromhex(digest):
        return None  # another entry's file under this name
    return body[_KEY_SIZE:]


def _is_entry_file(st: os.stat_result) -> bool:
    return stat.S_ISREG(st.st_mode) and st.st_size <= MAX_ENTRY_BYTES


def _read_entry_file(path: Path) -> bytes | None:
    """The contents of the file at ``path``, or None if it cannot be an entry file.

    A symlink to a regular file is followed and read like any entry (the checksum and the
    key decide); anything else is never opened (see the module docstring).
    """
    if not _is_entry_file(os.stat(path)):
        return None
    with os.fdopen(os.open(path, _OPEN_FLAGS), "rb") as f:
        # Check again what was opened, and read no more than its size then: the path may
        # have been replaced since the stat, and a file still growing must not be followed.
        st = os.fstat(f.fileno())
        return f.read(st.st_size) if _is_entry_file(st) else None


_default: ProgramCache | None = None
_default_settings: tuple[Path | None, int] | None = None
_default_lock = threading.Lock()


def default_cache() -> ProgramCache:
    """The process-wide cache, rebuilt whenever the ``HOLOGRAM_CACHE_*`` settings change."""
    global _default, _default_settings
    settings = config.get()
    wanted = (settings.cache_dir if settings.disk_cache else None, settings.cache_size)
    with _default_lock:
        if _default is None or _default_settings != wanted:
            _default = ProgramCache(wanted[0], max_entries=wanted[1])
            _default_settings = wanted
        return _default


def cache_info() -> dict[str, Any]:
    """:meth:`ProgramCache.info` of :func:`default_cache`."""
    return default_cache().info()


def clear_cache(disk: bool = True) -> None:
    """:meth:`ProgramCache.clear` of :func:`default_cache`."""
    default_cache().clear(disk=disk)


def _python_files(path: str) -> list[str]:
    """``path`` if it is a Python file, else the Python files below it."""
    if path.endswith(".py"):
        return [path]
    return [os.path.join(folder, name) for folder, _, names in os.walk(path)
            for name in names if name.endswith(".py")]


def _digests() -> dict[str, str]:
    """Digests of the sources that turn programs into code, by part: ``""`` for what
    every backend uses (the ISA, the passes, the shared code generation, the backends'
    common modules and the interpreter, which others run kernels on), and each backend's
    own folder under its name. Of each file's path, size and modification time (reading
    and hashing the contents took 1 ms, this 0.2): an edit, a checkout or a reinstall
    changes it."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    shared = [os.path.join(root, p) for p in ("isa", "compiler", "codegen")]
    backends_dir = os.path.join(root, "backends")
    parts: dict[str, list[str]] = {"": shared}
    for name in sorted(os.listdir(backends_dir)):
        path = os.path.join(backends_dir, name)
        if name.endswith(".py") or name == "interp":
            parts[""].append(path)
        elif os.path.isdir(path) and not name.startswith("__"):
            parts[name] = [path]
    digests = {}
    for part, paths in parts.items():
        files = sorted(file for path in paths for file in _python_files(path))
        digest = hashlib.sha256()
        for file in files:
            st = os.stat(file)
            digest.update(f"{os.path.relpath(file, root)}\0{st.st_size}\0{st.st_mtime_ns}\n"
                          .encode())
        digests[part] = digest.hexdigest()
    return digests


# Computed now, while the process imports the code generator, not at its first disk-cache
# lookup: a process that had imported the code before one of those files was edited filed
# the old code's artifacts under the new files' digest, and every later process loaded
# them (a quick build of sin from an intermediate mathlib, left by a long-running process
# while the file was being edited, gave inf for huge float32 arguments).
_DIGESTS = _digests()


@functools.cache
def compiler_version(backend: str | None = None) -> str:
    """The package version plus a digest of the sources that turn programs into code for
    ``backend`` (the shared parts and its own folder; None: every backend's): a changed
    code generator never reuses artifacts compiled by the old one, even between
    releases, and an edit of one backend leaves the others' artifacts valid."""
    parts = [""] + ([backend] if backend is not None else sorted(set(_DIGESTS) - {""}))
    digest = hashlib.sha256("".join(_DIGESTS.get(p, p) for p in parts).encode())
    return f"{__version__}+{digest.hexdigest()[:16]}"
