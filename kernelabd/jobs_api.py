"""What the CLI commands and the daemon share about jobs: preparing a home, dropping files
into the inbox, posting commands, and the ``LocalRecorder`` through which the convergence loop
writes (in the daemon for its workers, or in a foreground ``kernelab port``).

Nothing here imports torch: ``submit``, ``status`` and ``jobs`` must answer instantly.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any

from kernelabd.config import DEFAULT_TOML
from store.db import connect
from store.home import Home
from store.records import Store, post_command

VERBS = ("pause", "resume", "cancel", "retry", "priority")
REFERENCE_SUFFIXES = (".new.py", ".toml")   # dropped before the reference they belong to


def ensure_home(home: Home) -> Home:
    """Create the home layout with a commented default ``kernelab.toml`` on first use."""
    for folder in (home.root, home.inbox, home.results, home.work):
        folder.mkdir(parents=True, exist_ok=True)
    if not home.config.exists():
        home.config.write_text(DEFAULT_TOML)
    return home


def submit_order(files: list[Path]) -> list[Path]:
    """Sidecars and starting candidates first, references last: the watcher takes a reference
    together with whatever lies beside it at that moment."""
    return sorted(files, key=lambda p: 0 if p.name.endswith(REFERENCE_SUFFIXES) else 1)


def submit(home: Home, files: list[Path]) -> list[Path]:
    """Copy each file into the inbox under a hidden temporary name, then rename it into
    place, so the daemon never sees a partly written file."""
    ensure_home(home)
    placed = []
    for src in submit_order(files):
        dest = home.inbox / src.name
        tmp = home.inbox / f".{src.name}.tmp-{os.getpid()}"
        shutil.copyfile(src, tmp)
        os.replace(tmp, dest)
        placed.append(dest)
    return placed


def post(home: Home, verb: str, job_id: int, arg: str | None = None) -> int:
    """Queue a job command for the daemon (a short write transaction on ``commands``)."""
    if verb not in VERBS:
        raise ValueError(f"unknown verb {verb!r}")
    conn = connect(home.db)
    try:
        if conn.execute("SELECT 1 FROM jobs WHERE id = ?", (job_id,)).fetchone() is None:
            raise LookupError(f"no job {job_id}")
        return post_command(conn, verb, job_id, arg)
    finally:
        conn.close()


def wait_command(home: Home, command_id: int, timeout_s: float) -> dict[str, Any] | None:
    """The command's outcome once the daemon applied it, or None if it did not in time."""
    deadline = time.monotonic() + timeout_s
    conn = connect(home.db, readonly=True)
    try:
        while True:
            row = conn.execute("SELECT status, result FROM commands WHERE id = ?",
                               (command_id,)).fetchone()
            if row is not None and row["status"] != "pending":
                return dict(row)
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)
    finally:
        conn.close()


def pid_alive(pid: int) -> bool:
    """Whether a process exists (one owned by another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def daemon_alive(conn: sqlite3.Connection, stale_s: float = 10.0) -> bool:
    """Whether a daemon has beaten its heartbeat recently (it writes one every second)."""
    row = conn.execute("SELECT heartbeat_at, status FROM daemon WHERE id = 1").fetchone()
    return bool(row and row["heartbeat_at"] and row["status"] != "stopped"
                and time.time() - row["heartbeat_at"] < stale_s)


class LocalRecorder:
    """The convergence loop's ``Recorder`` over the writer's ``Store``; it also keeps
    ``results/NAME/`` current on every acceptance."""

    def __init__(self, store: Store, home: Home) -> None:
        self.store = store
        self.home = home

    def load(self, job_id: int) -> dict[str, Any]:
        job = self.store.job(job_id)
        if job is None:
            raise LookupError(f"no job {job_id}")
        job_config = json.loads(job["config"] or "{}")
        if isinstance(job.get("capture"), str):
            job["capture"] = json.loads(job["capture"])
        return {"job": job, "job_config": job_config, "candidates": self.store.candidates(job_id)}

    def add_candidate(self, job_id: int, proposal: dict[str, Any], proposer: str) -> int:
        return self.store.add_candidate(job_id, proposer=proposer, source=proposal["source"],
                                        parent_id=proposal.get("parent_id"),
                                        edit=proposal.get("edit"), params=proposal.get("params"),
                                        language=proposal.get("language") or "triton")

    def start_candidate(self, candidate_id: int) -> None:
        self.store.start_candidate(candidate_id)

    def finish_candidate(self, job_id: int, candidate_id: int, result: dict[str, Any],
                         accepted: bool) -> None:
        self.store.finish_candidate(candidate_id, result, accepted)
        if accepted:
            from kernelabd.results import write_results

            write_results(self.store, self.home, job_id)

    def update_job(self, job_id: int, fields: dict[str, Any]) -> None:
        allowed = {"reference_ms", "reference_noise", "sol_ms", "capture"}
        bad = set(fields) - allowed
        if bad:
            raise ValueError(f"a worker may not set {sorted(bad)}")
        if isinstance(fields.get("capture"), dict):
            fields = {**fields, "capture": json.dumps(fields["capture"])}
        self.store.update_job(job_id, **fields)

    def add_active_time(self, job_id: int, seconds: float) -> None:
        self.store.add_active_time(job_id, seconds)

    def device_ceilings(self, job_id: int) -> dict[str, Any] | None:
        """The ceilings of the device the job runs on, if measured before."""
        job = self.store.job(job_id)
        return self.store.device_ceilings(job["device"]) if job and job["device"] else None

    def set_device_ceilings(self, job_id: int, ceilings: dict[str, Any]) -> bool:
        """Keep freshly measured ceilings with the job's device, for every later job there."""
        job = self.store.job(job_id)
        if not job or not job["device"]:
            return False
        return self.store.set_device_ceilings(job["device"], ceilings)

    def event(self, kind: str, message: str, level: str = "info",
              job_id: int | None = None) -> None:
        self.store.event(kind, message, level=level, job_id=job_id)

    def end_job(self, job_id: int, state: str, stop_reason: str | None,
                error: str | None) -> None:
        from kernelabd.results import write_results

        self.store.end_job(job_id, state, stop_reason=stop_reason, error=error)
        write_results(self.store, self.home, job_id)
        detail = error if error else stop_reason
        self.store.event(f"job.{state}", detail or "", job_id=job_id,
                         level="info" if state == "done" else "warning")


# The calls a worker may make on the daemon's recorder (nothing else crosses the pipe).
RPC_METHODS = frozenset({"load", "add_candidate", "start_candidate", "finish_candidate",
                         "update_job", "add_active_time", "event", "end_job",
                         "device_ceilings", "set_device_ceilings"})


def home_option(func: Any) -> Any:
    """``--home DIR`` for every command (else $KERNELAB_HOME, $STATE_DIRECTORY, XDG)."""
    import click

    return click.option("--home", "home_dir", type=click.Path(file_okay=False), default=None,
                        help="kernelab home directory (default: $KERNELAB_HOME, "
                             "$STATE_DIRECTORY, else the XDG state directory).")(func)
