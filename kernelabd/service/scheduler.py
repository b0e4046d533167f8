"""GPU slots and the queue: one worker process per device, one job per worker, highest
priority first; the daemon's side of each worker's pipe; and the job commands.

A worker is started on the first job for its device and kept for the next (importing torch is
the slow part). Pausing or cancelling a running job kills its worker's process group at once,
which is what makes a command take effect within a second even in the middle of a long
evaluation; the interrupted evaluation is simply redone when the job resumes.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import time
import traceback
from multiprocessing.connection import Connection, wait
from typing import Any

from kernelabd.config import Config
from kernelabd.harness.problem import one_line
from kernelabd.service.devices import Device
from kernelabd.service.recorder import RPC_METHODS, LocalRecorder
from store.home import Home
from store.records import COMMAND_STATES, Store
from store.status import foreground_pid, shown_state

JOIN_S = 5.0


class Worker:
    """The daemon's handle on one device's worker process."""

    def __init__(self, device: Device) -> None:
        self.device = device
        self.process: multiprocessing.process.BaseProcess | None = None
        self.conn: Connection | None = None
        self.job_id: int | None = None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    def start(self, config: Config, home: Home) -> None:
        from kernelabd.service import worker

        ctx = multiprocessing.get_context("spawn")
        ours, theirs = ctx.Pipe()
        self.process = ctx.Process(
            target=worker.main, name=f"kernelab-worker-{self.device.id}", daemon=False,
            args=(theirs, self.device.worker_env(), config, self.device.check_device,
                  str(home.work)))
        self.process.start()
        theirs.close()
        self.conn = ours

    def assign(self, job_id: int) -> None:
        assert self.conn is not None
        self.job_id = job_id
        self.conn.send(("run", job_id))

    def kill(self) -> None:
        """End the worker and everything it started (its own process group) now."""
        if self.process is not None and self.process.pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
            # A worker killed while still starting has not made its own group yet (setsid is its
            # first step), so the group kill finds nothing: kill the process itself as well,
            # or join() waits its full timeout and a cancel misses its one-second promise.
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            self.process.join(JOIN_S)
        if self.conn is not None:
            self.conn.close()
        self.process, self.conn, self.job_id = None, None, None


class Scheduler:
    """Assigns queued jobs to idle devices and serves the workers' calls."""

    def __init__(self, devices: list[Device], store: Store, recorder: LocalRecorder,
                 config: Config, home: Home) -> None:
        self.workers = [Worker(d) for d in devices]
        self.store = store
        self.recorder = recorder
        self.config = config
        self.home = home
        self.announced = False

    @property
    def busy(self) -> list[Worker]:
        return [w for w in self.workers if w.job_id is not None]

    def worker_for(self, job_id: int) -> Worker | None:
        return next((w for w in self.workers if w.job_id == job_id), None)

    def announce_isolation(self) -> None:
        """Record once which isolation this daemon's sandboxes get: a warning when less than
        namespaces (``kernelab doctor`` says why and how to fix it)."""
        from kernelabd.harness.isolation import probe

        iso = probe(self.config.sandbox.isolation, self.config.sandbox.user)
        weak = iso.warning or not iso.namespaced
        self.store.event("sandbox.isolation", "; ".join(filter(None, (iso.detail, iso.warning))),
                         level="warning" if weak else "info")
        self.announced = True

    def schedule(self) -> None:
        """Give every idle device the best queued job."""
        for worker in self.workers:
            if worker.job_id is not None:
                continue
            job_id = self.store.next_queued()
            if job_id is None:
                return
            if not self.announced:
                self.announce_isolation()
            if not worker.alive:
                worker.kill()
                worker.start(self.config, self.home)
            self.store.start_job(job_id, worker.device.id)
            self.store.event("job.started", f"on {worker.device.id}", job_id=job_id)
            worker.assign(job_id)

    def serve(self, timeout: float) -> None:
        """Answer the workers' calls for up to ``timeout`` seconds (returns after one round)."""
        conns = {w.conn: w for w in self.workers if w.conn is not None}
        if not conns:
            time.sleep(timeout)
            return
        for conn in wait(list(conns), timeout):
            self._serve_one(conns[conn])

    def _serve_one(self, worker: Worker) -> None:
        assert worker.conn is not None
        try:
            _, method, args = worker.conn.recv()
        except (EOFError, OSError):
            self._lost(worker)
            return
        try:
            if method not in RPC_METHODS:
                raise ValueError(f"unknown call {method!r}")
            value = getattr(self.recorder, method)(*args)
            reply: tuple[str, Any] = ("ok", value)
        except Exception as exc:
            self.store.event("daemon.error", f"{method}: {one_line(exc)}",
                             level="error", job_id=worker.job_id)
            reply = ("error", one_line(exc))
        if method == "end_job" and reply[0] == "ok":
            worker.job_id = None
        try:
            worker.conn.send(reply)
        except (BrokenPipeError, OSError):
            self._lost(worker)

    def _lost(self, worker: Worker) -> None:
        """A worker died on its own: its job goes on or fails (``worker_died``), the device frees."""
        process, job_id = worker.process, worker.job_id
        worker.kill()
        code = process.exitcode if process is not None else None
        how = f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 and \
            -code in signal.valid_signals() else f"exit code {code}"
        if job_id is not None:
            self.worker_died(job_id, f"worker process died ({how})")

    def worker_died(self, job_id: int, cause: str) -> None:
        """The worker running ``job_id`` died. While it evaluated a candidate, the job goes back
        to the queue and goes on: the candidate is evaluated once more, or, at its second such
        death, recorded as poison (rule ``hostile``) and skipped, so no candidate can keep killing
        workers. Elsewhere (capture, a proposer) the job fails, and a retry resumes it."""
        if self.store.crashed(job_id, cause):
            self.store.interrupt_job(job_id, "queued")
            self.store.event("job.requeued", f"{cause} while evaluating; the job goes on",
                             level="warning", job_id=job_id)
            return
        self.store.interrupt_job(job_id, "running")
        self.recorder.end_job(job_id, "failed", None, f"{cause}; retry resumes it")

    def interrupt(self, job_id: int, state: str) -> None:
        """Stop a running job now, keeping it resumable, and leave it in ``state``."""
        worker = self.worker_for(job_id)
        if worker is not None:
            worker.kill()
        self.store.interrupt_job(job_id, state)

    def shutdown(self) -> None:
        """Stop every worker; their jobs go back to the queue, to resume on the next start."""
        for worker in self.workers:
            job_id = worker.job_id
            worker.kill()
            if job_id is not None:
                self.store.interrupt_job(job_id, "queued")
                self.store.event("job.interrupted", "daemon stopping; the job will resume",
                                 job_id=job_id)

    # -- commands -----------------------------------------------------------------------------

    def apply_commands(self) -> None:
        for cmd in self.store.pending_commands():
            try:
                status, result = self.apply(cmd["verb"], cmd["job_id"], cmd["arg"])
            except Exception as exc:
                status, result = "rejected", one_line(exc)
                self.store.event("daemon.error", traceback.format_exc(limit=3), level="error")
            self.store.finish_command(cmd["id"], status, result)
            self.store.event(f"command.{status}", f"{cmd['verb']} {cmd['job_id']}: {result}",
                             job_id=cmd["job_id"])

    def apply(self, verb: str, job_id: int, arg: str | None) -> tuple[str, str]:
        """Carry out one job command; returns (done|rejected, what happened). Which states a verb
        applies to is ``store.records.COMMAND_STATES``, read against the state users are shown:
        a job whose foreground ``kernelab port`` died is ``interrupted``, and the daemon takes it
        over on ``resume``; one whose process still runs it is not the daemon's to command."""
        job = self.store.job(job_id)
        if job is None:
            return "rejected", f"no job {job_id}"
        state = shown_state(job["state"], job["config"])
        owner = foreground_pid(job["config"])
        if state == "running" and owner and self.worker_for(job_id) is None:
            return "rejected", f"job runs in the foreground (kernelab port, pid {owner})"
        if verb not in COMMAND_STATES or state not in COMMAND_STATES[verb]:
            return "rejected", f"cannot {verb} a {state} job"
        if verb == "priority":
            self.store.update_job(job_id, priority=int(arg or "0"))
            return "done", f"priority {int(arg or '0')}"
        if verb == "pause":
            self.interrupt(job_id, "paused")
            return "done", "paused"
        if verb == "resume":
            if state == "queued":
                return "done", "already queued"
            self.store.hand_over(job_id)
            return "done", "queued"
        if verb == "cancel":
            self.interrupt(job_id, job["state"])
            self.recorder.end_job(job_id, "cancelled", "cancelled by a user", None)
            return "done", "cancelled"
        self.store.retry_job(job_id)
        return "done", "queued"
