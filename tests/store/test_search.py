"""The search's records on a real SQLite file: screened rows, the tuning cache, ceilings."""

from __future__ import annotations

import pytest

from store import search
from store.db import connect
from store.records import NewProblem, Store

REF = "class Model: pass\ndef get_inputs(): return []\ndef get_init_inputs(): return []\n"


@pytest.fixture
def store(tmp_path) -> Store:
    return Store(connect(tmp_path / "kernelab.db"))


def job(store: Store, name: str = "p") -> int:
    return store.add_problem(NewProblem(name, f"/inbox/{name}.py", REF))[1]


def test_screened_rows_come_back_in_order_with_their_params_and_link(store):
    job_id = job(store)
    parent = store.add_candidate(job_id, proposer="start", source="x")
    ids = search.add_screened(store.conn, job_id, [
        {"parent_id": parent, "proposer": "tune", "params": {"B": 64, "w": 4}, "status": "timed", "ms": 0.5},
        {"parent_id": parent, "proposer": "tune", "params": {"B": 128, "w": 1}, "status": "spills",
         "registers": 255, "spills": 512, "detail": "spills under register pressure (512 B stack a thread)"}])
    child = store.add_candidate(job_id, proposer="tune", source="y", parent_id=parent)
    search.link_screened(store.conn, ids[0], child)
    rows = search.screened(store.conn, job_id)
    assert [r["id"] for r in rows] == ids
    assert rows[0]["params"] == {"B": 64, "w": 4} and rows[0]["candidate_id"] == child and rows[0]["ms"] == 0.5
    assert rows[1]["status"] == "spills" and rows[1]["ms"] is None and rows[1]["spills"] == 512
    assert search.screened(store.conn, job(store, "other")) == []


def test_an_unknown_status_is_refused_and_nothing_of_the_batch_is_kept(store):
    job_id = job(store)
    rows = [{"params": {"B": 1}, "proposer": "tune", "status": "timed", "ms": 1.0},
            {"params": {"B": 2}, "proposer": "tune", "status": "fast!"}]
    with pytest.raises(ValueError, match="fast!"):
        search.add_screened(store.conn, job_id, rows)
    assert search.screened(store.conn, job_id) == []


def entry(**kw):
    return {"device_name": "NVIDIA H200", "signature": "B,w@abc", "shapes": '{"n": 4096}',
            "params": {"B": 64, "w": 4}, "ms": 1.0, "job_id": 1, **kw}


def test_the_cache_keeps_the_fastest_but_a_jobs_own_later_incumbent_replaces_its_earlier(store):
    assert search.cache_best(store.conn, entry())
    assert not search.cache_best(store.conn, entry(params={"B": 32, "w": 4}, ms=2.0, job_id=2)), \
        "a slower configuration from another job does not replace a faster one"
    assert search.cache_best(store.conn, entry(params={"B": 128, "w": 8}, ms=0.8, job_id=2))
    assert search.cache_best(store.conn, entry(params={"B": 128, "w": 4}, ms=0.9, job_id=2)), \
        "the same job's newer incumbent won an A/B against its older one"
    (found,) = search.cached(store.conn, "NVIDIA H200", "B,w@abc", "B,w", '{"n": 4096}')
    assert found["params"] == {"B": 128, "w": 4} and found["exact"] and found["job_id"] == 2


def test_lookups_give_exact_matches_first_then_the_family_on_that_device_only(store):
    search.cache_best(store.conn, entry(signature="B,w@other", params={"B": 16, "w": 2}))
    search.cache_best(store.conn, entry(shapes='{"n": 1024}', params={"B": 32, "w": 2}))
    search.cache_best(store.conn, entry())
    search.cache_best(store.conn, entry(device_name="NVIDIA A100", params={"B": 256, "w": 8}))
    search.cache_best(store.conn, entry(signature="B,w,x@abc", params={"B": 8, "w": 1, "x": 0}))
    found = search.cached(store.conn, "NVIDIA H200", "B,w@abc", "B,w", '{"n": 4096}')
    assert [f["params"]["B"] for f in found] == [64, 32, 16]
    assert [f["exact"] for f in found] == [True, False, False]
    assert search.cached(store.conn, "NVIDIA L4", "B,w@abc", "B,w", '{"n": 4096}') == []


def test_family_names_are_matched_literally(store):
    """A tunable named with SQL's wildcard characters matches only itself."""
    search.cache_best(store.conn, entry(signature="BLOCKxM@abc"))
    assert search.cached(store.conn, "NVIDIA H200", "BLOCK_M@zzz", "BLOCK_M", "{}") == []


def test_ceilings_are_kept_under_their_key(store):
    assert search.ceilings(store.conn, "GPU-1|driver 570|clocks") is None
    search.keep_ceilings(store.conn, "GPU-1|driver 570|clocks", "NVIDIA H200", {"copy_gbps": 4000.0})
    assert search.ceilings(store.conn, "GPU-1|driver 570|clocks") == {"copy_gbps": 4000.0}
    assert search.ceilings(store.conn, "GPU-1|driver 575|clocks") is None
