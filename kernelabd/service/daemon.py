"""The daemon process: lifecycle, signals, systemd notify, and the main loop that ties the
inbox, the scheduler, the commands table and NVML sampling together.

Everything runs on one thread except watchdog's observer (which only enqueues paths), so the
one SQLite writer connection is never shared. The loop wakes every ``TICK_S`` at most, which
bounds command latency and SIGTERM reaction while costing well under 1 % of a core when idle.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import socket
import sqlite3
import time
from dataclasses import dataclass
from typing import Any

from kernelabd import __version__
from kernelabd.client import ensure_home, pid_alive
from kernelabd.config import Config
from kernelabd.harness.problem import one_line
from kernelabd.service.devices import Device, discover, sample
from kernelabd.service.inbox import Inbox, quarantine, take_ready
from kernelabd.service.notify import Notifier
from kernelabd.service.recorder import LocalRecorder
from kernelabd.service.scheduler import Scheduler
from store.db import connect
from store.home import Home
from store.records import Store

TICK_S = 0.2
HEARTBEAT_S = 1.0
SAMPLE_KEEP_S = 24 * 3600
PRUNE_S = 3600.0
log = logging.getLogger("kernelab.daemon")


class AlreadyRunning(RuntimeError):
    """Another daemon holds this home's lock."""


@dataclass
class Options:
    device: str | None = None     # cpu | cuda | None (GPUs if any)
    once: bool = False            # process the inbox, wait for every job, exit


def foreground_jobs(conn: sqlite3.Connection) -> set[int]:
    """Running jobs owned by a live ``kernelab port`` process: not ours to resume."""
    keep = set()
    for row in conn.execute("SELECT id, config FROM jobs WHERE state = 'running'"):
        pid = json.loads(row["config"] or "{}").get("foreground_pid")
        if pid and pid_alive(int(pid)):
            keep.add(row["id"])
    return keep


class Daemon:
    def __init__(self, home: Home, config: Config, options: Options) -> None:
        self.home = ensure_home(home)
        self.config = config
        self.options = options
        self.stopping = False
        self.notifier = Notifier.from_env()
        self.lock_fd: int | None = None
        self.nvml: Any | None = None
        self.devices: list[Device] = []
        self.started_at = time.time()
        self._last_beat = 0.0

    # -- lifecycle ----------------------------------------------------------------------------

    def lock(self) -> None:
        """One daemon per home: a second one would be a second writer."""
        fd = os.open(self.home.root / "daemon.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            owner = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise AlreadyRunning(f"another daemon (pid {owner}) is using {self.home.root}") \
                from exc
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.lock_fd = fd

    def on_signal(self, signum: int, _frame: Any) -> None:
        self.stopping = True

    def run(self) -> int:
        self.lock()
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, self.on_signal)
        conn = connect(self.home.db)
        store = Store(conn)
        scheduler = self.scheduler(store)
        for job_id in store.recover(keep=foreground_jobs(conn)):
            store.event("job.resumed", "was running when the daemon stopped; queued again",
                        job_id=job_id)
        inbox = Inbox(self.home.inbox, stable_s=self.config.daemon.stable_s,
                      rescan_s=self.config.daemon.rescan_s,
                      polling=self.config.daemon.polling_observer)
        inbox.start()
        quarantine(inbox, store)
        store.event("daemon.started", f"pid {os.getpid()}, devices "
                    f"{', '.join(d.id for d in self.devices)}, home {self.home.root}, "
                    f"sqlite {sqlite3.sqlite_version}")
        self.notifier.ready(self.status_line(scheduler))
        self.beat(store, scheduler, force=True)
        try:
            self.loop(store, inbox, scheduler)
        except BaseException as exc:
            self.crashed(store, inbox, scheduler, exc)
            raise
        self.stop(store, inbox, scheduler, None)
        conn.close()
        return 0

    def stop(self, store: Store, inbox: Inbox, scheduler: Scheduler,
             crash: BaseException | None) -> None:
        """Stop the workers (their jobs go back to the queue) and the watcher, and say how the
        daemon ended: "clean shutdown" only when it was asked to stop."""
        self.notifier.stopping()
        try:
            scheduler.shutdown()
        finally:
            inbox.stop()
        store.heartbeat(os.getpid(), socket.gethostname(), __version__, "stopped", self.started_at)
        if crash is None:
            store.event("daemon.stopped", "clean shutdown")
        else:
            store.event("daemon.crashed", one_line(crash), level="error")

    def crashed(self, store: Store, inbox: Inbox, scheduler: Scheduler, crash: BaseException) -> None:
        """Stop as well as a crash allows; when the database is what failed (a full disk), the
        crash is still logged, as ``daemon.crashed``, before the exception ends the process."""
        try:
            self.stop(store, inbox, scheduler, crash)
        except Exception as exc:
            log.error("daemon.crashed", extra={"detail": f"{one_line(crash)}; while stopping: {one_line(exc)}"})

    def scheduler(self, store: Store) -> Scheduler:
        """This box's devices (``[cluster] backend = "local"``) or a Ray cluster's."""
        recorder = LocalRecorder(store, self.home)
        if self.config.cluster.backend == "ray":
            from kernelabd.service.cluster import RayScheduler

            ray_scheduler = RayScheduler(store, recorder, self.config, self.home,
                                         self.options.device)
            self.devices = list(ray_scheduler.inventory.values())
            return ray_scheduler
        self.devices, self.nvml = discover(self.options.device, self.config.daemon.gpus)
        for d in self.devices:
            store.upsert_device(d.id, d.name, uuid=d.uuid, memory_total_mb=d.memory_total_mb,
                                node=socket.gethostname())
        return Scheduler(self.devices, store, recorder, self.config, self.home)

    # -- the loop -----------------------------------------------------------------------------

    def loop(self, store: Store, inbox: Inbox, scheduler: Scheduler) -> None:
        next_sample = next_prune = 0.0
        while not self.stopping:
            take_ready(inbox, store)
            scheduler.apply_commands()
            scheduler.schedule()
            scheduler.serve(TICK_S)
            now = time.time()
            self.beat(store, scheduler)
            if self.nvml is not None and now >= next_sample:
                store.add_gpu_samples([sample(self.nvml, d, now) for d in self.devices])
                next_sample = now + self.config.daemon.gpu_sample_s
            if now >= next_prune:
                store.prune_gpu_samples(SAMPLE_KEEP_S)
                next_prune = now + PRUNE_S
            if self.options.once and inbox.idle and not scheduler.busy \
                    and store.next_queued() is None:
                store.event("daemon.once", "inbox processed and every job ended")
                return

    def beat(self, store: Store, scheduler: Scheduler, *, force: bool = False) -> None:
        """Heartbeat row, systemd STATUS= and watchdog ping, once a second."""
        now = time.monotonic()
        if not force and now - self._last_beat < HEARTBEAT_S:
            return
        self._last_beat = now
        status = self.status_line(scheduler)
        store.heartbeat(os.getpid(), socket.gethostname(), __version__, status, self.started_at)
        self.notifier.status(status)
        if self.notifier.watchdog_usec:
            self.notifier.watchdog()

    def status_line(self, scheduler: Scheduler) -> str:
        running = [f"job {w.job_id} on {w.device.id}" for w in scheduler.busy]
        queued = scheduler.store.count_jobs("queued")
        return (f"running {', '.join(running)}; " if running else "idle; ") + f"{queued} queued"
