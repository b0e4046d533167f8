"""The inbox: which dropped files are complete, and what each one is.

A file is taken when it was closed after writing or renamed into the inbox (watchdog's
``closed``/``moved`` events), or, when no such event can come (a ``PollingObserver`` on a
network filesystem, a rescan), when its size and mtime have not changed for ``stable_s``. A
full rescan runs at start and every ``rescan_s``, so files dropped while the daemon was down or
lost to an inotify overflow are still found. The watchdog thread only enqueues paths; all
stat-ing and deciding happens on the daemon's thread.

Naming: ``NAME.py`` is a reference, ``NAME.toml`` its sidecar, ``NAME.new.py`` a starting
candidate. Hidden files and temporary names (``.x.tmp-123``, ``*.part``, ``*~``) are writes in
progress and are skipped silently; anything else is ignored with an event.

The inbox is a trust boundary, and nothing dropped there stops the daemon: only regular files
are read (symbolic links, FIFOs, directories and sockets are refused with an event, and every
file is opened with ``O_NOFOLLOW | O_NONBLOCK``, so nothing outside the inbox is read through
it and nothing blocks), each once and at most ``MAX_FILE_BYTES``; an error on one file is an
``invalid`` job or an event naming it. Before it reads a problem's files the watcher writes
their names to ``MARKER``; should the daemon die there all the same (killed, out of memory),
the next start finds the marker and moves those files to ``.rejected/`` with a reason, so that
one file can never make a crash loop.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import queue
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver
from watchdog.observers.polling import PollingObserver

from kernelabd.harness.problem import ProblemError, one_line, validate_reference
from store.records import NewProblem, Store

TEMP_SUFFIXES = (".tmp", ".part", ".swp", ".swx", "~", ".crdownload")
READY_EVENTS = frozenset({"closed", "moved"})
ROLE_SUFFIXES = {"reference": ".py", "sidecar": ".toml", "start": ".new.py"}
MAX_FILE_BYTES = 1 << 20        # a reference is kilobytes; parsing 1 MiB can take seconds
MARKER = ".kernelab-taking"     # names of the files being read, while they are read
REJECTED = ".rejected"          # files the daemon died on, each set in a folder with a reason
NAME_MAX = 255                  # bytes in a file name, where pathconf cannot say
log = logging.getLogger("kernelab.inbox")


def classify(name: str) -> tuple[str, str] | None:
    """``(role, problem name)`` for an inbox file name; role is reference, sidecar, start or
    ignored. ``None`` for a temporary or hidden file (a write still in progress)."""
    if name.startswith(".") or name.endswith(TEMP_SUFFIXES) or ".tmp-" in name:
        return None
    for role in ("start", "reference", "sidecar"):
        suffix = ROLE_SUFFIXES[role]
        if name.endswith(suffix) and len(name) > len(suffix):
            return role, name[: -len(suffix)]
    return "ignored", name


def printable(text: str) -> str:
    """``text`` safe to record and show: undecodable bytes of a file name (surrogates, which
    SQLite refuses) and control characters (which a terminal would obey) written as escapes."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


class Refused(Exception):
    """A file the inbox does not take; the message is one line naming it."""


def describe(path: Path, st: os.stat_result) -> str:
    """What a non-regular inbox entry is, in words (a link's target is read from the link
    itself, never followed)."""
    if stat.S_ISLNK(st.st_mode):
        try:
            return f"a symbolic link (to {printable(os.readlink(path))})"
        except OSError:
            return "a symbolic link"
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
    return next((words for test, words in kinds if test(st.st_mode)), "not a regular file")


def not_regular(path: Path, st: os.stat_result) -> str:
    return f"{printable(path.name)}: {describe(path, st)}; the inbox takes regular files only"


def read_regular(path: Path, limit: int = MAX_FILE_BYTES) -> bytes | None:
    """The bytes of the regular file at ``path``, ``None`` when there is none; ``Refused`` for
    anything else. Opened without following a link and without blocking (a FIFO), then checked
    on the open descriptor, so a swap between looking and opening changes nothing."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:      # ELOOP: a link; ENXIO: a socket; or unreadable
        raise Refused(_unopenable(path, exc)) from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(not_regular(path, st))
        if st.st_size > limit:
            raise Refused(f"{printable(path.name)}: {st.st_size} bytes, over the inbox's limit of {limit}")
        chunks, size = [], 0
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise Refused(f"{printable(path.name)}: grew past the inbox's limit of {limit} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def _unopenable(path: Path, exc: OSError) -> str:
    try:
        st = path.lstat()
    except OSError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        return not_regular(path, st)
    return f"{printable(path.name)}: cannot read: {printable(exc.strerror or str(exc))}"


def decode(data: bytes, name: str) -> tuple[str, str | None]:
    """The text of a file's bytes (undecodable bytes as U+FFFD, so that what was dropped can
    still be shown) and why it is not UTF-8 text, if it is not."""
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        return (data.decode("utf-8", "replace"),
                f"{printable(name)}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})")


@dataclass
class Pending:
    """A file seen but not yet taken: its last observed size/mtime and since when."""

    signature: tuple[int, int]
    since: float
    ready: bool = False


class _Handler(FileSystemEventHandler):
    """Runs on watchdog's thread: enqueue and return, nothing else."""

    def __init__(self, events: queue.SimpleQueue[tuple[str, str]]) -> None:
        self.events = events

    def on_any_event(self, event: FileSystemEvent) -> None:
        path = event.dest_path if event.event_type == "moved" else event.src_path
        self.events.put((event.event_type, os.fsdecode(path)))


def _signature(path: Path) -> tuple[int, int] | None:
    """Size and mtime of the entry itself (a link is not followed)."""
    try:
        st = path.lstat()
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


class Inbox:
    """Tracks the inbox and hands out problem names whose files are complete."""

    def __init__(self, folder: Path, *, stable_s: float, rescan_s: float,
                 polling: bool = False) -> None:
        self.folder = folder
        self.stable_s = stable_s
        self.rescan_s = rescan_s
        self.polling = polling
        self.events: queue.SimpleQueue[tuple[str, str]] = queue.SimpleQueue()
        self.pending: dict[Path, Pending] = {}
        self.taken: dict[Path, tuple[int, int]] = {}
        self.ignored: dict[Path, tuple[int, int]] = {}
        self.observer: BaseObserver | None = None
        self.next_rescan = 0.0
        self.marker = folder / MARKER
        self.failing: str | None = None     # why the last rescan failed, recorded once

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.observer = PollingObserver() if self.polling else Observer()
        self.observer.schedule(_Handler(self.events), str(self.folder), recursive=False)
        self.observer.start()

    def stop(self) -> None:
        if self.observer is not None:
            self.observer.stop()
            self.observer.join(timeout=5)

    def _see(self, path: Path, now: float, ready: bool) -> None:
        sig = _signature(path)
        if sig is None or path.name == MARKER:
            self.pending.pop(path, None)
            return
        if self.taken.get(path) == sig or self.ignored.get(path) == sig:
            return
        entry = self.pending.get(path)
        if entry is None or entry.signature != sig:
            # A file found by a rescan counts as changed at its mtime, not at "now", so that a
            # file left there while the daemon was down is taken at once.
            since = now if entry is not None or ready else min(now, sig[1] / 1e9)
            entry = Pending(sig, since)
            self.pending[path] = entry
        entry.ready = entry.ready or ready

    def rescan(self, now: float) -> None:
        self.next_rescan = now + self.rescan_s
        for entry in os.scandir(self.folder):
            self._see(Path(entry.path), now, ready=False)
        self.failing = None

    def _drain(self, now: float) -> None:
        while True:
            try:
                kind, raw = self.events.get_nowait()
            except queue.Empty:
                return
            path = Path(raw)
            if path.parent != self.folder or kind in ("deleted", "opened", "closed_no_write"):
                continue
            self._see(path, now, ready=kind in READY_EVENTS)

    def complete(self, now: float | None = None) -> list[Path]:
        """Files that are complete now (rechecked: a stable file is stat-ed once more)."""
        now = time.time() if now is None else now
        self._drain(now)
        if now >= self.next_rescan:
            self.rescan(now)
        done = []
        for path, entry in list(self.pending.items()):
            sig = _signature(path)
            if sig is None:
                del self.pending[path]
            elif sig != entry.signature:
                self.pending[path] = Pending(sig, now)
            elif entry.ready or now - entry.since >= self.stable_s:
                done.append(path)
        return done

    def busy(self, names: set[str]) -> bool:
        """Whether a file of one of these problems is still being written."""
        for path, entry in self.pending.items():
            role = classify(path.name)
            if role is not None and role[1] in names and not entry.ready \
                    and time.time() - entry.since < self.stable_s:
                return True
        return False

    def alone(self, path: Path) -> bool:
        """Whether a file has been complete for ``stable_s`` (a sidecar renamed in just before
        its reference, as ``kernelab submit`` does, is not yet said to wait for it)."""
        entry = self.pending.get(path)
        return entry is None or time.time() - entry.since >= self.stable_s

    def mark_taken(self, path: Path) -> None:
        sig = self.pending.pop(path).signature if path in self.pending else _signature(path)
        if sig is not None:
            self.taken[path] = sig

    def mark_ignored(self, path: Path) -> None:
        sig = self.pending.pop(path).signature if path in self.pending else _signature(path)
        if sig is not None:
            self.ignored[path] = sig

    @property
    def idle(self) -> bool:
        """Nothing waiting to become stable (``--once`` may stop)."""
        return not self.pending and self.next_rescan > 0

    @contextlib.contextmanager
    def taking(self, paths: list[Path]) -> Iterator[None]:
        """Name ``paths`` in the marker while they are read and recorded; a marker still there
        at the next start means the daemon died on them (``quarantine``). It appears whole
        (written aside, then renamed): a daemon killed while writing it leaves no empty marker
        that would let the file it died on through again."""
        aside = self.marker.with_name(self.marker.name + ".new")
        try:
            aside.write_text(json.dumps({"pid": os.getpid(), "since": time.time(),
                                         "files": [p.name for p in paths]}))
            os.replace(aside, self.marker)
        except OSError as exc:  # an unwritable inbox loses the guard, not the file
            log.warning("inbox.marker", extra={"detail": f"{self.marker}: {exc}"})
        try:
            yield
        finally:
            self.marker.unlink(missing_ok=True)


def name_error(reference: Path) -> str | None:
    """Why a reference's name cannot be a problem's: kernelab keeps ``NAME.toml`` and
    ``NAME.new.py`` beside it (in the inbox, its work folder and its results), so the longest
    of them must fit the file system's limit on a name."""
    try:
        limit = os.pathconf(reference.parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = NAME_MAX
    name = reference.name[: -len(ROLE_SUFFIXES["reference"])]
    longest = len(os.fsencode(name + ROLE_SUFFIXES["start"]))
    if longest <= limit:
        return None
    return (f"{printable(reference.name)}: the name is too long: {printable(name)}.new.py beside it would be "
            f"{longest} bytes, over the file system's limit of {limit}")


def read_problem(reference: Path) -> NewProblem:
    """Read a reference with its sidecar and starting candidate (regular files only, each once)
    and check them statically (parses, defines the required names, the sidecar follows its
    schema) without running any of it. A starting candidate that is not even text is kept, as
    read, for the gate to refuse as that candidate."""
    name = reference.name[: -len(ROLE_SUFFIXES["reference"])]
    paths = {role: reference.with_name(name + suffix) for role, suffix in ROLE_SUFFIXES.items()}
    errors: list[str] = []
    too_long = name_error(reference)
    if too_long:
        errors.append(too_long)
    texts: dict[str, str | None] = {}
    for role, path in paths.items():
        texts[role] = None
        if too_long and role != "reference":
            continue
        try:
            data = read_regular(path)
        except Refused as exc:
            errors.append(str(exc))
            continue
        if data is None:
            if role == "reference":
                errors.append(f"{printable(path.name)}: no such file")
            continue
        texts[role], undecodable = decode(data, path.name)
        if undecodable and role != "start":
            errors.append(undecodable)
    if not errors:
        try:
            validate_reference(texts["reference"] or "", printable(reference.name), texts["sidecar"],
                               printable(paths["sidecar"].name))
        except ProblemError as exc:
            errors.append(printable(str(exc)))
    return NewProblem(name=printable(name), path=printable(str(reference)), source=texts["reference"] or "",
                      sidecar=texts["sidecar"], start_source=texts["start"],
                      error=errors[0] if errors else None)


def take_ready(inbox: Inbox, store: Store) -> list[int]:
    """Record every complete problem in the inbox (a new revision, a new job); returns the new
    job ids. Unchanged content is recognised by its hash and records nothing. Never raises for
    what is in the inbox: each file's error is an ``invalid`` job or an event naming it."""
    try:
        complete = inbox.complete()
    except OSError as exc:      # the inbox itself (removed, unreadable): said once, retried
        message = f"{printable(str(inbox.folder))}: cannot scan the inbox: {printable(str(exc))}"
        if message != inbox.failing:
            store.event("inbox.error", message, level="error")
        inbox.failing = message
        return []
    groups: dict[str, list[Path]] = {}
    for path in complete:
        try:
            role = admit(inbox, store, path)
        except Exception as exc:
            refuse(inbox, store, path, f"{printable(path.name)}: {printable(one_line(exc))}",
                   "inbox.error", "error")
            continue
        if role is not None:
            groups.setdefault(role[1], []).append(path)
    jobs = []
    for name, paths in groups.items():
        try:
            job = take_problem(inbox, store, name, paths)
        except Exception as exc:
            for path in paths:
                inbox.mark_ignored(path)
            store.event("inbox.error", f"{printable(name)}.py: {printable(one_line(exc))}", level="error")
            continue
        if job is not None:
            jobs.append(job)
    return jobs


def refuse(inbox: Inbox, store: Store, path: Path, message: str, kind: str = "inbox.refused",
           level: str = "warning") -> None:
    """Record why a file is not taken, once (until it changes)."""
    inbox.mark_ignored(path)
    store.event(kind, message, level=level)


def admit(inbox: Inbox, store: Store, path: Path) -> tuple[str, str] | None:
    """The role of a complete inbox entry, or ``None`` once it is refused or skipped."""
    role = classify(path.name)
    try:
        st = path.lstat()
    except FileNotFoundError:
        inbox.pending.pop(path, None)
        return None
    if role is None:
        inbox.mark_ignored(path)
        return None
    if printable(path.name) != path.name:
        refuse(inbox, store, path, f"{printable(path.name)}: the name has control characters or "
               "is not UTF-8; rename it")
        return None
    if not stat.S_ISREG(st.st_mode):
        refuse(inbox, store, path, not_regular(path, st))
        return None
    if role[0] == "ignored":
        refuse(inbox, store, path, f"{path.name}: not NAME.py, NAME.toml or NAME.new.py", "inbox.ignored")
        return None
    return role


def take_problem(inbox: Inbox, store: Store, name: str, paths: list[Path]) -> int | None:
    """Record one problem whose files are complete; its new job's id, if any."""
    reference = inbox.folder / f"{name}{ROLE_SUFFIXES['reference']}"
    try:
        waiting = not stat.S_ISREG(reference.lstat().st_mode)
    except FileNotFoundError:
        waiting = True
    if waiting:
        for path in paths:      # a sidecar or start waits for its reference, read then
            if inbox.alone(path):
                inbox.mark_taken(path)
                store.event("inbox.waiting", f"{path.name}: kept for {name}.py, which is not in the "
                            "inbox yet; they are taken together")
        return None
    if inbox.busy({name}):
        return None
    members = [reference.with_name(name + suffix) for suffix in ROLE_SUFFIXES.values()]
    with inbox.taking(members):
        problem = read_problem(reference)
        for path in members:
            if os.path.lexists(path):
                inbox.mark_taken(path)
        added = store.add_problem(problem)
    if added is None:
        return None
    if problem.error:
        store.event("problem.invalid", problem.error, level="warning", job_id=added[1])
    else:
        store.event("job.queued", f"{problem.name}.py (problem {added[0]})", job_id=added[1])
    return added[1]


def quarantine(inbox: Inbox, store: Store) -> Path | None:
    """At start: when the last daemon died while taking files (the marker is still there), move
    them to ``.rejected/WHEN/`` with a ``reason.txt`` and record it, so that they are never
    retried in a loop; returns the folder made. Files that cannot be moved stay, not taken."""
    try:
        found = json.loads(inbox.marker.read_text())
        names = [n for n in found.get("files", []) if isinstance(n, str) and "/" not in n]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, AttributeError) as exc:
        store.event("inbox.error", f"{inbox.marker.name}: unreadable ({printable(str(exc))}); removed",
                    level="error")
        inbox.marker.unlink(missing_ok=True)
        return None
    present = [inbox.folder / n for n in names if os.path.lexists(inbox.folder / n)]
    folder = None
    if present:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(found.get("since") or 0)))
        shown = ", ".join(printable(p.name) for p in present)
        reason = (f"{shown}: the daemon (pid {found.get('pid')}) died while reading "
                  f"{'them' if len(present) > 1 else 'it'} at {when}")
        try:
            folder = _rejected_folder(inbox.folder)
            for path in present:
                os.replace(path, folder / path.name)
            reason += f"; moved to {REJECTED}/{folder.name}/, not to be retried: fix, then drop again"
            (folder / "reason.txt").write_text(reason + "\n")
        except OSError as exc:
            for path in present:
                inbox.mark_ignored(path)
            reason += f"; could not be moved ({printable(str(exc))}): left in place, not taken until changed"
        store.event("inbox.quarantined", reason, level="error")
    inbox.marker.unlink(missing_ok=True)
    return folder


def _rejected_folder(inbox: Path) -> Path:
    base = inbox / REJECTED
    base.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1, 1000):
        folder = base / f"{stamp}-{n}"
        with contextlib.suppress(FileExistsError):
            folder.mkdir()
            return folder
    raise FileExistsError(errno.EEXIST, "no free folder name", str(base / stamp))
