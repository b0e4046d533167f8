"""A sandbox's host memory limit, enforced by the strongest means this machine and device allow,
and a one-line reason when it was hit.

- ``cgroup``: a cgroup v2 of its own (``memory.max``, no swap, the whole group killed together),
  where this process may make one: in a delegated subtree (systemd ``Delegate=yes``), or as root.
- ``rlimit``: ``RLIMIT_AS``, for CPU sandboxes only: CUDA reserves address ranges far larger
  than what it uses, so an address-space limit breaks every GPU sandbox.
- ``watchdog``: the resident memory of the sandbox's processes, polled from here; over the limit
  they are killed.

A limit of 0 is no limit. A breach ends the sandbox only: what it allocated is never charged to
the trusted process.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import resource
import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")
WATCH_S = 0.1                 # the watchdog's period: a sandbox can overshoot by what it allocates in it
TRUSTED_LEAF = "kernelab-trusted"   # where this cgroup's own processes move so that children get controllers
# How a process says it could not allocate (Python, torch's allocator, C++), under RLIMIT_AS.
OUT_OF_MEMORY = re.compile(r"MemoryError|can't allocate memory|std::bad_alloc|Cannot allocate memory")
# How a process says the GPU had no memory left (torch's caching allocator, the driver's VMM calls).
GPU_OUT_OF_MEMORY = re.compile(r"CUDA out of memory|CUDA_ERROR_OUT_OF_MEMORY|out of GPU memory")


def human(n: float) -> str:
    """Bytes in the unit people read limits in."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def process_table() -> dict[int, tuple[int, int]]:
    """Every process's (parent pid, resident bytes), from /proc (one pass, no children files:
    not every kernel has them)."""
    table = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as fh:
                    fields = fh.read().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue
            table[int(entry.name)] = (int(fields[1]), int(fields[21]) * PAGE)
    return table


def descendants(pid: int, table: dict[int, tuple[int, int]] | None = None) -> list[int]:
    """``pid`` and every process below it."""
    table = process_table() if table is None else table
    children: dict[int, list[int]] = {}
    for child, (parent, _) in table.items():
        children.setdefault(parent, []).append(child)
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += children.get(current, [])
    return found


def resident(pid: int) -> int:
    """Resident bytes of ``pid`` and everything below it."""
    table = process_table()
    return sum(table.get(p, (0, 0))[1] for p in descendants(pid, table))


class MemoryGuard:
    """No limit; the interface every guard has."""

    mode = "none"

    def __init__(self, limit: int, label: str) -> None:
        self.limit = limit
        self.label = label
        self._pid: int | None = None

    def preexec(self) -> None:
        """Runs in the sandbox's first process, between fork and exec."""

    def started(self, pid: int, kill: Callable[[], None]) -> None:
        self._pid = pid

    def breach(self, said: str) -> str | None:
        """Why the sandbox ended, if its limit ended it (``said``: its error or output tail)."""
        return None

    def kill(self) -> None:
        """Kill everything the guard contains (only a cgroup knows more than the process tree)."""

    def close(self) -> None:
        """Release what the guard holds, once the sandbox's processes are gone."""

    def _reason(self, how: str, held: int | None, of: str = "") -> str:
        where = f" ({human(held)} resident)" if held else ""
        return f"{how} its memory limit of {human(self.limit)}{of}{where}"


class RlimitGuard(MemoryGuard):
    """``RLIMIT_AS``: allocations past the limit fail inside the sandbox, which reports them."""

    mode = "rlimit"

    def preexec(self) -> None:
        resource.setrlimit(resource.RLIMIT_AS, (self.limit, self.limit))

    def breach(self, said: str) -> str | None:
        if not OUT_OF_MEMORY.search(said):
            return None
        held = resident(self._pid) if self._pid is not None else None
        return self._reason("ran out of", held, " of address space")


class WatchdogGuard(MemoryGuard):
    """Resident memory polled every ``WATCH_S``; over the limit the sandbox is killed."""

    mode = "watchdog"

    def __init__(self, limit: int, label: str) -> None:
        super().__init__(limit, label)
        self._stop = threading.Event()
        self._seen: int | None = None

    def started(self, pid: int, kill: Callable[[], None]) -> None:
        super().started(pid, kill)
        threading.Thread(target=self._watch, args=(pid, kill), daemon=True,
                         name=f"memory-watchdog-{self.label}").start()

    def _watch(self, pid: int, kill: Callable[[], None]) -> None:
        while not self._stop.wait(WATCH_S):
            held = resident(pid)
            if held > self.limit:
                self._seen = held
                kill()
                return

    def breach(self, said: str) -> str | None:
        return self._reason("was killed at", self._seen) if self._seen is not None else None

    def close(self) -> None:
        self._stop.set()


class CgroupGuard(MemoryGuard):
    """A cgroup v2 of the sandbox's own: the kernel kills the whole group at ``memory.max``."""

    mode = "cgroup"

    def __init__(self, limit: int, label: str, parent: Path) -> None:
        super().__init__(limit, label)
        self.path = parent / f"kernelab-{label}-{secrets.token_hex(4)}"
        self.path.mkdir()
        (self.path / "memory.max").write_text(str(limit))
        for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
            with contextlib.suppress(FileNotFoundError):
                (self.path / name).write_text(value)
        self._procs = os.open(self.path / "cgroup.procs", os.O_WRONLY)

    def preexec(self) -> None:
        os.write(self._procs, b"0")

    def started(self, pid: int, kill: Callable[[], None]) -> None:
        super().started(pid, kill)
        os.close(self._procs)
        self._procs = -1

    def _events(self) -> dict[str, int]:
        try:
            lines = (self.path / "memory.events").read_text().split("\n")
        except OSError:
            return {}
        return {k: int(v) for k, v in (ln.split() for ln in lines if ln.strip())}

    def breach(self, said: str) -> str | None:
        events = self._events()
        if not (events.get("oom_kill") or events.get("oom_group_kill")):
            return None
        peak = None
        for name in ("memory.peak", "memory.current"):
            with contextlib.suppress(OSError, ValueError):
                peak = int((self.path / name).read_text())
                break
        return self._reason("was killed at", peak)

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            (self.path / "cgroup.kill").write_text("1")

    def close(self) -> None:
        if self._procs >= 0:
            os.close(self._procs)
        for _ in range(50):   # the group empties as the kernel reaps what was killed
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                self.kill()
                time.sleep(0.02)


def _cgroup_dir() -> Path | None:
    """This process's cgroup v2 directory, if the unified hierarchy is mounted."""
    try:
        line = next(ln for ln in Path("/proc/self/cgroup").read_text().splitlines() if ln.startswith("0::"))
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except (OSError, StopIteration):
        return None
    for mount in mounts:
        left, _, right = mount.partition(" - ")
        if right.split()[:1] == ["cgroup2"]:
            return Path(left.split()[4]) / line[3:].lstrip("/")
    return None


def _enable_memory(here: Path) -> None:
    """Let child cgroups of ``here`` have the memory controller. A cgroup that holds processes
    cannot hand controllers down (except the root), so they move to a leaf of their own first."""
    control = here / "cgroup.subtree_control"
    if "memory" in control.read_text().split():
        return
    if (here / "cgroup.type").exists():     # not the root cgroup, which may keep its processes
        leaf = here / TRUSTED_LEAF
        leaf.mkdir(exist_ok=True)
        for pid in (here / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                (leaf / "cgroup.procs").write_text(pid)
    control.write_text("+memory")


def _ours(here: Path) -> bool:
    """Whether sandbox cgroups may go under ``here``: it hands memory down already, or it is the
    root cgroup, or systemd delegated it to us (``Delegate=``, marked by an extended attribute).
    A cgroup that systemd manages for someone else is left alone, even by root."""
    try:
        if "memory" in (here / "cgroup.subtree_control").read_text().split():
            return True
    except OSError:
        return False
    if not (here / "cgroup.type").exists():
        return True
    for name in ("trusted.delegate", "user.delegate"):
        with contextlib.suppress(OSError):
            if os.getxattr(here, name) == b"1":
                return True
    return False


@functools.cache
def cgroup_offered() -> Path | None:
    """This process's cgroup, if it may make child cgroups with a memory controller there (a
    unified hierarchy offering memory, writable and ours), else None. Only looks:
    ``cgroup_parent`` makes it usable."""
    here = _cgroup_dir()
    if here is None or not os.access(here, os.W_OK):
        return None
    try:
        offered = "memory" in (here / "cgroup.controllers").read_text().split()
    except OSError:
        return None
    return here if offered and _ours(here) else None


@functools.cache
def cgroup_parent() -> Path | None:
    """Where sandbox cgroups go, with the memory controller handed down, or None."""
    here = cgroup_offered()
    if here is None:
        return None
    try:
        _enable_memory(here)
    except OSError:
        return None
    return here


def containment(device: str) -> str:
    """The guard mode a sandbox on ``device`` gets here when it has a limit."""
    if cgroup_offered() is not None:
        return CgroupGuard.mode
    return RlimitGuard.mode if device == "cpu" else WatchdogGuard.mode


def guard_for(limit: int, device: str, label: str) -> MemoryGuard:
    """The strongest guard for a sandbox on ``device`` with ``limit`` bytes (0: none)."""
    if limit <= 0:
        return MemoryGuard(limit, label)
    parent = cgroup_parent()
    if parent is not None:
        with contextlib.suppress(OSError):
            return CgroupGuard(limit, label, parent)
    return RlimitGuard(limit, label) if device == "cpu" else WatchdogGuard(limit, label)
