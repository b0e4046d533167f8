"""Pilot tests: every screen and every key binding, against the fixed database file."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from textual.widgets import DataTable, Input, TabbedContent

from store import connect
from tests.tui import tuidb
from tests.tui.driving import make_app, settle
from tui.screens.confirm import ConfirmScreen
from tui.screens.dashboard import Dashboard
from tui.screens.detail import CandidateTable, JobDetail
from tui.screens.help import HelpScreen
from tui.widgets.convergence import ConvergenceChart
from tui.widgets.devices import DeviceRow
from tui.widgets.failures import FailuresTable
from tui.widgets.queue import JobTable
from tui.widgets.status import StatusBar


def commands(db_path: Path) -> list[tuple[object, ...]]:
    conn = connect(db_path, readonly=True)
    rows = conn.execute("SELECT verb, job_id, arg, source, status FROM commands ORDER BY id")
    return [tuple(r) for r in rows]


def status(app: object) -> str:
    return str(app.screen.query_one(StatusBar).render())  # type: ignore[attr-defined]


async def test_dashboard_shows_devices_queue_chart_and_failures(db_path: Path) -> None:
    app = make_app(db_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, Dashboard)
        assert len(screen.query(DeviceRow)) == 2
        table = screen.query_one(JobTable)
        assert table.row_count == 6
        assert table.selected_job_id == 2          # sorted by state: running, higher priority
        assert screen.query_one(ConvergenceChart).border_title == "convergence · layernorm #2"
        assert screen.query_one(FailuresTable).row_count == 1
        text = status(app)
        assert "daemon up (gpubox)" in text and "controls on" in text
        assert "2 running · 1 queued · 1 paused" in text


async def test_arrow_and_vim_keys_move_the_selection_and_the_chart_follows(
        db_path: Path) -> None:
    app = make_app(db_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        table = app.screen.query_one(JobTable)
        await pilot.press("j")
        await settle(pilot)
        assert table.selected_job_id == 1
        assert app.screen.query_one(ConvergenceChart).border_title.endswith("softmax #1")
        assert app.screen.query_one(FailuresTable).row_count == 4
        await pilot.press("down", "down")
        assert table.selected_job_id == 3
        await pilot.press("up", "k")
        assert table.selected_job_id == 1
        await pilot.press("G")
        assert table.selected_job_id == 5
        await pilot.press("g")
        assert table.selected_job_id == 2


async def test_slash_filters_and_escape_clears(db_path: Path) -> None:
    app = make_app(db_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("slash")
        field = app.screen.query_one("#filter", Input)
        assert field.display and field.has_focus
        await pilot.press(*"softmax")
        assert app.screen.query_one(JobTable).row_count == 1
        await pilot.press("enter")
        assert app.screen.query_one(JobTable).has_focus
        assert app.screen.query_one("#queue").border_subtitle == "/softmax"
        await pilot.press("escape")
        assert app.screen.query_one(JobTable).row_count == 6
        assert not field.display


async def test_s_cycles_the_sort_order(db_path: Path) -> None:
    app = make_app(db_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        table = app.screen.query_one(JobTable)
        await pilot.press("s")          # priority
        assert table.get_row_at(0)[1] == "matmul_bias"
        await pilot.press("s")          # id, newest first
        assert table.get_row_at(0)[1] == "conv_bad"
        assert "sort id" in str(app.screen.query_one("#queue").border_title)


async def test_enter_opens_job_detail_and_number_keys_switch_tabs(db_path: Path) -> None:
    app = make_app(db_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        await pilot.press("j", "enter")
        await settle(pilot)
        detail = app.screen
        assert isinstance(detail, JobDetail) and detail.job_id == 1
        candidates = detail.query_one(CandidateTable)
        assert candidates.row_count == 12
        assert candidates.selected_id == 12                # the newest candidate
        assert detail.view is not None
        assert [c.id for c in detail.view.lineage] == [12, 9, 5, 2, 1]
        assert "rewrite: persistent rows" in detail.view.source
        assert "+# rewrite: persistent rows" in detail.view.diff
        tabs = detail.query_one(TabbedContent)
        for key, tab in zip("23451", ("diff", "timing", "clock", "gate", "source"), strict=True):
            await pilot.press(key)
            assert tabs.active == tab
        assert detail.query_one("#blocks", DataTable).row_count == 8
        await pilot.press("k", "k")                         # candidate 10: a gate failure
        await settle(pilot)
        assert detail.view.candidate.id == 10
        assert "input set 1" in str(detail.query_one("#gate-text").render())
        await pilot.press("h")
        assert isinstance(app.screen, Dashboard)


async def test_question_mark_opens_help_and_escape_closes_it(db_path: Path) -> None:
    app = make_app(db_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("question_mark")
        assert isinstance(app.screen, Dashboard)
        await pilot.press("question_mark", "escape")
        assert isinstance(app.screen, Dashboard)


async def test_q_quits(db_path: Path) -> None:
    app = make_app(db_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("q")
        await pilot.pause()
        assert not app.is_running


async def test_controls_write_commands(db_path: Path) -> None:
    app = make_app(db_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)                    # layernorm (2), running, priority 1
        await pilot.press("p", "plus", "minus")
        await settle(pilot)
        await pilot.press("j", "j")            # gelu (4), paused
        await pilot.press("r")
        await settle(pilot)
        await pilot.press("G")                 # rmsnorm (5), done: nothing to resume
        await pilot.press("r")
        await settle(pilot)
        await pilot.press("k")                 # conv_bad (6), invalid
        await pilot.press("R")
        await settle(pilot)
    assert commands(db_path) == [
        ("pause", 2, None, "tui", "pending"),
        ("priority", 2, "2", "tui", "pending"),
        ("priority", 2, "0", "tui", "pending"),
        ("resume", 4, None, "tui", "pending"),
        ("retry", 6, None, "tui", "pending"),
    ]


async def test_cancel_asks_first(db_path: Path) -> None:
    app = make_app(db_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("c")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")
        assert isinstance(app.screen, Dashboard)
        await settle(pilot)
        assert commands(db_path) == []
        await pilot.press("c", "y")
        await settle(pilot)
    assert commands(db_path) == [("cancel", 2, None, "tui", "pending")]


async def test_controls_from_the_detail_screen(db_path: Path) -> None:
    app = make_app(db_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        await pilot.press("enter")
        await settle(pilot)
        await pilot.press("p", "c", "y")
        await settle(pilot)
    assert commands(db_path) == [("pause", 2, None, "tui", "pending"),
                                 ("cancel", 2, None, "tui", "pending")]


async def test_a_write_reaches_the_screen_within_a_second(
        db_path: Path, writer: sqlite3.Connection) -> None:
    app = make_app(db_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        await pilot.press("j")
        await settle(pilot)
        failures = app.screen.query_one(FailuresTable)
        assert failures.row_count == 4
        with writer:
            tuidb.add_candidate(writer, 1, edit="live probe", verdict="fail", ms=None,
                                rule="max_rel_error", evidence={"max_rel_error": 0.5})
        written = time.monotonic()
        while failures.row_count == 4 and time.monotonic() - written < 2.0:
            await pilot.pause(0.05)
        assert failures.row_count == 5
        assert time.monotonic() - written < 1.0
        assert app.screen.query_one(JobTable).get_row_at(1)[3] == "13"


async def test_an_idle_database_causes_no_reload(db_path: Path) -> None:
    app = make_app(db_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        generation = app.generation
        await pilot.pause(1.0)
        assert app.generation == generation


async def test_a_poll_during_shutdown_is_harmless(db_path: Path) -> None:
    """Textual closes the screens before it stops the app's timers, so a poll can land on an
    empty screen stack; it used to raise ScreenStackError and crash the exiting app."""
    app = make_app(db_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
    assert app.screen_stack == []
    try:
        app._poll()
    finally:
        app.reader.close()


async def test_missing_database_is_explained_then_picked_up(tmp_path: Path) -> None:
    path = tmp_path / "kernelab.db"
    app = make_app(path)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert "no database yet" in status(app)
        assert "controls off" in status(app)
        tuidb.build(path)
        await pilot.pause(0.6)
        await settle(pilot)
        assert app.screen.query_one(JobTable).row_count == 6
        assert "no database yet" not in status(app)
