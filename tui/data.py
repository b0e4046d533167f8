"""Everything the TUI reads from (and the few commands it writes to) the kernelab database.

This module imports no Textual: the queries are plain functions over a ``sqlite3`` connection
returning frozen dataclasses, so screens can compare old and new values and redraw only what
changed, and so the queries can be tested without a terminal.

Change detection polls ``PRAGMA data_version`` (bumped by every commit of *another*
connection, about 6 µs a poll) plus the database file's identity, so that a database created,
replaced or deleted after the TUI started is noticed too. The reader never holds a transaction
open: inside one, ``data_version`` would freeze and the daemon's WAL could not be checkpointed.
"""

from __future__ import annotations

import difflib
import json
import os
import sqlite3
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from store import StoreError, connect, status
from store.records import post_command

DEVICE_HISTORY = 40
"""Samples per device kept for the sparklines: about 40 s at the daemon's 1 Hz sampling."""

STATE_ORDER = {"running": 0, "interrupted": 1, "paused": 2, "queued": 3, "failed": 4, "invalid": 5,
               "cancelled": 6, "done": 7}


# ---------------------------------------------------------------- values shown on screen


@dataclass(frozen=True)
class DaemonInfo:
    """The daemon's heartbeat row."""

    pid: int | None
    host: str | None
    version: str | None
    started_at: float | None
    heartbeat_at: float | None
    status: str | None

    def is_up(self, now: float) -> bool:
        """Whether the daemon is alive, as every reader decides it (``store.status``)."""
        return status.daemon_up(self.heartbeat_at, self.status, now)


@dataclass(frozen=True)
class DeviceSample:
    """One NVML (or CPU) sample written by the daemon."""

    ts: float
    util_pct: float | None
    sm_clock_mhz: float | None
    temperature_c: float | None
    power_w: float | None
    mem_used_mb: float | None
    mem_total_mb: float | None
    clock_reasons: str | None


@dataclass(frozen=True)
class Device:
    """A device with its most recent samples, oldest first."""

    id: str
    name: str
    memory_total_mb: float | None
    samples: tuple[DeviceSample, ...]
    node: str | None = None

    @property
    def label(self) -> str:
        """The id, with the node it is attached to unless the id names it (a Ray cluster's
        ``NODE/cuda:N``)."""
        if self.node and not self.id.startswith(f"{self.node}/"):
            return f"{self.id} @ {self.node}"
        return self.id

    @property
    def latest(self) -> DeviceSample | None:
        return self.samples[-1] if self.samples else None

    def history(self, field: str) -> list[float]:
        """The non-missing values of one sample field, for a sparkline."""
        values = (getattr(s, field) for s in self.samples)
        return [float(v) for v in values if v is not None]


@dataclass(frozen=True)
class Job:
    """One row of the queue, built from ``store.status.jobs`` so that its state and speedups are
    those ``kernelab status`` and the reports show."""

    id: int
    problem: str
    kind: str
    state: str
    device: str | None
    priority: int
    candidates: int
    failures: int
    best_ms: float | None
    reference_ms: float | None
    reference_noise: float | None
    sol_ms: float | None
    error: str | None
    stop_reason: str | None
    created_at: float
    speedup: float | None = None
    speedup_vs_best_peer: float | None = None
    node: str | None = None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Job:
        return cls(id=row["id"], problem=row["problem"].removesuffix(".py"), kind=row["kind"],
                   state=row["state"], device=row["device"], priority=row["priority"],
                   candidates=row["candidates"], failures=row["gate_failures"], best_ms=row["best_ms"],
                   reference_ms=row["reference_ms"], reference_noise=row["reference_noise"],
                   sol_ms=row["sol_ms"], error=row["error"], stop_reason=row["stop_reason"],
                   created_at=row["created_at"], speedup=row["best_speedup"],
                   speedup_vs_best_peer=row["speedup_vs_best_peer"], node=row["node"])


@dataclass(frozen=True)
class Screened:
    """One configuration a job screened: a quick time to choose what the gate and the A/B see,
    never a result."""

    id: int
    status: str
    ms: float | None
    registers: int | None
    spills: int | None
    params: str
    candidate_id: int | None
    parent_id: int | None
    detail: str | None


@dataclass(frozen=True)
class JobFacts:
    """What the job detail shows about the job as a whole: its peers, its memory plan and the
    configurations it screened (each absent on jobs that did not record them)."""

    peers: str | None = None
    plan: tuple[str, ...] = ()
    screened: tuple[Screened, ...] = ()


@dataclass(frozen=True)
class Candidate:
    """A candidate as the chart, the failure panel and the detail screen need it."""

    id: int
    ordinal: int
    parent_id: int | None
    proposer: str
    language: str
    edit: str | None
    state: str
    verdict: str | None
    rule: str | None
    reason: str | None
    evidence: str | None
    max_rel_error: float | None
    tolerance: float | None
    candidate_ms: float | None
    speedup: float | None
    speedup_lo: float | None
    speedup_hi: float | None
    faster_than_noise: bool | None
    accepted: bool
    created_at: float

    @property
    def failed_gate(self) -> bool:
        return self.verdict in ("fail", "error")


@dataclass(frozen=True)
class Block:
    """One timing block with the clock state recorded alongside it."""

    side: str
    idx: int
    samples: tuple[float, ...]
    median_ms: float
    sm_clock_mhz: float | None
    clock_reasons: str | None
    temperature_c: float | None
    power_w: float | None
    throttled: bool


@dataclass(frozen=True)
class Overview:
    """What the dashboard's top half shows: the daemon, the devices and the queue."""

    daemon: DaemonInfo | None
    devices: tuple[Device, ...]
    jobs: tuple[Job, ...]


@dataclass(frozen=True)
class JobSeries:
    """A job and all its candidates, oldest first: the convergence chart's input."""

    job: Job
    candidates: tuple[Candidate, ...]

    @property
    def failures(self) -> tuple[Candidate, ...]:
        """Gate failures, newest first: the most recent is what the user wants to read."""
        return tuple(c for c in reversed(self.candidates) if c.failed_gate)


# ---------------------------------------------------------------- reading


def _num(value: Any) -> float | None:
    return None if value is None else float(value)


class Reader:
    """A read-only view of one database file that notices when its content changes.

    The connection is opened lazily and reopened if the file is replaced, so a TUI started
    before the daemon's first run simply waits. A lock serialises use of the connection
    between the polling timer and the loading worker thread.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None
        self._inode: int | None = None
        self._last: tuple[Any, ...] | None = None
        self._lock = threading.Lock()
        self.error: str | None = None

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
            self._conn = None

    def _file_signature(self) -> tuple[Any, ...] | None:
        """Identity and size of the database and its WAL: a cheap change signal besides
        ``data_version``, which alone cannot see the file itself being replaced."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        try:
            wal = os.stat(f"{self.path}-wal")
            wal_sig: tuple[int, int] | None = (wal.st_size, wal.st_mtime_ns)
        except FileNotFoundError:
            wal_sig = None
        return (st.st_ino, st.st_size, st.st_mtime_ns, wal_sig)

    def _ensure_open(self, inode: int) -> sqlite3.Connection:
        if self._conn is not None and self._inode != inode:
            self._conn.close()
            self._conn = None
        if self._conn is None:
            self._conn = connect(self.path, readonly=True)
            self._inode = inode
        return self._conn

    def poll(self) -> bool:
        """True when something may have changed since the last poll (always, the first time).

        Errors (no database yet, unreadable file) are kept in ``error`` and reported as a
        change once, so the screen can say what is wrong, and are retried on the next poll.
        """
        with self._lock:
            signature = self._file_signature()
            try:
                if signature is None:
                    raise StoreError(f"{self.path}: no database yet (is the daemon running "
                                     "with this home?)")
                conn = self._ensure_open(signature[0])
                version = conn.execute("PRAGMA data_version").fetchone()[0]
                # Our own first read creates the WAL file: take the signature after it, or
                # the next poll reports that as a change and every screen reloads for nothing.
                signature = self._file_signature() or signature
                error = None
            except (sqlite3.Error, StoreError) as exc:
                if self._conn is not None:
                    self._conn.close()
                self._conn = None
                version, error = None, str(exc)
            state = (signature, version, error)
            changed = state != self._last
            self._last = state
            self.error = error
            return changed

    def read(self, query: Callable[[sqlite3.Connection], Any]) -> Any:
        """Run ``query`` on the connection; raises ``StoreError`` when there is none."""
        with self._lock:
            if self._conn is None:
                raise StoreError(self.error or f"{self.path}: not open")
            return query(self._conn)


def load_overview(conn: sqlite3.Connection, history: int = DEVICE_HISTORY) -> Overview:
    """The daemon row, every device with its last ``history`` samples, and every job."""
    return Overview(daemon=load_daemon(conn), devices=load_devices(conn, history),
                    jobs=load_jobs(conn))


def load_daemon(conn: sqlite3.Connection) -> DaemonInfo | None:
    row = conn.execute("SELECT pid, host, version, started_at, heartbeat_at, status "
                       "FROM daemon WHERE id = 1").fetchone()
    return None if row is None else DaemonInfo(**dict(row))


def load_devices(conn: sqlite3.Connection, history: int = DEVICE_HISTORY) -> tuple[Device, ...]:
    devices = []
    for row in conn.execute("SELECT id, name, memory_total_mb, node FROM devices ORDER BY id"):
        samples = conn.execute(
            "SELECT ts, util_pct, sm_clock_mhz, temperature_c, power_w, mem_used_mb, "
            "mem_total_mb, clock_reasons FROM gpu_samples WHERE device_id = ? "
            "ORDER BY ts DESC LIMIT ?", (row["id"], history)).fetchall()
        devices.append(Device(
            id=row["id"], name=row["name"], memory_total_mb=_num(row["memory_total_mb"]),
            node=row["node"], samples=tuple(DeviceSample(**dict(s)) for s in reversed(samples))))
    return tuple(devices)


def load_jobs(conn: sqlite3.Connection) -> tuple[Job, ...]:
    return tuple(Job.from_row(row) for row in status.jobs(conn))


def load_job_facts(conn: sqlite3.Connection, job_id: int) -> JobFacts:
    facts = status.job_facts(conn, job_id)
    screened = tuple(
        Screened(id=r["id"], status=r["status"], ms=_num(r["ms"]), registers=r["registers"],
                 spills=r["spills"], params=_params(r["params"]), candidate_id=r["candidate_id"],
                 parent_id=r["parent_id"], detail=r["detail"])
        for r in status.screened(conn, job_id))
    return JobFacts(peers=status.describe_peers(facts["peers"]),
                    plan=tuple(status.describe_plan(facts["plan"], sizes=False)), screened=screened)


def _params(params: Any) -> str:
    """A configuration as ``NAME=value`` pairs, in the order the proposer gave them."""
    if isinstance(params, dict):
        return " ".join(f"{k}={v}" for k, v in params.items())
    return "" if params is None else str(params)


_CANDIDATE_COLUMNS = (
    "id, parent_id, proposer, language, edit, state, verdict, rule, reason, evidence, "
    "max_rel_error, tolerance, candidate_ms, speedup, speedup_lo, speedup_hi, "
    "faster_than_noise, accepted, created_at")


def _candidate(row: sqlite3.Row, ordinal: int) -> Candidate:
    values = dict(row)
    ftn = values.pop("faster_than_noise")
    values["faster_than_noise"] = None if ftn is None else bool(ftn)
    values["accepted"] = bool(values["accepted"])
    return Candidate(ordinal=ordinal, **values)


def load_series(conn: sqlite3.Connection, job_id: int) -> JobSeries | None:
    """The job and its candidates in creation order, or None if the job does not exist."""
    rows = status.jobs(conn, job_id=job_id)
    if not rows:
        return None
    job = Job.from_row(rows[0])
    rows = conn.execute(f"SELECT {_CANDIDATE_COLUMNS} FROM candidates WHERE job_id = ? "
                        "ORDER BY id", (job_id,)).fetchall()
    return JobSeries(job=job, candidates=tuple(_candidate(r, i + 1) for i, r in enumerate(rows)))


def load_source(conn: sqlite3.Connection, candidate_id: int) -> str | None:
    row = conn.execute("SELECT source FROM candidates WHERE id = ?", (candidate_id,)).fetchone()
    return None if row is None else row["source"]


def load_transcript(conn: sqlite3.Connection, job_id: int,
                    candidate_id: int) -> tuple[dict[str, Any], ...]:
    """The agent exchanges that produced a candidate (empty for other proposers, and on a
    database from before agents were recorded)."""
    from store.exchanges import exchanges

    try:
        return tuple(exchanges(conn, job_id, candidate_id))
    except sqlite3.OperationalError:
        return ()


def load_blocks(conn: sqlite3.Connection, candidate_id: int) -> tuple[Block, ...]:
    rows = conn.execute(
        "SELECT side, idx, samples, median_ms, sm_clock_mhz, clock_reasons, temperature_c, "
        "power_w, throttled FROM blocks WHERE candidate_id = ? ORDER BY idx, side",
        (candidate_id,)).fetchall()
    return tuple(Block(side=r["side"], idx=r["idx"], samples=tuple(_samples(r["samples"])),
                       median_ms=r["median_ms"], sm_clock_mhz=_num(r["sm_clock_mhz"]),
                       clock_reasons=r["clock_reasons"], temperature_c=_num(r["temperature_c"]),
                       power_w=_num(r["power_w"]), throttled=bool(r["throttled"]))
                 for r in rows)


def _samples(text: str) -> list[float]:
    """Parse a block's JSON sample list, tolerating a malformed one (it is shown empty)."""
    try:
        values = json.loads(text)
    except (TypeError, ValueError):
        return []
    if not isinstance(values, list):
        return []
    return [float(v) for v in values if isinstance(v, int | float)]


# ---------------------------------------------------------------- derived values


def incumbent_steps(series: JobSeries) -> tuple[list[float], list[float]]:
    """The incumbent's time as a step line: x is the candidate ordinal.

    The incumbent changes only at accepted candidates; each change adds a vertical segment
    at that ordinal, and the line is carried to the last candidate so the chart shows where
    the search stands now.
    """
    xs: list[float] = []
    ys: list[float] = []
    current: float | None = None
    for cand in series.candidates:
        if cand.accepted and cand.candidate_ms is not None:
            if current is not None:
                xs.append(cand.ordinal)
                ys.append(current)
            xs.append(cand.ordinal)
            ys.append(cand.candidate_ms)
            current = cand.candidate_ms
    if current is not None and series.candidates and xs[-1] != series.candidates[-1].ordinal:
        xs.append(series.candidates[-1].ordinal)
        ys.append(current)
    return xs, ys


def format_evidence(evidence: str | None) -> str:
    """A gate failure's evidence JSON as one readable line: max error, where, which input set.

    Unknown keys are kept (``key=value``) so that a new gate rule's evidence is never hidden.
    """
    if not evidence:
        return ""
    try:
        data = json.loads(evidence)
    except ValueError:
        return evidence
    if not isinstance(data, dict):
        return str(data)
    parts: list[str] = []
    rest = dict(data)
    if "max_rel_error" in rest:
        part = f"err {_g(rest.pop('max_rel_error'))}"
        if "tolerance" in rest:
            part += f" > tol {_g(rest.pop('tolerance'))}"
        parts.append(part)
    if "index" in rest:
        parts.append(f"at {rest.pop('index')}")
    if "input_set" in rest:
        parts.append(f"input set {rest.pop('input_set')}")
    parts.extend(f"{key}={_g(value)}" for key, value in rest.items())
    return ", ".join(parts)


def _g(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def parent_diff(parent_source: str | None, source: str, parent_id: int | None,
                candidate_id: int) -> str:
    """Unified diff of a candidate against its parent (against nothing for a root)."""
    before = (parent_source or "").splitlines(keepends=True)
    lines = difflib.unified_diff(
        before, source.splitlines(keepends=True),
        fromfile=f"candidate {parent_id}" if parent_id else "(no parent)",
        tofile=f"candidate {candidate_id}")
    return "".join(lines)


def timing_summary(blocks: Sequence[Block]) -> dict[str, tuple[int, float, float]]:
    """Per side: number of samples, median and spread (stdev) in ms."""
    result: dict[str, tuple[int, float, float]] = {}
    for side in sorted({b.side for b in blocks}):
        values = [v for b in blocks if b.side == side for v in b.samples]
        if values:
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            result[side] = (len(values), statistics.median(values), spread)
    return result


def sort_jobs(jobs: Iterable[Job], key: str) -> list[Job]:
    """Order the queue by one of ``SORT_KEYS``; ties fall back to the job id."""
    order: dict[str, Callable[[Job], Any]] = {
        "state": lambda j: (STATE_ORDER.get(j.state, 9), -j.priority, j.id),
        "priority": lambda j: (-j.priority, j.id),
        "id": lambda j: -j.id,
        "name": lambda j: (j.problem, j.id),
        "speedup": lambda j: (-(j.speedup or 0.0), j.id),
    }
    return sorted(jobs, key=order[key])


SORT_KEYS = ("state", "priority", "id", "name", "speedup")


def filter_jobs(jobs: Iterable[Job], text: str) -> list[Job]:
    """Jobs whose problem, state, kind, device or id contain every word of ``text``."""
    words = text.lower().split()
    def haystack(j: Job) -> str:
        return f"{j.id} #{j.id} {j.problem} {j.state} {j.kind} {j.device or ''}".lower()
    return [j for j in jobs if all(w in haystack(j) for w in words)]


# ---------------------------------------------------------------- commands


def controls_available(path: Path) -> bool:
    """Whether this user may write commands: the file and its directory (for the WAL and
    its shared-memory index) must both be writable."""
    return path.exists() and os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)


def send_command(path: Path, verb: str, job_id: int, arg: str | None = None,
                 now: Callable[[], float] = time.time) -> int:
    """Queue a command for the daemon; returns the command's id.

    A separate, short-lived connection in ``mode=rw`` (never creating, never migrating: the
    daemon owns the schema) keeps the long-lived reader read-only.
    """
    conn = sqlite3.connect(f"file:{path}?mode=rw", uri=True, timeout=5.0)
    try:
        return post_command(conn, verb, job_id, arg, source="tui", ts=now())
    finally:
        conn.close()
