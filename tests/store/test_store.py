"""The store on a real SQLite file: migrations, dedupe, atomic records, crash recovery."""

from __future__ import annotations

import json
import sqlite3

import pytest

from store.db import SCHEMA_VERSION, connect
from store.home import Home
from store.records import NewProblem, Store, post_command
from store.status import snapshot

REF = "class Model: pass\ndef get_inputs(): return []\ndef get_init_inputs(): return []\n"


@pytest.fixture
def store(tmp_path) -> Store:
    return Store(connect(tmp_path / "kernelab.db"))


def test_fresh_database_is_migrated_to_the_current_version_in_wal(tmp_path):
    conn = connect(tmp_path / "k.db")
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION >= 2
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    cols = {r[1] for r in conn.execute("PRAGMA table_info(jobs)")}
    assert "active_s" in cols


def test_problem_dedupe_by_content_and_revisions_by_name(store):
    first = store.add_problem(NewProblem("softmax", "/inbox/softmax.py", REF))
    assert first is not None
    assert store.add_problem(NewProblem("softmax", "/inbox/softmax.py", REF)) is None
    second = store.add_problem(NewProblem("softmax", "/inbox/softmax.py", REF + "# v2\n"))
    assert second is not None and second[1] != first[1]
    revisions = [r[0] for r in store.conn.execute("SELECT revision FROM problems ORDER BY id")]
    assert revisions == [1, 2]
    # A sidecar or a starting candidate makes a different revision too.
    assert store.add_problem(NewProblem("softmax", "/x", REF, sidecar="[sizes]\n")) is not None
    assert store.job(second[1])["kind"] == "port"


def test_invalid_problem_gets_an_invalid_job_with_its_error(store):
    bad = NewProblem("bad", "/inbox/bad.py", "def (", error="bad.py:1: syntax")
    _, jid = store.add_problem(bad)
    job = store.job(jid)
    assert (job["state"], job["error"]) == ("invalid", "bad.py:1: syntax")
    assert store.next_queued() is None


def test_queue_order_is_priority_then_age(store):
    ids = [store.add_problem(NewProblem(f"p{i}", "/x", REF + str(i)))[1] for i in range(3)]
    assert store.next_queued() == ids[0]
    store.update_job(ids[2], priority=5)
    assert store.next_queued() == ids[2]


def _result(speedup: float, blocks: int = 4) -> dict:
    return {"verdict": "pass", "speedup": speedup, "speedup_ci": [speedup * 0.9, speedup * 1.1],
            "candidate_ms": 1.0, "reference_ms": speedup, "faster_than_noise": True,
            "blocks": [{"side": "AB"[i % 2], "idx": i, "samples_ms": [1.0, 1.1], "median_ms": 1.05,
                        "clock": {"sm_clock_mhz": 1980, "clock_reasons": ["GpuIdle"]},
                        "throttled": False} for i in range(blocks)]}


def test_finish_candidate_records_blocks_and_incumbent_together(store):
    _, jid = store.add_problem(NewProblem("p", "/x", REF))
    cid = store.add_candidate(jid, proposer="start", source="s", params={"num_warps": 4})
    store.start_candidate(cid)
    store.finish_candidate(cid, _result(1.5), accepted=True)
    # Redoing an evaluation replaces its blocks rather than adding to them.
    store.finish_candidate(cid, _result(1.5, blocks=6), accepted=True)
    assert store.conn.execute("SELECT COUNT(*) FROM blocks").fetchone()[0] == 6
    row = store.conn.execute("SELECT sm_clock_mhz, clock_reasons FROM blocks LIMIT 1").fetchone()
    assert tuple(row) == (1980, "GpuIdle")
    assert store.job(jid)["best_candidate_id"] == cid
    assert json.loads(store.candidates(jid)[0]["params"]) == {"num_warps": 4}


def test_recover_requeues_running_jobs_and_redoes_only_the_in_flight_candidate(store):
    _, jid = store.add_problem(NewProblem("p", "/x", REF))
    store.start_job(jid, "cpu")
    done = store.add_candidate(jid, proposer="start", source="a")
    store.finish_candidate(done, _result(1.2), accepted=True)
    flying = store.add_candidate(jid, proposer="tune", source="b", parent_id=done)
    store.start_candidate(flying)
    assert store.recover() == [jid]
    states = {c["id"]: (c["state"], c["accepted"]) for c in store.candidates(jid)}
    assert states == {done: ("done", 1), flying: ("pending", 0)}
    assert store.job(jid)["state"] == "queued"


def test_a_candidate_in_flight_at_two_daemon_deaths_is_poison_and_never_evaluated_again(store):
    _, jid = store.add_problem(NewProblem("p", "/x", REF))
    flying = store.add_candidate(jid, proposer="start", source="import os; os.kill(...)")
    for death in range(2):
        store.start_job(jid, "cpu")
        store.start_candidate(flying)
        assert store.recover() == [jid], f"death {death + 1}"
    cand = store.conn.execute("SELECT * FROM candidates WHERE id = ?", (flying,)).fetchone()
    assert (cand["state"], cand["verdict"], cand["rule"], cand["crashes"]) == ("done", "fail", "hostile", 2)
    deaths = json.loads(cand["evidence"])["deaths"]
    assert len(deaths) == 2 and all("daemon stopped without shutting down" in d["cause"] for d in deaths)
    assert "never evaluated again" in cand["reason"]
    assert json.loads(cand["result"])["rule"] == "hostile"
    assert store.job(jid)["state"] == "queued", "the job goes on"
    kinds = [r[0] for r in store.conn.execute("SELECT kind FROM events WHERE job_id = ? ORDER BY id", (jid,))]
    assert kinds == ["candidate.crashed", "candidate.hostile"]


def test_a_death_outside_an_evaluation_counts_against_no_candidate(store):
    _, jid = store.add_problem(NewProblem("p", "/x", REF))
    done = store.add_candidate(jid, proposer="start", source="a")
    store.finish_candidate(done, _result(1.2), accepted=True)
    assert store.crashed(jid, "worker process died (killed by SIGKILL)") == []
    assert store.conn.execute("SELECT crashes FROM candidates").fetchone()[0] == 0


def test_readers_cannot_write_but_may_post_commands_through_a_writer(tmp_path, store):
    path = tmp_path / "kernelab.db"
    reader = connect(path, readonly=True)
    with pytest.raises(sqlite3.OperationalError):
        reader.execute("INSERT INTO events (ts, kind, message) VALUES (0, 'x', 'y')")
    cid = post_command(connect(path), "pause", 7)
    assert store.pending_commands() == [{"id": cid, "job_id": 7, "verb": "pause", "arg": None}]


def test_status_best_speedup_is_the_product_of_accepted_steps(tmp_path, store):
    home = Home(tmp_path)
    _, jid = store.add_problem(NewProblem("p", "/x", REF))
    a = store.add_candidate(jid, proposer="start", source="a")
    store.finish_candidate(a, _result(1.5), accepted=True)
    b = store.add_candidate(jid, proposer="tune", source="b", parent_id=a)
    store.finish_candidate(b, {"verdict": "fail", "rule": "nan"}, accepted=False)
    c = store.add_candidate(jid, proposer="tune", source="c", parent_id=a)
    store.finish_candidate(c, _result(1.2), accepted=True)
    (job,) = snapshot(store.conn, home)["jobs"]
    assert job["best_speedup"] == pytest.approx(1.8)
    assert (job["candidates"], job["gate_failures"], job["accepted"]) == (3, 1, 2)
    assert set(job) >= {"id", "problem", "state", "error", "candidates", "gate_failures",
                        "accepted", "best_speedup", "best_file"}
    assert job["best_file"] is None      # no results/p/best.py written


def test_heartbeat_keeps_the_start_time(store):
    store.heartbeat(1, "h", "0.1", "idle", started_at=100.0)
    store.heartbeat(1, "h", "0.1", "busy", started_at=None)
    row = store.conn.execute("SELECT started_at, status FROM daemon").fetchone()
    assert tuple(row) == (100.0, "busy")


def test_a_file_whose_schema_is_still_being_created_reads_as_no_database(tmp_path):
    """The writer creates the file, then the schema: a reader in between (``kernelab status``
    while the daemon starts) must see "no database yet", not a missing table."""
    import subprocess
    import sys

    from store.db import NotCreatedYet

    path = tmp_path / "home" / "kernelab.db"
    path.parent.mkdir()
    sqlite3.connect(path).close()                 # the file exists, user_version 0, no tables
    with pytest.raises(NotCreatedYet, match="no database yet"):
        connect(path, readonly=True)
    out = subprocess.run([sys.executable, "-m", "kernelabd", "status", "--json", "--home",
                          str(path.parent)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"jobs": [], "devices": []}


def test_a_job_records_the_node_of_the_device_it_starts_on(tmp_path, store):
    store.upsert_device("gpubox2/cuda:0", "NVIDIA H200", node="gpubox2")
    _, jid = store.add_problem(NewProblem("p", "/x", REF))
    store.start_job(jid, "gpubox2/cuda:0")
    snap = snapshot(store.conn, Home(tmp_path))
    (job,), (device,) = snap["jobs"], snap["devices"]
    assert (job["node"], job["device"]) == ("gpubox2", "gpubox2/cuda:0")
    assert (device["id"], device["node"], device["job"]) == ("gpubox2/cuda:0", "gpubox2", jid)
