"""A worker process: one per device, running one job at a time.

The worker imports the harness (torch, triton) so the daemon never has to, and it is pinned to
its GPU before anything touches CUDA. It never opens the database: every read and write goes
to the daemon as a call over its pipe (``RpcRecorder``), so the daemon stays the only writer.
It leads its own process group and dies with the daemon (``PR_SET_PDEATHSIG``), so neither a
``kill -9`` of the daemon nor a cancelled job leaves it running.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from kernelabd.config import Config
from kernelabd.harness.problem import one_line

PR_SET_PDEATHSIG = 1
log = logging.getLogger("kernelab.worker")


class RemoteError(RuntimeError):
    """The daemon could not carry out a call (its message is the daemon's one-line error)."""


class RpcRecorder:
    """The ``converge.Recorder`` of a worker: each method is a synchronous call to the daemon."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def _call(self, method: str, *args: Any) -> Any:
        self.conn.send(("call", method, args))
        status, value = self.conn.recv()
        if status != "ok":
            raise RemoteError(value)
        return value

    def load(self, job_id: int) -> dict[str, Any]:
        return self._call("load", job_id)

    def add_candidate(self, job_id: int, proposal: dict[str, Any], proposer: str) -> int:
        return self._call("add_candidate", job_id, proposal, proposer)

    def start_candidate(self, candidate_id: int) -> None:
        self._call("start_candidate", candidate_id)

    def finish_candidate(self, job_id: int, candidate_id: int, result: dict[str, Any],
                         accepted: bool) -> None:
        self._call("finish_candidate", job_id, candidate_id, result, accepted)

    def add_fingerprint(self, candidate_id: int, found: dict[str, Any], seconds: float) -> None:
        self._call("add_fingerprint", candidate_id, found, seconds)

    def update_job(self, job_id: int, fields: dict[str, Any]) -> None:
        self._call("update_job", job_id, fields)

    def add_active_time(self, job_id: int, seconds: float) -> None:
        self._call("add_active_time", job_id, seconds)

    def event(self, kind: str, message: str, level: str = "info",
              job_id: int | None = None) -> None:
        self._call("event", kind, message, level, job_id)

    def add_exchange(self, job_id: int, candidate_id: int | None, exchange: dict[str, Any]) -> None:
        self._call("add_exchange", job_id, candidate_id, exchange)

    def ceilings(self, key: str) -> dict[str, Any] | None:
        return self._call("ceilings", key)

    def keep_ceilings(self, job_id: int, key: str, ceilings: dict[str, Any]) -> None:
        self._call("keep_ceilings", job_id, key, ceilings)

    def screened(self, job_id: int) -> list[dict[str, Any]]:
        return self._call("screened", job_id)

    def add_screened(self, job_id: int, rows: list[dict[str, Any]]) -> list[int]:
        return self._call("add_screened", job_id, rows)

    def link_screened(self, screened_id: int, candidate_id: int) -> None:
        self._call("link_screened", screened_id, candidate_id)

    def cached_configs(self, device_name: str, signature: str, family: str, shapes: str) -> list[dict[str, Any]]:
        return self._call("cached_configs", device_name, signature, family, shapes)

    def cache_best(self, entry: dict[str, Any]) -> bool:
        return self._call("cache_best", entry)

    def end_job(self, job_id: int, state: str, stop_reason: str | None,
                error: str | None) -> None:
        self._call("end_job", job_id, state, stop_reason, error)


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def run_job(job_id: int, rec: RpcRecorder, *, config: Config, device: str,
            work: Path) -> None:
    """Run one job's loop to its end and report how it ended; a failure of the loop itself
    (not of a candidate) fails the job with a one-line error rather than the worker."""
    from kernelabd.service.converge import Loop, Outcome

    try:
        outcome = Loop(job_id, rec, config=config, device=device, workdir=work / f"job-{job_id}").run()
    except Exception as exc:
        log.error("job.crashed", extra={"job": job_id, "detail": traceback.format_exc()})
        outcome = Outcome("failed", error=one_line(exc))
    rec.end_job(job_id, outcome.state, outcome.stop_reason, outcome.error)


def main(conn: Connection, env: dict[str, str], config: Config, device: str,
         work: str) -> None:
    """The worker process's entry point (started by ``scheduler.Worker``)."""
    os.setsid()
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.update(env)
    rec = RpcRecorder(conn)
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message[0] == "run":
            run_job(message[1], rec, config=config, device=device, work=Path(work))
        elif message[0] == "exit":
            return
