"""``hologram bench``'s output directory, written all at once or not at all.

:func:`check_output` says up front whether ``--out`` can be written; :func:`staged_output`
gives the run a new directory next to it (``.NAME.XXXXXXXX.tmp``, on the same file system,
so the final move is a rename) and moves it into place only when everything was written.
A failure or a KeyboardInterrupt before that removes the new directory and leaves the old
output as it was: never new results beside an old report, never a truncated results.json.

Replacing an existing directory takes two renames (``rename(2)`` does not replace a
non-empty directory): the old one aside to ``.NAME.old-XXXXXXXX``, then the new one into
place, then the old one is removed. Between the two renames ``NAME`` does not exist; a
process killed in that window (SIGKILL, power loss; a KeyboardInterrupt is handled) leaves
the old output in ``.NAME.old-*`` and the new one in ``.NAME.*.tmp`` beside it. Linux's
``renameat2(RENAME_EXCHANGE)`` would close the window; the standard library has no call for
it.

Because the whole directory is replaced, ``--out`` must be new, empty, or hold only files
``hologram bench`` writes (:data:`ARTIFACT`); anything else is refused rather than deleted.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from hologram.errors import HologramError

#: The names of the files ``hologram bench`` writes (and may therefore replace).
ARTIFACT = re.compile(r"results\.(json|csv)|report\.(md|html)"
                      r"|(speedup|scaling|heatmap|comparison_\w+)\.png")


class OutputError(HologramError):
    """``--out`` cannot be written (a file, not writable, holding other files, a disk that
    filled up). The message is one line; the previous output is unchanged."""


def check_output(out: str | os.PathLike) -> str:
    """The absolute path (symbolic links resolved) of the directory a run writing ``out``
    will create or replace. Raises :class:`OutputError` when it cannot: ``out`` is a file,
    lies under a file, is (or is under) a directory this process cannot write, holds
    files other than bench artifacts, or is the current directory or one of its parents."""
    given = os.fspath(out)
    if not given.strip():
        raise OutputError("--out is empty: name the directory to write the results into")
    path = os.path.realpath(given)
    cwd = os.path.realpath(os.getcwd())
    if os.path.commonpath([path, cwd]) == path:
        raise OutputError(f"--out {given} is the current directory or contains it; name a "
                          f"directory of its own (it is replaced as a whole)")
    parent = os.path.dirname(path)
    if os.path.lexists(path):
        if not os.path.isdir(path):
            raise OutputError(f"--out {given} exists and is not a directory")
        try:
            foreign = sorted(name for name in os.listdir(path) if not ARTIFACT.fullmatch(name)
                             or not os.path.isfile(os.path.join(path, name)))
        except OSError as exc:
            raise OutputError(f"--out {given}: cannot list it ({exc.strerror})") from exc
        if foreign:
            shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
            raise OutputError(f"--out {given} holds files hologram bench did not write "
                              f"({shown}); the directory is replaced as a whole, so name a "
                              f"new or empty one")
        for directory in (path, parent):
            if not os.access(directory, os.W_OK | os.X_OK):
                raise OutputError(f"--out {given}: {directory} is not writable")
        return path
    existing = parent
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise OutputError(f"--out {given}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise OutputError(f"--out {given}: cannot create it, {existing} is not writable")
    return path


@contextmanager
def staged_output(path: str) -> Iterator[str]:
    """A new empty directory next to ``path`` (creating ``path``'s missing parents), which
    replaces ``path`` when the ``with`` block completes. When the block raises (a
    KeyboardInterrupt too), the new directory and the parents created are removed and
    ``path`` is left as it was. A directory that cannot be created or moved into place
    raises :class:`OutputError`."""
    parent, name = os.path.split(path)
    created = _make_parents(parent)
    # Not tempfile.mkdtemp: its mode 0700 would become the output's; os.mkdir honours umask.
    staging = os.path.join(parent, f".{name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        os.mkdir(staging)
    except OSError as exc:
        _remove_empty(created)
        raise OutputError(f"cannot create a directory in {parent}: {exc.strerror}") from exc
    try:
        yield staging
        old = _move_into_place(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        _remove_empty(created)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _make_parents(parent: str) -> list[str]:
    """Create ``parent`` and its missing ancestors; returns those created, deepest first."""
    missing = []
    while not os.path.lexists(parent):
        missing.append(parent)
        parent = os.path.dirname(parent)
    for i, directory in enumerate(reversed(missing)):
        try:
            os.mkdir(directory)
        except OSError as exc:
            _remove_empty(missing[len(missing) - i:])
            raise OutputError(f"cannot create {directory}: {exc.strerror}") from exc
    return missing


def _remove_empty(directories: list[str]) -> None:
    for directory in directories:
        with suppress(OSError):
            os.rmdir(directory)


def _move_into_place(staging: str, path: str) -> str | None:
    """Rename ``staging`` to ``path``; an existing ``path`` is first renamed aside, and that
    name returned for the caller to remove (None when there was none)."""
    if not os.path.lexists(path):
        try:
            os.rename(staging, path)
        except OSError as exc:
            raise OutputError(f"cannot move the results into {path}: {exc.strerror}") from exc
        return None
    parent, name = os.path.split(path)
    old = os.path.join(parent, f".{name}.old-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(path, old)
    except OSError as exc:
        raise OutputError(f"cannot replace {path}: {exc.strerror}; it is unchanged") from exc
    try:
        os.rename(staging, path)
    except BaseException as exc:
        try:
            os.rename(old, path)
        except OSError:
            raise OutputError(f"cannot move the results into {path}, nor the previous "
                              f"output back from {old}") from exc
        if isinstance(exc, OSError):
            raise OutputError(f"cannot move the results into {path}: {exc.strerror}; it is "
                              f"unchanged") from exc
        raise
    return old
