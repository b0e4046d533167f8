"""What the TUI shows of a job beyond its candidates: KernelBench's long names with every queue
column in view, interrupted foreground jobs, peers, the memory plan and screened configurations,
and a database from an older kernelab that has none of them."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from textual.widgets import DataTable

from store import connect
from store.records import Store
from tests.store.recorded import dead_pid, legacy_database, record_job
from tests.tui import tuidb
from tests.tui.driving import make_app, settle, until
from tui.screens.detail import JobDetail
from tui.widgets.queue import JobTable
from tui.widgets.status import StatusBar


async def open_detail(pilot, job_id: int) -> JobDetail:
    table = pilot.app.screen.query_one(JobTable)
    await until(pilot, lambda: job_id in [j.id for j in table._rows], f"job {job_id} in the queue")
    table.move_cursor(row=[j.id for j in table._rows].index(job_id))
    await pilot.press("enter")
    await until(pilot, lambda: isinstance(pilot.app.screen, JobDetail) and pilot.app.screen.series is not None,
                f"job {job_id}'s detail")
    return pilot.app.screen


def text(screen, selector: str) -> str:
    return str(screen.query_one(selector).render())


async def test_every_queue_column_stays_in_view_with_kernelbench_names(db_path: Path) -> None:
    ids = tuidb.add_kernelbench_jobs(db_path)
    app = make_app(db_path)
    async with app.run_test(size=(140, 40)) as pilot:
        table = app.screen.query_one(JobTable)
        await until(pilot, lambda: table.row_count == 6 + len(ids), "every job in the queue")
        assert table.virtual_size.width <= table.scrollable_content_region.width
        assert [str(c.label) for c in table.columns.values()][-5:] == ["×ref", "×peer", "dev", "pri", "kind"]
        shown = {table.get_row(str(i))[1] for i in ids}
        longest = max(tuidb.KERNELBENCH, key=len)
        assert longest not in shown and any(s.startswith("44_ConvTranspose") and s.endswith("_Mean") and "…" in s
                                            for s in shown)
        assert "23_Softmax" in shown                                   # a short name stays whole
        detail = await open_detail(pilot, ids[-1])
        assert longest in text(detail, "#summary")


async def test_an_interrupted_foreground_job_is_shown_and_can_be_resumed(db_path: Path) -> None:
    conn = connect(db_path)
    with conn:
        conn.execute("UPDATE jobs SET config = ? WHERE id = 2", (json.dumps({"foreground_pid": dead_pid()}),))
    conn.close()
    app = make_app(db_path)
    async with app.run_test(size=(100, 30)) as pilot:
        table = app.screen.query_one(JobTable)
        await until(pilot, lambda: table.row_count, "the queue")
        assert str(table.get_row("2")[2]) == "interrupted"
        assert "1 running · 1 interrupted" in str(app.screen.query_one(StatusBar).render())
        table.move_cursor(row=[j.id for j in table._rows].index(2))
        await pilot.press("r")
        await settle(pilot)
    rows = connect(db_path, readonly=True).execute("SELECT verb, job_id FROM commands").fetchall()
    assert [tuple(r) for r in rows] == [("resume", 2)]


async def test_the_detail_shows_peers_the_plan_and_the_screened_configurations_by_time(db_path: Path) -> None:
    app = make_app(db_path)
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(pilot)
        detail = await open_detail(pilot, 1)
        summary = text(detail, "#summary")
        assert "best 0.331 ms (×1.27 reference, ×1.06 best peer)" in summary
        assert "peers: eager 0.42 ms · compile 0.362 ms (×1.16 eager) · max-autotune 0.35 ms" in summary
        assert "memory plan: fits · device cuda:0 needs 6.0 of 139.7 GiB" in summary
        await pilot.press("8")
        await settle(pilot)
        screened = detail.query_one("#screened-table", DataTable)
        rows = [screened.get_row_at(i) for i in range(screened.row_count)]
        assert [r[2] for r in rows] == ["0.371", "0.398", "0.452", "–", "–", "–"]
        assert [str(r[1]) for r in rows] == ["timed", "timed", "timed", "spills", "too_big", "failed"]
        assert rows[0][5] == "#9" and "never a result" in text(detail, "#screened-note")


async def test_a_database_from_an_older_kernelab_shows_its_jobs_without_the_new_facts(tmp_path: Path) -> None:
    path = legacy_database(tmp_path / "kernelab.db", version=5)   # before peers, plans and screening
    writer = Store(sqlite3.connect(path))
    writer.conn.row_factory = sqlite3.Row
    job_id = record_job(writer)
    writer.conn.close()
    app = make_app(path)
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        detail = await open_detail(pilot, job_id)
        summary = text(detail, "#summary")
        assert "×2.00 reference" in summary and "peer" not in summary and "memory plan" not in summary
        await pilot.press("8")
        await settle(pilot)
        assert text(detail, "#screened-note") == "No configuration screened in this job."
