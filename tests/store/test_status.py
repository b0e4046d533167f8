"""``store.status``, the numbers every reader shows, on real SQLite files written by the
writer's own methods (and one written by an older kernelab)."""

from __future__ import annotations

import json
import os
import sqlite3
import time

import pytest

from store import status
from store.db import connect
from store.records import NewProblem, Store
from tests.store.recorded import PEERS, PLAN, REF, add_screened, dead_pid, legacy_database, record_job


@pytest.fixture
def store(tmp_path) -> Store:
    return Store(connect(tmp_path / "kernelab.db"))


def test_a_jobs_speedup_is_the_product_of_its_accepted_steps_and_its_peer_speedup_divides_by_the_best(store):
    job_id = record_job(store, peers=PEERS)
    (job,) = status.jobs(store.conn)
    assert job["id"] == job_id and job["best_speedup"] == pytest.approx(2.0 / 1.0)
    assert job["speedup_vs_best_peer"] == pytest.approx(2.0 / 1.6)
    assert job["peers"] == PEERS
    assert (job["candidates"], job["gate_failures"], job["accepted"]) == (6, 3, 3)


@pytest.mark.parametrize(("peers", "expected"), [
    (None, None),                                                           # no peers measured
    ({"eager_ms": 1.0, "compile_speedup": None, "compile_max_autotune_speedup": None,
      "errors": {"compile": "no triton"}}, 3.0),                            # compile failed: eager is best
    ({"compile_speedup": 0.8, "compile_max_autotune_speedup": 0.9}, 3.0),    # eager beat both
    ({"compile_speedup": 1.5, "compile_max_autotune_speedup": 1.2}, 2.0),
    ({"compile_speedup": 1.2, "compile_max_autotune_speedup": 2.0}, 1.5),
    ({"compile_speedup": "fast"}, 3.0),                                      # malformed: ignored
])
def test_speedup_vs_best_peer(peers, expected):
    assert status.speedup_vs_best_peer(3.0, peers) == (pytest.approx(expected) if expected else None)
    assert status.speedup_vs_best_peer(None, peers) is None                 # no best: no ratio


def test_chain_speedup_is_unknown_without_steps_or_with_an_untimed_step():
    assert status.chain_speedup([1.5, 2.0]) == pytest.approx(3.0)
    assert status.chain_speedup([]) is None
    assert status.chain_speedup([1.5, None]) is None


def test_a_running_job_whose_foreground_process_died_is_interrupted(store):
    gone, alive = record_job(store, "gone", config={"foreground_pid": dead_pid()}), \
        record_job(store, "alive", config={"foreground_pid": os.getpid()})
    daemons = record_job(store, "daemons")
    paused = record_job(store, "paused", config={"foreground_pid": dead_pid()})
    store.interrupt_job(paused, "paused")
    states = {j["id"]: j["state"] for j in status.jobs(store.conn)}
    assert states == {gone: "interrupted", alive: "running", daemons: "running", paused: "paused"}


def test_a_job_handed_to_the_daemon_is_no_longer_its_dead_foreground_processes(store):
    job_id = record_job(store, config={"foreground_pid": dead_pid(), "proposers": ["tune"]})
    store.conn.execute("UPDATE candidates SET state = 'evaluating' WHERE id = (SELECT MAX(id) FROM candidates)")
    store.hand_over(job_id)
    store.start_job(job_id, "cpu")                                          # the daemon runs it
    assert status.jobs(store.conn)[0]["state"] == "running"
    assert json.loads(store.job(job_id)["config"]) == {"proposers": ["tune"]}
    assert store.conn.execute("SELECT COUNT(*) FROM candidates WHERE state = 'evaluating'").fetchone()[0] == 0


def test_the_daemon_is_up_only_while_it_beats_and_has_not_stopped():
    now = time.time()
    assert status.daemon_up(now - 1, "idle; 0 queued", now)
    assert not status.daemon_up(now - status.HEARTBEAT_STALE_S - 1, "idle; 0 queued", now)
    assert not status.daemon_up(now - 1, "stopped", now)
    assert not status.daemon_up(None, None, now)


def test_screened_configurations_are_listed_fastest_first_untimed_last(store):
    job_id = record_job(store)
    add_screened(store, job_id, [("timed", 0.9), ("spills", None), ("timed", 0.4), ("failed", None)])
    rows = status.screened(store.conn, job_id)
    assert [(r["status"], r["ms"]) for r in rows] == [("timed", 0.4), ("timed", 0.9), ("spills", None),
                                                      ("failed", None)]
    assert rows[0]["params"] == {"BLOCK": 192}
    assert status.screened_count(store.conn, job_id) == 4


def test_the_plan_and_peers_read_as_a_few_lines_and_partial_ones_do_not_break(store):
    lines = status.describe_plan(PLAN)
    assert lines[0] == ("memory plan: fits · device cuda:0 needs 12.0 of 150.0 GiB (148.0 free) · "
                        "host needs 3.0 of 128.0 GiB (sandbox limit 16.0)")
    assert lines[1] == "5 gate sets · 3 timing sets · oracle chunked · variants base, scaled, heavy · dropped heavy"
    assert lines[2].startswith("GiB: inputs 1.0 · outputs 0.5 · parameters 0 · oracle 3.0")
    refused = {"fits": False, "reason": "needs 212 GiB of GPU memory for the float64 oracle; the device has 140 GiB"}
    assert status.describe_plan(refused) == ["memory plan: does not fit", refused["reason"]]
    assert status.describe_plan({"gate_sets": "many", "bytes": {"inputs": "x"}}) == ["memory plan: planned"]
    assert status.describe_plan(None) == []
    assert status.describe_peers(PEERS) == ("eager 2 ms · compile 1.6 ms (×1.25 eager) · "
                                            "max-autotune 1.25 ms (×1.60 eager) · best max-autotune")
    assert status.describe_peers({"eager_ms": 0.5, "errors": {"compile": "InductorError: x"}}) == \
        "eager 0.5 ms · compile failed: InductorError: x"
    assert status.describe_peers(None) is None


def test_a_database_from_an_older_kernelab_reads_with_its_new_facts_absent(tmp_path):
    """A reader newer than the daemon: no node, peers or plan column, no screened table yet."""
    path = legacy_database(tmp_path / "old.db", version=3)
    writer = Store(sqlite3.connect(path))
    _, job_id = writer.add_problem(NewProblem("old", "/inbox/old.py", REF))  # type: ignore[misc]
    reader = connect(path, readonly=True)
    (job,) = status.jobs(reader)
    assert (job["state"], job["node"], job["peers"], job["speedup_vs_best_peer"]) == ("queued", None, None, None)
    assert status.job_facts(reader, job_id) == {"plan": None, "peers": None}
    assert status.screened(reader, job_id) == [] and status.screened_count(reader, job_id) == 0
