"""The daemon as users run it: a real process, a real SQLite file, real signals."""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from store.db import NotCreatedYet, connect

SOFTMAX = ("softmax.py", "softmax.toml", "softmax.new.py")


def db(kit) -> sqlite3.Connection:
    return connect(kit.home.db, readonly=True)


def children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (the daemon's workers)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def evaluating(kit) -> bool:
    """A candidate is in flight after at least one was accepted (mid-job)."""
    if not kit.home.db.exists():
        return False
    try:
        conn = db(kit)
    except NotCreatedYet:      # the daemon is creating the schema this moment
        return False
    try:
        row = conn.execute("SELECT SUM(accepted), SUM(state = 'evaluating') FROM candidates")
        accepted, flying = row.fetchone()
    finally:
        conn.close()
    return bool(accepted) and bool(flying)


@pytest.mark.slow
def test_submit_runs_to_done_with_a_best_file_while_a_malformed_file_is_invalid(kit):
    daemon = kit.daemon()
    (kit.home.inbox / "broken.py").write_text("class Model(:\n")     # written in place
    kit.drop(*SOFTMAX)
    job = kit.wait_for(lambda: (j := kit.job_of("softmax.py")) and j["state"] not in
                       ("queued", "running") and j, 240, "the softmax job to end")
    assert job["state"] == "done", job
    assert job["best_file"] and Path(job["best_file"]).read_text().startswith('"""Triton')
    assert (job["candidates"], job["accepted"]) == (2, job["accepted"]) and job["accepted"] >= 1
    assert job["best_speedup"] > 0
    broken = kit.job_of("broken.py")
    assert broken["state"] == "invalid"
    assert "syntax error" in broken["error"] and "\n" not in broken["error"]
    report = json.loads((kit.home.results / "softmax" / "report.json").read_text())
    assert report["job"] == job["id"] and report["lineage"][0]["edit"] == "starting candidate"
    assert report["best"]["max_rel_error"] <= report["best"]["tolerance"]
    assert "Lineage" in (kit.home.results / "softmax" / "report.md").read_text()
    status = kit.status()
    assert status["devices"][0]["id"] == "cpu" and set(status) == {"jobs", "devices"}
    assert status["devices"][0]["ceilings"]["copy_gbps"] > 0, "measured on the first job"
    conn = db(kit)
    beat = conn.execute("SELECT heartbeat_at FROM daemon").fetchone()[0]
    assert time.time() - beat < 5, "the heartbeat is kept fresh"
    assert daemon.stop() == 0
    assert "event=job.done" in daemon.output()


def test_once_processes_the_inbox_and_exits_zero(kit):
    (kit.home.inbox / "nomodel.py").write_text("x = 1\n")
    (kit.home.inbox / "notes.txt").write_text("not a kernel")
    daemon = kit.daemon("--once")
    assert daemon.proc.wait(60) == 0
    assert kit.job_of("nomodel.py")["state"] == "invalid"
    assert "event=inbox.ignored" in daemon.output()


@pytest.mark.slow
def test_kill_9_mid_job_then_restart_redoes_only_the_in_flight_evaluation(kit):
    kit.home.config.write_text(kit.home.config.read_text().replace("max_candidates = 2",
                                                                   "max_candidates = 3"))
    daemon = kit.daemon()
    kit.drop(*SOFTMAX)
    kit.wait_for(lambda: evaluating(kit), 180, "an evaluation in flight after an acceptance")
    workers = children(daemon.proc.pid)
    conn = db(kit)
    before = [dict(r) for r in conn.execute("SELECT id, state, accepted, params FROM candidates")]
    conn.close()
    daemon.stop(signal.SIGKILL)
    kit.wait_for(lambda: not any(alive(p) for p in workers), 10, "workers to die with the daemon")

    again = kit.daemon("--once")
    assert again.proc.wait(240) == 0, again.output()
    conn = db(kit)
    after = [dict(r) for r in conn.execute("SELECT id, state, accepted, params FROM candidates")]
    job = dict(conn.execute("SELECT state, stop_reason FROM jobs").fetchone())
    assert job["state"] == "done", job
    assert len(after) == 3 and all(c["state"] == "done" for c in after)
    by_id = {c["id"]: c for c in after}
    for c in before:                           # nothing recorded before the kill was lost …
        assert c["id"] in by_id and by_id[c["id"]]["params"] == c["params"]
        if c["state"] == "done":               # … or changed, and accepted stays accepted
            assert by_id[c["id"]]["accepted"] == c["accepted"]
    assert len({c["params"] for c in after}) == len(after), "no configuration evaluated twice"
    assert "event=candidate.redo" in again.output() and "event=job.resumed" in again.output()


def test_sigterm_stops_within_10_s_exit_0_resumable_and_tells_systemd(kit, tmp_path):
    sock_path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(sock_path)
    sock.settimeout(30)
    daemon = kit.daemon(env={"NOTIFY_SOCKET": sock_path})
    assert b"READY=1" in sock.recv(4096)
    kit.drop(*SOFTMAX)
    kit.wait_for(lambda: (j := kit.job_of("softmax.py")) and j["state"] == "running", 30,
                 "the job to start")
    time.sleep(3)                                # mid-evaluation (worker busy in the harness)
    start = time.monotonic()
    assert daemon.stop(signal.SIGTERM, timeout=10) == 0
    assert time.monotonic() - start < 10
    assert kit.job_of("softmax.py")["state"] == "queued"
    conn = db(kit)
    assert conn.execute("SELECT status FROM daemon").fetchone()[0] == "stopped"
    assert conn.execute("SELECT COUNT(*) FROM candidates WHERE state = 'evaluating'"
                        ).fetchone()[0] == 0
    sock.settimeout(1)
    messages = b""
    while True:
        try:
            messages += sock.recv(4096) + b"\n"
        except TimeoutError:
            break
    assert b"STOPPING=1" in messages and b"STATUS=" in messages


def test_job_commands_take_effect_within_a_second(kit):
    kit.home.config.write_text(kit.home.config.read_text().replace("max_candidates = 2",
                                                                   "max_candidates = 20"))
    daemon = kit.daemon()
    kit.drop(*SOFTMAX)
    job = kit.wait_for(lambda: (j := kit.job_of("softmax.py")) and j["state"] == "running" and j,
                       30, "the job to start")
    jid = str(job["id"])
    start = time.monotonic()
    out = kit.cli("jobs", "pause", jid)
    assert time.monotonic() - start < 2.5 and "paused" in out.stdout
    assert kit.job_of("softmax.py")["state"] == "paused"
    assert "priority 5" in kit.cli("jobs", "priority", jid, "5").stdout
    assert kit.job_of("softmax.py")["priority"] == 5
    assert "queued" in kit.cli("jobs", "resume", jid).stdout
    kit.wait_for(lambda: kit.job_of("softmax.py")["state"] == "running", 5, "it to run again")
    assert "cancelled" in kit.cli("jobs", "cancel", jid).stdout
    assert kit.job_of("softmax.py")["state"] == "cancelled"
    rejected = kit.cli("jobs", "pause", jid, check=False)
    assert rejected.returncode == 1 and "cannot pause a cancelled job" in rejected.stderr
    assert "queued" in kit.cli("jobs", "retry", jid).stdout
    missing = kit.cli("jobs", "cancel", "999", check=False)
    assert missing.returncode == 1 and "no job 999" in missing.stderr
    assert daemon.stop() == 0


def test_cuda_without_a_gpu_is_a_clear_error(kit):
    out = kit.cli("daemon", "--device", "cuda", check=False, timeout=60)
    assert out.returncode == 1 and "no GPU found" in out.stderr


def test_200_files_dropped_at_once_are_all_recorded_within_10_s(kit, tmp_path):
    source = (kit.examples / "softmax.py").read_text()
    files = []
    for i in range(200):
        path = tmp_path / f"k{i:03d}.py"
        path.write_text(source.replace("dim = 1000", f"dim = {1000 + i}"))
        files.append(path)
    daemon = kit.daemon()
    kit.wait_for(lambda: kit.home.db.exists() and kit.status()["devices"], 30, "the daemon")
    kit.cli("submit", *map(str, files))
    start = time.monotonic()
    worst = 0.0
    while True:
        t0 = time.monotonic()
        jobs = kit.status()["jobs"]
        worst = max(worst, time.monotonic() - t0)
        if len(jobs) >= 200 or time.monotonic() - start > 10:
            break
    elapsed = time.monotonic() - start
    assert len(jobs) == 200 and elapsed < 10, (len(jobs), elapsed)
    time.sleep(2)
    jobs = kit.status()["jobs"]
    assert sorted(j["problem"] for j in jobs) == sorted(f.name for f in files)
    assert worst < 1.0, f"status took {worst:.2f} s"
    assert daemon.stop() == 0


def test_a_worker_killed_while_it_is_still_starting_dies_at_once(tmp_path):
    """Pause or cancel right after a (re)start reaches a worker before it has made its own
    process group; the kill must not then wait out its join timeout."""
    from kernelabd.client import ensure_home
    from kernelabd.config import load
    from kernelabd.service.devices import cpu_device
    from kernelabd.service.scheduler import JOIN_S, Worker
    from store.home import Home

    home = ensure_home(Home(tmp_path / "home"))
    worker = Worker(cpu_device())
    worker.start(load(home.config), home)
    process = worker.process
    started = time.monotonic()
    worker.kill()
    assert time.monotonic() - started < JOIN_S / 2
    assert process is not None and not process.is_alive()


def test_a_file_the_daemon_died_on_is_quarantined_at_the_next_start_never_retried(kit):
    """The daemon is killed while it reads a file (as the OOM killer or a watchdog would): the
    next start moves that file to inbox/.rejected/ with a reason, records it, and serves on."""
    daemon = kit.daemon()
    kit.wait_for(lambda: kit.home.db.exists() and kit.status()["devices"], 60, "the daemon")
    marker = kit.home.inbox / ".kernelab-taking"
    body = "x = [" + "1," * 480_000 + "]\n"            # just under 1 MiB: seconds to parse
    (kit.home.inbox / "slow.py").write_text("class Model: pass\ndef get_inputs(): return []\n"
                                            "def get_init_inputs(): return []\n" + body)
    kit.wait_for(marker.exists, 60, "the daemon to start reading slow.py", step=0.002)
    daemon.stop(signal.SIGKILL)
    assert "slow.py" in marker.read_text()
    again = kit.daemon()
    (kit.home.inbox / "broken.py").write_text("class Model(:\n")
    kit.wait_for(lambda: kit.job_of("broken.py"), 60, "the restarted daemon to serve on")
    (folder,) = (kit.home.inbox / ".rejected").iterdir()
    assert sorted(p.name for p in folder.iterdir()) == ["reason.txt", "slow.py"]
    reason = (folder / "reason.txt").read_text().strip()
    assert reason.startswith(f"slow.py: the daemon (pid {daemon.proc.pid}) died while reading it at ")
    conn = db(kit)
    try:
        quarantined = [r[0] for r in conn.execute("SELECT message FROM events WHERE kind = 'inbox.quarantined'")]
    finally:
        conn.close()
    assert quarantined == [reason]
    assert kit.job_of("slow.py") is None and not marker.exists()
    assert again.stop() == 0


def test_a_crash_is_recorded_as_a_crash_never_as_a_clean_shutdown(kit):
    """A full disk (here: a file-size limit the database's log reaches) stops the daemon with a
    non-zero status and ``daemon.crashed`` in its log, not "clean shutdown"."""
    connect(kit.home.db).close()          # the schema exists before the limit applies
    limit = kit.home.db.stat().st_size + 16 * 1024

    def full_disk_soon() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # EFBIG, as on a full disk, not a signal

    proc = subprocess.run([sys.executable, "-m", "kernelabd", "daemon", "--home", str(kit.home.root),
                           "--device", "cpu"], capture_output=True, text=True, timeout=180,
                          preexec_fn=full_disk_soon)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "event=daemon.crashed" in output and "OperationalError: disk I/O error" in output
    assert "clean shutdown" not in output
