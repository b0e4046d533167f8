"""The daemon's job commands (``Scheduler.apply``) on a real store: which states each verb takes,
and jobs whose foreground ``kernelab port`` is alive (not the daemon's) or dead (interrupted:
``resume`` hands them to the daemon)."""

from __future__ import annotations

import json
import os

import pytest

from kernelabd.config import Config
from kernelabd.service.recorder import LocalRecorder
from kernelabd.service.scheduler import Scheduler
from store import status
from store.db import connect
from store.home import Home
from store.records import Store
from tests.store.recorded import dead_pid, record_job


@pytest.fixture
def store(tmp_path) -> Store:
    return Store(connect(tmp_path / "home" / "kernelab.db"))


@pytest.fixture
def scheduler(tmp_path, store) -> Scheduler:
    home = Home(tmp_path / "home")
    return Scheduler([], store, LocalRecorder(store, home), Config(), home)


def test_a_job_a_live_foreground_process_runs_is_not_the_daemons_to_command(store, scheduler):
    job_id = record_job(store, config={"foreground_pid": os.getpid()})
    for verb in ("pause", "resume", "cancel", "priority"):
        assert scheduler.apply(verb, job_id, "3") == (
            "rejected", f"job runs in the foreground (kernelab port, pid {os.getpid()})")
    assert store.job(job_id)["state"] == "running"


def test_resume_hands_an_interrupted_job_to_the_daemon_with_its_in_flight_candidate_pending(store, scheduler):
    job_id = record_job(store, config={"foreground_pid": dead_pid()})
    store.conn.execute("UPDATE candidates SET state = 'evaluating' WHERE id = (SELECT MAX(id) FROM candidates)")
    store.conn.commit()
    assert status.jobs(store.conn)[0]["state"] == "interrupted"
    assert scheduler.apply("resume", job_id, None) == ("done", "queued")
    job = store.job(job_id)
    assert job["state"] == "queued" and "foreground_pid" not in json.loads(job["config"])
    states = [r[0] for r in store.conn.execute("SELECT state FROM candidates WHERE job_id = ?", (job_id,))]
    assert states.count("pending") == 1 and "evaluating" not in states
    assert store.next_queued() == job_id


def test_an_interrupted_job_can_be_paused_reprioritised_and_cancelled(store, scheduler):
    job_id = record_job(store, config={"foreground_pid": dead_pid()})
    assert scheduler.apply("priority", job_id, "4") == ("done", "priority 4")
    assert scheduler.apply("pause", job_id, None) == ("done", "paused")
    assert scheduler.apply("resume", job_id, None) == ("done", "queued")
    assert "foreground_pid" not in json.loads(store.job(job_id)["config"])
    other = record_job(store, "other", config={"foreground_pid": dead_pid()})
    assert scheduler.apply("cancel", other, None) == ("done", "cancelled")
    assert store.job(other)["state"] == "cancelled"


def test_resume_of_a_queued_job_succeeds_and_changes_nothing(store, scheduler):
    """A resume posted while no daemon ran, for a job the daemon's start requeued itself."""
    job_id = record_job(store, config={"foreground_pid": dead_pid()})
    store.recover()
    assert store.job(job_id)["state"] == "queued"
    assert scheduler.apply("resume", job_id, None) == ("done", "already queued")


@pytest.mark.parametrize(("verb", "state"), [("pause", "done"), ("resume", "running"), ("retry", "running"),
                                             ("priority", "done"), ("cancel", "cancelled")])
def test_a_verb_outside_its_states_is_rejected(store, scheduler, verb, state):
    job_id = record_job(store)
    if state != "running":
        store.end_job(job_id, state)
    assert scheduler.apply(verb, job_id, "1") == ("rejected", f"cannot {verb} a {state} job")
    assert store.job(job_id)["state"] == state
