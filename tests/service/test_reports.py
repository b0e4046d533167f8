"""``results/NAME/report.json`` and ``report.md`` from a real store: the new facts (peers, the
memory plan, screened configurations, per-stage wall times) where a job recorded them, and
nothing of them, without a crash, where it did not (older and CPU jobs)."""

from __future__ import annotations

import json

import pytest

from kernelabd.service.reports import write_results
from store.db import connect
from store.home import Home
from store.records import Store
from tests.store.recorded import PEERS, PLAN, add_screened, record_job


@pytest.fixture
def home(tmp_path) -> Home:
    return Home(tmp_path / "home")


@pytest.fixture
def store(home) -> Store:
    return Store(connect(home.db))


def report(home: Home, name: str) -> tuple[dict, str]:
    folder = home.results / name
    return json.loads((folder / "report.json").read_text()), (folder / "report.md").read_text()


def test_report_carries_peers_plan_screened_and_stages(home, store):
    job_id = record_job(store, peers=PEERS, plan=PLAN)
    add_screened(store, job_id, [("timed", 0.9), ("spills", None), ("timed", 0.4)])
    write_results(store, home, job_id)
    data, md = report(home, "softmax")
    assert data["peers"] == PEERS and data["plan"] == PLAN
    assert data["best"]["speedup_vs_reference"] == pytest.approx(2.0)
    assert data["speedup_vs_best_peer"] == pytest.approx(2.0 / 1.6)
    assert (data["candidates"], data["screened"]) == (6, 3)
    first, failed = data["stages"][:2]
    assert first["seconds"] == {"sandbox_start": 0.5, "reference": 2.0, "gate": 1.0, "timing": 4.0}
    assert list(first["seconds"]) == ["sandbox_start", "reference", "gate", "timing"]   # in the order they run
    assert (failed["verdict"], failed["seconds"]) == ("fail", {"gate": 0.5})
    assert len(data["stages"]) == 6
    assert data["stages_median"] == {"sandbox_start": 0.5, "reference": 0.0, "gate": 0.75, "timing": 4.0}
    assert "**2.000×** the reference, **1.250×** the best peer (max-autotune)" in md
    assert "- Peers (what the user already has, timed in interleaved A/B): eager 2 ms" in md
    assert "- Memory plan: fits · device cuda:0 needs 12.0 of 150.0 GiB" in md
    assert "  - 5 gate sets · 3 timing sets · oracle chunked" in md
    assert "3 configurations screened" in md and "never a result" in md
    assert "## Time per evaluation" in md and "| sandbox start | reference | gate | timing |" in md


def test_a_job_without_the_new_facts_reports_them_absent(home, store):
    job_id = record_job(store, "cpu_job")
    store.conn.execute("UPDATE candidates SET result = NULL")
    store.conn.commit()
    write_results(store, home, job_id)
    data, md = report(home, "cpu_job")
    assert (data["peers"], data["plan"], data["speedup_vs_best_peer"]) == (None, None, None)
    assert (data["screened"], data["stages"], data["stages_median"]) == (0, [], {})
    assert data["best"]["speedup_vs_reference"] == pytest.approx(2.0)
    assert "best peer" not in md and "Peers" not in md and "Memory plan" not in md
    assert "screened" not in md and "Time per evaluation" not in md


def test_a_refused_plan_is_reported_with_its_reason(home, store):
    refused = {**PLAN, "fits": False, "reason": "needs 212 GiB of GPU memory for the float64 oracle; "
                                                "the device has 140 GiB"}
    job_id = record_job(store, "big", accepted_ms=(), plan=refused)
    store.end_job(job_id, "invalid", error=refused["reason"])
    write_results(store, home, job_id)
    data, md = report(home, "big")
    assert data["plan"]["fits"] is False and data["best"] is None
    assert "- Memory plan: does not fit" in md and f"  - {refused['reason']}" in md
