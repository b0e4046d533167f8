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
"""

from __future__ import annotations

import os
import queue
import time
from dataclasses import dataclass
from pathlib import Path

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver
from watchdog.observers.polling import PollingObserver

from store.records import NewProblem, Store

TEMP_SUFFIXES = (".tmp", ".part", ".swp", ".swx", "~", ".crdownload")
READY_EVENTS = frozenset({"closed", "moved"})


def classify(name: str) -> tuple[str, str] | None:
    """``(role, problem name)`` for an inbox file name; role is reference, sidecar, start or
    ignored. ``None`` for a temporary or hidden file (a write still in progress)."""
    if name.startswith(".") or name.endswith(TEMP_SUFFIXES) or ".tmp-" in name:
        return None
    if name.endswith(".new.py") and len(name) > len(".new.py"):
        return "start", name[: -len(".new.py")]
    if name.endswith(".py") and len(name) > len(".py"):
        return "reference", name[: -len(".py")]
    if name.endswith(".toml") and len(name) > len(".toml"):
        return "sidecar", name[: -len(".toml")]
    return "ignored", name


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
        if event.is_directory:
            return
        path = event.dest_path if event.event_type == "moved" else event.src_path
        self.events.put((event.event_type, os.fsdecode(path)))


def _signature(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
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
        if sig is None or not path.is_file():
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
        for entry in os.scandir(self.folder):
            self._see(Path(entry.path), now, ready=False)
        self.next_rescan = now + self.rescan_s

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


def read_problem(reference: Path) -> NewProblem:
    """Read a reference with its sidecar and starting candidate, and check it statically
    (parses, defines the required names, sidecar well formed) without running any of it."""
    from kernelabd.harness.problem import ProblemError, load_problem

    name = reference.name[: -len(".py")]
    sidecar = reference.with_name(f"{name}.toml")
    start = reference.with_name(f"{name}.new.py")
    error = None
    try:
        load_problem(reference)
    except ProblemError as exc:
        error = str(exc)
    return NewProblem(name=name, path=str(reference), source=_read(reference) or "",
                      sidecar=_read(sidecar), start_source=_read(start), error=error)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def take_ready(inbox: Inbox, store: Store) -> list[int]:
    """Record every complete problem in the inbox (a new revision, a new job); returns the new
    job ids. Unchanged content is recognised by its hash and records nothing."""
    groups: dict[str, list[Path]] = {}
    for path in inbox.complete():
        role = classify(path.name)
        if role is None:
            inbox.mark_ignored(path)
        elif role[0] == "ignored":
            inbox.mark_ignored(path)
            store.event("inbox.ignored", f"{path.name}: not NAME.py, NAME.toml or NAME.new.py",
                        level="warning")
        else:
            groups.setdefault(role[1], []).append(path)
    jobs = []
    for name, paths in groups.items():
        reference = inbox.folder / f"{name}.py"
        if not reference.is_file():
            for path in paths:      # a sidecar or start waits for its reference, read then
                inbox.mark_taken(path)
            continue
        if inbox.busy({name}):
            continue
        problem = read_problem(reference)
        for path in (reference, reference.with_name(f"{name}.toml"),
                     reference.with_name(f"{name}.new.py")):
            if path.exists():
                inbox.mark_taken(path)
        added = store.add_problem(problem)
        if added is None:
            continue
        jobs.append(added[1])
        if problem.error:
            store.event("problem.invalid", problem.error, level="warning", job_id=added[1])
        else:
            store.event("job.queued", f"{name}.py (problem {added[0]})", job_id=added[1])
    return jobs
