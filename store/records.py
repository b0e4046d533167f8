"""Typed writes and reads over the kernelab database, used by its one writer (the daemon, or a
foreground ``kernelab port``).

Every method that changes more than one row does it in one transaction, so a ``kill -9`` at
any instant leaves either the old state or the new one: a candidate's verdict, its timing
blocks and the job's new incumbent land together or not at all.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import time
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("kernelab")

COMMAND_STATES: dict[str, frozenset[str]] = {
    "pause": frozenset({"queued", "running", "interrupted"}),
    "resume": frozenset({"paused", "interrupted", "queued"}),
    "cancel": frozenset({"queued", "running", "paused", "interrupted"}),
    "retry": frozenset({"failed", "cancelled", "invalid"}),
    "priority": frozenset({"queued", "running", "paused", "interrupted"}),
}
"""Each job command and the states (as ``store.status.shown_state`` shows them) it applies to:
the daemon's ``Scheduler.apply`` enforces it, and the TUI explains instead of sending what it
would reject. Resuming a queued job is a no-op that succeeds, so that a resume posted while no
daemon ran, for a job the daemon's start then requeued, is not reported as refused."""

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
          "error": logging.ERROR}
# Deaths of the worker or the daemon while one candidate was being evaluated that make it a
# poison candidate (rule ``hostile``): once may be bad luck, twice is the candidate.
HOSTILE_CRASHES = 2


def content_hash(source: str, sidecar: str | None, start_source: str | None) -> str:
    """The identity of a problem revision: reference, sidecar and starting candidate together,
    since changing any of them changes what a job would do."""
    digest = hashlib.sha256()
    for part in (source, sidecar, start_source):
        digest.update(b"\x00" if part is None else b"\x01" + part.encode())
        digest.update(b"\x1e")
    return digest.hexdigest()


@dataclass(frozen=True)
class NewProblem:
    """What the watcher (or ``port``) found for one problem name."""

    name: str
    path: str
    source: str
    sidecar: str | None = None
    start_source: str | None = None
    error: str | None = None          # set when the reference is known to be unusable

    @property
    def content_hash(self) -> str:
        return content_hash(self.source, self.sidecar, self.start_source)


class Store:
    """The writer's view of the database. Only one process holds one of these at a time."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    # -- events ------------------------------------------------------------------------------

    def event(self, kind: str, message: str, *, level: str = "info",
              job_id: int | None = None) -> None:
        """Record an event a user can read, and log it as one structured line."""
        with self.conn:
            self.conn.execute(
                "INSERT INTO events (ts, level, job_id, kind, message) VALUES (?, ?, ?, ?, ?)",
                (time.time(), level, job_id, kind, message))
        fields: dict[str, Any] = {"job": job_id} if job_id is not None else {}
        log.log(LEVELS.get(level, logging.INFO), kind, extra={**fields, "detail": message})

    # -- problems and jobs -------------------------------------------------------------------

    def add_problem(self, problem: NewProblem, *, job_config: dict[str, Any] | None = None,
                    state: str | None = None, always: bool = False) -> tuple[int, int] | None:
        """Record a new revision of a problem and queue its job, in one transaction; ``None``
        if this content is already known (unless ``always``: a foreground ``port`` runs a new
        job on a known problem).

        Dedupe is by (name, content hash), so repeated watcher events and rescans are harmless.
        """
        now = time.time()
        job_kind = "tune" if problem.start_source else "port"
        job_state = state or ("invalid" if problem.error else "queued")
        with self.conn:
            known = self.conn.execute(
                "SELECT id FROM problems WHERE name = ? AND content_hash = ?",
                (problem.name, problem.content_hash)).fetchone()
            if known is not None and not always:
                return None
            pid = known[0] if known is not None else self._insert_problem(problem, now)
            jid = self.conn.execute(
                "INSERT INTO jobs (problem_id, kind, state, error, config, created_at, updated_at,"
                " finished_at) VALUES (?,?,?,?,?,?,?,?)",
                (pid, job_kind, job_state, problem.error, json.dumps(job_config or {}), now, now,
                 now if job_state == "invalid" else None)).lastrowid
        return int(pid), int(jid)

    def _insert_problem(self, problem: NewProblem, now: float) -> int:
        revision = self.conn.execute(
            "SELECT COALESCE(MAX(revision), 0) + 1 FROM problems WHERE name = ?",
            (problem.name,)).fetchone()[0]
        return int(self.conn.execute(
            "INSERT INTO problems (name, path, content_hash, revision, source, sidecar, "
            "start_source, status, error, created_at) VALUES (?,?,?,?,?,?,?,?,?,?)",
            (problem.name, problem.path, problem.content_hash, revision, problem.source,
             problem.sidecar, problem.start_source, "invalid" if problem.error else "ok",
             problem.error, now)).lastrowid)

    def retry_job(self, job_id: int) -> None:
        """Queue an ended job again, for the daemon; its problem is given another chance too."""
        now = time.time()
        with self.conn:
            self.conn.execute(
                "UPDATE problems SET status = 'ok', error = NULL WHERE id = "
                "(SELECT problem_id FROM jobs WHERE id = ?)", (job_id,))
            self.conn.execute(
                "UPDATE jobs SET state = 'queued', error = NULL, stop_reason = NULL, "
                "finished_at = NULL, updated_at = ? WHERE id = ?", (now, job_id))
            self._drop_foreground(job_id)

    def hand_over(self, job_id: int) -> None:
        """Queue a stopped job for the daemon, keeping what it recorded: its in-flight candidate
        goes back to ``pending`` and the foreground process that ran it (``kernelab port``, now
        gone or paused) no longer owns it, so no reader shows it ``interrupted`` while the daemon
        runs it."""
        with self.conn:
            self._interrupt(job_id, "queued")
            self._drop_foreground(job_id)

    def _drop_foreground(self, job_id: int) -> None:
        row = self.conn.execute("SELECT config FROM jobs WHERE id = ?", (job_id,)).fetchone()
        config = json.loads(row[0] or "{}") if row else {}
        if isinstance(config, dict) and config.pop("foreground_pid", None) is not None:
            self.conn.execute("UPDATE jobs SET config = ? WHERE id = ?", (json.dumps(config), job_id))

    def job(self, job_id: int) -> dict[str, Any] | None:
        row = self.conn.execute(
            "SELECT j.*, p.name AS problem_name, p.path AS problem_path, p.source, p.sidecar, "
            "p.start_source, p.revision FROM jobs j JOIN problems p ON p.id = j.problem_id "
            "WHERE j.id = ?", (job_id,)).fetchone()
        return dict(row) if row else None

    def next_queued(self, exclude: set[int] = frozenset()) -> int | None:  # type: ignore[assignment]
        """The job that should run next: highest priority, then oldest."""
        for row in self.conn.execute(
                "SELECT id FROM jobs WHERE state = 'queued' ORDER BY priority DESC, id"):
            if row[0] not in exclude:
                return int(row[0])
        return None

    def count_jobs(self, *states: str) -> int:
        marks = ",".join("?" * len(states))
        return self.conn.execute(f"SELECT COUNT(*) FROM jobs WHERE state IN ({marks})",
                                 states).fetchone()[0]

    def update_job(self, job_id: int, **fields: Any) -> None:
        """Set columns of one job (names come from our code, never from users)."""
        fields["updated_at"] = time.time()
        cols = ", ".join(f"{name} = ?" for name in fields)
        with self.conn:
            self.conn.execute(f"UPDATE jobs SET {cols} WHERE id = ?", (*fields.values(), job_id))

    def start_job(self, job_id: int, device: str) -> None:
        """Mark a job running on ``device``; its node is the device row's (one fact, one
        place), so every scheduler records it alike."""
        now = time.time()
        with self.conn:
            self.conn.execute(
                "UPDATE jobs SET state = 'running', device = ?, "
                "node = (SELECT node FROM devices WHERE id = ?), error = NULL, "
                "started_at = COALESCE(started_at, ?), finished_at = NULL, updated_at = ? "
                "WHERE id = ?", (device, device, now, now, job_id))

    def end_job(self, job_id: int, state: str, *, stop_reason: str | None = None,
                error: str | None = None) -> None:
        now = time.time()
        with self.conn:
            self.conn.execute(
                "UPDATE jobs SET state = ?, stop_reason = ?, error = ?, finished_at = ?, "
                "updated_at = ? WHERE id = ?", (state, stop_reason, error, now, now, job_id))
            if state == "invalid":
                self.conn.execute(
                    "UPDATE problems SET status = 'invalid', error = ? "
                    "WHERE id = (SELECT problem_id FROM jobs WHERE id = ?)", (error, job_id))

    def interrupt_job(self, job_id: int, state: str) -> None:
        """Stop a running job without losing anything: the in-flight candidate goes back to
        ``pending`` so that it (and only it) is evaluated again when the job resumes."""
        with self.conn:
            self._interrupt(job_id, state)

    def _interrupt(self, job_id: int, state: str) -> None:
        self.conn.execute("UPDATE candidates SET state = 'pending' WHERE job_id = ? AND "
                          "state = 'evaluating'", (job_id,))
        self.conn.execute("UPDATE jobs SET state = ?, updated_at = ? WHERE id = ?",
                          (state, time.time(), job_id))

    def recover(self, keep: set[int] = frozenset()) -> list[int]:  # type: ignore[assignment]
        """After a crash, hand jobs left ``running`` to the daemon's queue (except ``keep``: jobs
        a live foreground ``port`` owns; one whose process died is the daemon's now); a candidate
        they were evaluating counts the death."""
        rows = [r[0] for r in self.conn.execute("SELECT id FROM jobs WHERE state = 'running'")]
        resumed = [jid for jid in rows if jid not in keep]
        for jid in resumed:
            self.crashed(jid, "the daemon stopped without shutting down (killed or crashed)")
            self.hand_over(jid)
        return resumed

    def crashed(self, job_id: int, cause: str) -> list[int]:
        """The worker or the daemon died (``cause``, one line) while ``job_id`` was evaluating a
        candidate; returns the ids of the candidates in flight. Each counts one more death and goes
        back to ``pending``, to be evaluated again, until its ``HOSTILE_CRASHES``-th: then it is
        recorded failed, rule ``hostile``, with every death as evidence, and never evaluated again."""
        now = time.time()
        told: list[tuple[int, str, str]] = []
        with self.conn:
            rows = self.conn.execute("SELECT id, crashes, evidence FROM candidates WHERE job_id = ? AND "
                                     "state = 'evaluating'", (job_id,)).fetchall()
            for row in rows:
                deaths = [*_deaths(row["evidence"]), {"at": now, "cause": cause}]
                evidence = json.dumps({"deaths": deaths})
                if row["crashes"] + 1 < HOSTILE_CRASHES:
                    self.conn.execute("UPDATE candidates SET crashes = crashes + 1, state = 'pending', "
                                      "evidence = ? WHERE id = ?", (evidence, row["id"]))
                    told.append((row["id"], "candidate.crashed", f"{cause}; it is evaluated once more"))
                    continue
                reason = (f"the worker or the daemon died each of the {len(deaths)} times this candidate "
                          f"was evaluated (last: {cause}); it is never evaluated again")
                result = {"verdict": "fail", "rule": "hostile", "reason": reason,
                          "evidence": {"deaths": deaths}}
                self.conn.execute(
                    "UPDATE candidates SET crashes = crashes + 1, state = 'done', verdict = 'fail', "
                    "rule = 'hostile', reason = ?, evidence = ?, result = ?, accepted = 0, finished_at = ? "
                    "WHERE id = ?", (reason, evidence, json.dumps(result), now, row["id"]))
                told.append((row["id"], "candidate.hostile", reason))
        for cid, kind, message in told:
            self.event(kind, f"#{cid}: {message}", level="warning", job_id=job_id)
        return [cid for cid, _, _ in told]

    def add_active_time(self, job_id: int, seconds: float) -> None:
        with self.conn:
            self.conn.execute("UPDATE jobs SET active_s = active_s + ? WHERE id = ?",
                              (seconds, job_id))

    # -- candidates --------------------------------------------------------------------------

    def add_candidate(self, job_id: int, *, proposer: str, source: str,
                      parent_id: int | None = None, edit: str | None = None,
                      params: dict[str, Any] | None = None, language: str = "triton") -> int:
        with self.conn:
            cid = self.conn.execute(
                "INSERT INTO candidates (job_id, parent_id, proposer, language, source, edit, "
                "params, created_at) VALUES (?,?,?,?,?,?,?,?)",
                (job_id, parent_id, proposer, language, source, edit,
                 json.dumps(params) if params is not None else None, time.time())).lastrowid
        return int(cid)

    def start_candidate(self, candidate_id: int) -> None:
        with self.conn:
            self.conn.execute("UPDATE candidates SET state = 'evaluating' WHERE id = ?",
                              (candidate_id,))

    def finish_candidate(self, candidate_id: int, result: dict[str, Any],
                         accepted: bool) -> None:
        """Record a check result, its timing blocks and (if accepted) the job's new incumbent,
        atomically: a restart either redoes this evaluation or sees all of it."""
        now = time.time()
        ci = result.get("speedup_ci") or [None, None]
        blocks = [(candidate_id, b.get("side", "?"), int(b.get("idx", i)),
                   json.dumps(b.get("samples_ms", [])), float(b.get("median_ms") or 0.0),
                   *_clock_columns(b.get("clock")), int(bool(b.get("throttled"))), now)
                  for i, b in enumerate(result.get("blocks") or [])]
        with self.conn:
            self.conn.execute("DELETE FROM blocks WHERE candidate_id = ?", (candidate_id,))
            self.conn.execute(
                "UPDATE candidates SET state = 'done', verdict = ?, rule = ?, reason = ?, "
                "evidence = ?, max_rel_error = ?, tolerance = ?, candidate_ms = ?, "
                "baseline_ms = ?, speedup = ?, speedup_lo = ?, speedup_hi = ?, "
                "faster_than_noise = ?, accepted = ?, result = ?, finished_at = ? WHERE id = ?",
                (result.get("verdict"), result.get("rule"), result.get("reason"),
                 json.dumps(result.get("evidence") or {}), result.get("max_rel_error"),
                 result.get("tolerance"), result.get("candidate_ms"), result.get("reference_ms"),
                 result.get("speedup"), ci[0], ci[1], int(bool(result.get("faster_than_noise"))),
                 int(accepted), json.dumps(result, default=str), now, candidate_id))
            self.conn.executemany(
                "INSERT INTO blocks (candidate_id, side, idx, samples, median_ms, sm_clock_mhz, "
                "clock_reasons, temperature_c, power_w, throttled, created_at) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?)", blocks)
            if accepted:
                self.conn.execute(
                    "UPDATE jobs SET best_candidate_id = ?, updated_at = ? WHERE id = "
                    "(SELECT job_id FROM candidates WHERE id = ?)", (candidate_id, now,
                                                                     candidate_id))

    def add_stage(self, candidate_id: int, stage: str, seconds: float) -> None:
        """One more stage's wall seconds in a finished candidate's result: a stage that runs
        beside the evaluation (the machine-code fingerprint) and ends after it was recorded."""
        with self.conn:
            row = self.conn.execute("SELECT result FROM candidates WHERE id = ?", (candidate_id,)).fetchone()
            if row is None or row[0] is None:
                return
            result = json.loads(row[0])
            result.setdefault("stages", {})[stage] = round(seconds, 3)
            self.conn.execute("UPDATE candidates SET result = ? WHERE id = ?",
                              (json.dumps(result, default=str), candidate_id))

    def candidates(self, job_id: int) -> list[dict[str, Any]]:
        """A job's candidates in creation order (the proposers' history)."""
        rows = self.conn.execute(
            "SELECT id, parent_id, proposer, language, source, edit, params, state, verdict, "
            "rule, reason, max_rel_error, tolerance, candidate_ms, baseline_ms, speedup, "
            "speedup_lo, speedup_hi, faster_than_noise, accepted, result FROM candidates "
            "WHERE job_id = ? ORDER BY id", (job_id,))
        return [dict(r) for r in rows]

    # -- devices, samples, heartbeat ---------------------------------------------------------

    def upsert_device(self, device_id: str, name: str, *, uuid: str | None = None,
                      memory_total_mb: float | None = None, node: str | None = None) -> None:
        with self.conn:
            self.conn.execute(
                "INSERT INTO devices (id, name, uuid, memory_total_mb, node, updated_at) "
                "VALUES (?,?,?,?,?,?) ON CONFLICT(id) DO UPDATE SET name = excluded.name, "
                "uuid = excluded.uuid, memory_total_mb = excluded.memory_total_mb, "
                "node = excluded.node, updated_at = excluded.updated_at",
                (device_id, name, uuid, memory_total_mb, node, time.time()))

    def device_ceilings(self, device_id: str) -> dict[str, Any] | None:
        """The measured ceilings of a registered device, or None (not measured, no such row)."""
        row = self.conn.execute("SELECT ceilings FROM devices WHERE id = ?", (device_id,)).fetchone()
        return json.loads(row["ceilings"]) if row and row["ceilings"] else None

    def set_device_ceilings(self, device_id: str, ceilings: dict[str, Any]) -> bool:
        """Store ceilings on a registered device; False when no such device row exists."""
        with self.conn:
            cur = self.conn.execute("UPDATE devices SET ceilings = ?, updated_at = ? WHERE id = ?",
                                    (json.dumps(ceilings), time.time(), device_id))
        return cur.rowcount > 0

    def add_gpu_samples(self, samples: list[dict[str, Any]]) -> None:
        cols = ("device_id", "ts", "util_pct", "sm_clock_mhz", "mem_clock_mhz", "temperature_c",
                "power_w", "mem_used_mb", "mem_total_mb", "clock_reasons")
        with self.conn:
            self.conn.executemany(
                f"INSERT INTO gpu_samples ({', '.join(cols)}) VALUES ({','.join('?' * len(cols))})",
                [tuple(s.get(c) for c in cols) for s in samples])

    def prune_gpu_samples(self, keep_s: float) -> None:
        with self.conn:
            self.conn.execute("DELETE FROM gpu_samples WHERE ts < ?", (time.time() - keep_s,))

    def heartbeat(self, pid: int, host: str, version: str, status: str,
                  started_at: float | None = None) -> None:
        now = time.time()
        with self.conn:
            self.conn.execute(
                "INSERT INTO daemon (id, pid, host, version, started_at, heartbeat_at, status) "
                "VALUES (1,?,?,?,?,?,?) ON CONFLICT(id) DO UPDATE SET pid = excluded.pid, "
                "host = excluded.host, version = excluded.version, "
                "started_at = COALESCE(?, daemon.started_at), "
                "heartbeat_at = excluded.heartbeat_at, status = excluded.status",
                (pid, host, version, started_at or now, now, status, started_at))

    # -- commands ----------------------------------------------------------------------------

    def pending_commands(self) -> list[dict[str, Any]]:
        rows = self.conn.execute(
            "SELECT id, job_id, verb, arg FROM commands WHERE status = 'pending' ORDER BY id")
        return [dict(r) for r in rows]

    def finish_command(self, command_id: int, status: str, result: str) -> None:
        with self.conn:
            self.conn.execute("UPDATE commands SET status = ?, result = ?, done_at = ? "
                              "WHERE id = ?", (status, result, time.time(), command_id))


def _deaths(evidence: str | None) -> list[dict[str, Any]]:
    """The deaths recorded so far with a candidate in flight (its evidence until it is done)."""
    try:
        found = json.loads(evidence or "{}").get("deaths", [])
    except (json.JSONDecodeError, AttributeError):
        return []
    return found if isinstance(found, list) else []


def _clock_columns(clock: dict[str, Any] | None) -> tuple[Any, Any, Any, Any]:
    if not clock:
        return (None, None, None, None)
    reasons = clock.get("clock_reasons")
    if isinstance(reasons, list | tuple):
        reasons = ",".join(map(str, reasons))
    return (clock.get("sm_clock_mhz"), reasons, clock.get("temperature_c"), clock.get("power_w"))


def post_command(conn: sqlite3.Connection, verb: str, job_id: int | None,
                 arg: str | None = None, source: str = "cli", ts: float | None = None) -> int:
    """Queue a request for the daemon: the one write a non-daemon process may make, a short
    transaction on the ``commands`` table that the daemon applies within a second."""
    if verb not in COMMAND_STATES:
        raise ValueError(f"unknown verb {verb!r}")
    with conn:
        cid = conn.execute("INSERT INTO commands (ts, job_id, verb, arg, source) VALUES (?,?,?,?,?)",
                           (time.time() if ts is None else ts, job_id, verb, arg, source)).lastrowid
    return int(cid)
