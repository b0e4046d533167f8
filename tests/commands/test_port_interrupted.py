"""A ``kernelab port`` killed mid-job (as the out-of-memory killer would) leaves an
``interrupted`` job, not a ``running`` one, in every reader; ``kernelab jobs resume`` hands it to
the daemon, which finishes it from its recorded history."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from kernelabd.commands.port import _run
from kernelabd.config import load
from kernelabd.service.converge import Loop
from kernelabd.service.inbox import read_problem
from kernelabd.service.recorder import LocalRecorder
from store.db import NotCreatedYet, StoreError, connect
from store.home import Home
from store.records import Store
from tui.data import load_jobs

ROOT = Path(__file__).resolve().parents[2]


def kernelab(home: Home, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernelabd", *args, "--home", str(home.root)],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def ask(home: Home, sql: str) -> tuple | None:
    """One row of a read-only query on the home's store (None before the store exists)."""
    try:
        conn = connect(home.db, readonly=True)
    except (StoreError, NotCreatedYet):
        return None
    try:
        return tuple(conn.execute(sql).fetchone())
    finally:
        conn.close()


def mid_job(home: Home) -> bool:
    """A candidate has been accepted and the next one is being evaluated."""
    row = ask(home, "SELECT SUM(accepted), SUM(state = 'evaluating') FROM candidates")
    return row is not None and bool(row[0]) and bool(row[1])


def only_job(home: Home) -> dict:
    (job,) = json.loads(kernelab(home, "status", "--json").stdout)["jobs"]
    return job


@pytest.mark.slow
def test_a_killed_port_is_interrupted_then_resumed_and_finished_by_the_daemon(kit) -> None:
    home = kit.home                                                          # a job of 2 candidates
    port = subprocess.Popen([sys.executable, "-m", "kernelabd", "port", str(kit.examples / "softmax.py"),
                             "--device", "cpu", "--home", str(home.root)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        kit.wait_for(lambda: mid_job(home), 240, "the foreground job to be mid-candidate")
        os.kill(port.pid, signal.SIGKILL)
        port.wait(10)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(port.pid, signal.SIGKILL)       # its sandboxes, in the session it led
        port.wait(10)

    job = only_job(home)
    assert job["state"] == "interrupted"
    assert "interrupted" in kernelab(home, "status").stdout
    reader = connect(home.db, readonly=True)
    assert [j.state for j in load_jobs(reader)] == ["interrupted"]          # the TUI's reader
    reader.close()

    resumed = kernelab(home, "jobs", "resume", str(job["id"]))
    assert resumed.returncode == 0 and "no daemon is running" in resumed.stdout
    started = time.monotonic()
    daemon = kernelab(home, "daemon", "--once", "--device", "cpu", timeout=400)
    assert daemon.returncode == 0, daemon.stderr[-2000:]

    done = only_job(home)
    assert (done["state"], done["candidates"]) == ("done", 2), (done, time.monotonic() - started)
    conn = connect(home.db, readonly=True)
    states = [r[0] for r in conn.execute("SELECT state FROM candidates ORDER BY id")]
    command = tuple(conn.execute("SELECT verb, status, result FROM commands").fetchone())
    config = json.loads(conn.execute("SELECT config FROM jobs").fetchone()[0])
    conn.close()
    assert states == ["done", "done"]                                        # the in-flight one redone once
    assert command == ("resume", "done", "already queued")                    # the daemon's start requeued it
    assert "foreground_pid" not in config
    report = json.loads((home.results / "softmax" / "report.json").read_text())
    assert (report["job"], report["state"]) == (done["id"], "done")
    assert report["best"]["speedup_vs_reference"] == done["best_speedup"]


class CtrlCAtTheSecondCandidate(Loop):
    """The real loop, with Ctrl-C pressed as its second candidate is about to be evaluated: a
    fixed point for a signal that, sent from outside, lands wherever a loaded CPU has the job."""

    def evaluate(self, cand):
        if any(c.state == "done" for c in self.history):
            raise KeyboardInterrupt
        super().evaluate(cand)


def test_a_port_stopped_with_ctrl_c_is_paused_and_its_report_says_so(kit) -> None:
    """Ctrl-C (or a benchmark's timeout, SIGINT) pauses the job, and its report.json and
    report.md are written again: they do not go on saying "running" with the best port found."""
    home = kit.home
    store = Store(connect(home.db))
    problem = read_problem(kit.examples / "softmax.py")
    _, job_id = store.add_problem(problem, job_config={"foreground_pid": os.getpid()}, always=True)
    with pytest.raises(SystemExit) as stopped:
        _run(store, LocalRecorder(store, home), job_id, "cpu", load(home.config), home, Console(stderr=True),
             CtrlCAtTheSecondCandidate)
    assert stopped.value.code == 130
    assert only_job(home)["state"] == "paused"
    report = json.loads((home.results / "softmax" / "report.json").read_text())
    assert report["state"] == "paused" and report["best"] is not None
    assert "paused" in (home.results / "softmax" / "report.md").read_text()


def test_sigint_pauses_a_port_even_where_it_was_started_with_sigint_ignored() -> None:
    """A shell without job control (a script, CI) starts background commands with SIGINT
    ignored, and a Python started so never raises KeyboardInterrupt: ``kill -INT`` would then
    leave the port running. ``kernelab port`` takes SIGINT back before its job starts."""
    probe = ("import os, signal, time\n"
             "from kernelabd.commands.port import _pause_on_sigint\n"
             "assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN\n"
             "_pause_on_sigint()\n"
             "try:\n"
             "    os.kill(os.getpid(), signal.SIGINT)\n"
             "    time.sleep(30)\n"
             "except KeyboardInterrupt:\n"
             "    print('paused')\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert done.returncode == 0 and done.stdout.strip() == "paused", done.stderr[-2000:]
