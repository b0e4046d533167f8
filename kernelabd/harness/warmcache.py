"""A screened winner's compiled kernels, carried from the screening sandbox into the sandbox
that gates it, so that its first call loads them instead of compiling again.

A fresh candidate sandbox compiles every Triton kernel on its first call: on an H200 that was
5.5–7.6 s of each evaluation (``gate_first_call``, bench/port results of 2026-12-03), most of
an evaluation of a fast reference. The screening sandbox has just compiled and run exactly
that source (a screened winner is the batch's source with its configuration written in, the
same text), so its Triton cache already holds the kernels, and Triton looks them up by a hash
of their source, options and target, not by the file they came from.

Trust: the cache was written by untrusted code, so it only ever goes to a sandbox that runs
the same author's code, a variant of the batch that filled it: never the reference's, a
peer's or an incumbent's from another source (a poisoned entry there could slow the baseline
or fake the reference). Nothing the candidate could not already do in its own sandbox is
granted. The copy is read by this trusted process, so it never follows a link the sandbox
planted (only regular files, opened without following, directory by directory), skips
Triton's in-progress temporaries, rewrites the absolute paths of Triton's group files to the
new place (a group pointing anywhere else is dropped), and is capped in size, newest kernels
first.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

LIMIT_BYTES = 256 * 2**20      # about 250 screened configurations of a GEMM (~1 MiB each)
GROUP_PREFIX = "__grp__"


@dataclass(frozen=True)
class Carried:
    """What was carried: entries (one compiled kernel or launcher each), files, bytes, and
    entries left behind (over the cap, or not plain files)."""

    entries: int = 0
    files: int = 0
    bytes: int = 0
    skipped: int = 0


def carry(source: Path, dest: Path, owner: tuple[int, int] | None = None,
          limit: int = LIMIT_BYTES) -> Carried:
    """Copy Triton's cache at ``source`` (a sandbox's) into ``dest`` (another's, not yet in
    use), newest entries first while under ``limit`` bytes; ``owner`` (uid, gid) is the new
    sandbox's account where it runs as a user of its own."""
    try:
        top = os.open(source, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return Carried()
    try:
        out = _open_dest(dest, owner)
    except OSError:
        os.close(top)
        return Carried()
    entries = files = total = skipped = 0
    try:
        for name, _mtime in sorted(_entries(top), key=lambda e: e[1], reverse=True):
            found = _read_entry(top, name, limit - total)
            moved = _relocated(found, source / name, dest / name) if found else {}
            try:
                written = bool(moved) and _write_entry(out, name, moved, owner)
            except OSError:         # a full disk: what is not carried is compiled again
                written = False
            if not written:
                skipped += 1
                continue
            entries, files, total = entries + 1, files + len(moved), total + sum(map(len, moved.values()))
    finally:
        os.close(top)
        os.close(out)
    return Carried(entries, files, total, skipped)


def _open_dest(dest: Path, owner: tuple[int, int] | None) -> int:
    """The new sandbox's cache directory, made if it is not there, never through a link."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(dest, 0o755)
        if owner is not None:
            os.chown(dest, *owner)
    return os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)


def _entries(top: int) -> list[tuple[str, float]]:
    """The cache's entry directories (one per kernel hash) and when each was written."""
    found = []
    try:
        names = os.listdir(top)
    except OSError:
        return []
    for name in names:
        if name.startswith(".") or name.startswith("tmp."):
            continue
        with contextlib.suppress(OSError):
            st = os.stat(name, dir_fd=top, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                found.append((name, st.st_mtime))
    return found


def _read_entry(top: int, name: str, room: int) -> dict[str, bytes] | None:
    """An entry's plain files, None where it holds anything else or more than ``room`` bytes:
    it is then left behind (sizes are checked before anything is read)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=top)
    except OSError:
        return None
    files: dict[str, bytes] = {}
    try:
        try:
            children = os.listdir(fd)
        except OSError:             # a directory the sandbox made unreadable
            return None
        for child in children:
            if child == "lock" or child.startswith("tmp."):
                continue
            data = _read_plain(fd, child, room)
            if data is None:
                return None
            files[child] = data
            room -= len(data)
    finally:
        os.close(fd)
    return files


def _read_plain(dir_fd: int, name: str, room: int) -> bytes | None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size > room:
            return None
        data = f.read(room + 1)
    return data if len(data) <= room else None


def _relocated(files: dict[str, bytes], old: Path, new: Path) -> dict[str, bytes]:
    """Triton's group files name their members by absolute path: point them at the copy. A
    group naming anything outside its own entry, or a file not carried, is dropped, and Triton
    then compiles that kernel again."""
    out = {}
    for name, data in files.items():
        if name.startswith(GROUP_PREFIX):
            relocated = _relocated_group(data, old, new, files)
            if relocated is None:
                continue
            data = relocated
        out[name] = data
    return out


def _relocated_group(data: bytes, old: Path, new: Path, files: dict[str, bytes]) -> bytes | None:
    try:
        children = json.loads(data)["child_paths"]
        moved = {}
        for child, path in children.items():
            where = Path(path)
            if where.parent != old or where.name not in files:
                return None
            moved[str(child)] = str(new / where.name)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return json.dumps({"child_paths": moved}).encode()


def _write_entry(out: int, name: str, files: dict[str, bytes], owner: tuple[int, int] | None) -> bool:
    """Write one entry under the open directory ``out``; False where the new sandbox already
    has an entry of that name (what it compiled itself is left as it is). Triton's group file
    goes last: a copy cut short names no file that is not whole, and the kernel compiles again."""
    try:
        os.mkdir(name, 0o755, dir_fd=out)
    except FileExistsError:
        return False
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=out)
    try:
        if owner is not None:
            os.fchown(fd, *owner)
        for child, data in sorted(files.items(), key=lambda item: item[0].startswith(GROUP_PREFIX)):
            with os.fdopen(os.open(child, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644,
                                   dir_fd=fd), "wb") as f:
                if owner is not None:
                    os.fchown(f.fileno(), *owner)
                f.write(data)
    finally:
        os.close(fd)
    return True
