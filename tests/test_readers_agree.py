"""A number a user sees is the same wherever they read it: a job's speedup over the reference and
over the best peer, in ``kernelab status --json``, in ``results/NAME/report.json`` and on the
TUI's queue and job detail."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kernelabd.service.reports import write_results
from store.db import connect
from store.home import Home
from store.records import Store
from tests.store.recorded import PEERS, record_job
from tests.tui.driving import until
from tui.app import KernelabApp
from tui.screens.detail import JobDetail
from tui.widgets.queue import COLUMNS, JobTable

ROOT = Path(__file__).resolve().parents[1]


def status_json(home: Home) -> dict[int, dict]:
    out = subprocess.run([sys.executable, "-m", "kernelabd", "status", "--json", "--home", str(home.root)],
                         capture_output=True, text=True, check=True, cwd=ROOT, timeout=60).stdout
    return {j["id"]: j for j in json.loads(out)["jobs"]}


async def tui_view(db: Path, job_id: int) -> tuple[dict[str, str], str, tuple[float | None, float | None]]:
    """The job's queue cells by column, its detail summary, and the numbers behind them."""
    app = KernelabApp(db)
    async with app.run_test(size=(140, 40)) as pilot:
        table = app.screen.query_one(JobTable)
        await until(pilot, lambda: table.row_count, "the queue")
        cells = {key: str(cell) for (_, key), cell in zip(COLUMNS, table.get_row(str(job_id)), strict=True)}
        job = next(j for j in app.screen.overview.jobs if j.id == job_id)   # type: ignore[attr-defined]
        detail = JobDetail(job_id)
        app.push_screen(detail)
        await until(pilot, lambda: detail.series is not None, "the job detail")
        summary = str(detail.query_one("#summary").render())
    return cells, summary, (job.speedup, job.speedup_vs_best_peer)


@pytest.mark.parametrize("peers", [PEERS, None], ids=["with peers", "without peers"])
def test_speedups_agree_in_status_report_and_tui(tmp_path: Path, peers: dict | None) -> None:
    home = Home(tmp_path / "home")
    store = Store(connect(home.db))
    job_id = record_job(store, peers=peers, accepted_ms=(2.2, 1.7, 1.3), drift=1.05)
    write_results(store, home, job_id)
    store.conn.close()

    row = status_json(home)[job_id]
    report = json.loads((home.results / "softmax" / "report.json").read_text())
    cells, summary, numbers = asyncio.run(tui_view(home.db, job_id))

    speedup, versus_peer = row["best_speedup"], row["speedup_vs_best_peer"]
    assert speedup == pytest.approx(2.0 / 1.3 * 1.05 ** 3)      # the A/B steps', not 2.0 / 1.3
    assert report["best"]["speedup_vs_reference"] == speedup
    assert report["speedup_vs_best_peer"] == versus_peer
    assert numbers == (speedup, versus_peer)
    assert cells["speedup"] == f"{speedup:.2f}" and f"×{speedup:.2f} reference" in summary
    if peers is None:
        assert versus_peer is None and cells["peer"] == "–" and "best peer" not in summary
    else:
        assert versus_peer == pytest.approx(speedup / 1.6)
        assert cells["peer"] == f"{versus_peer:.2f}" and f"×{versus_peer:.2f} best peer" in summary
