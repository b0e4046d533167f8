"""Tables show their columns at the width of what they hold, even when a frame is drawn between
the rows' arrival and the idle event on which the table sizes its columns (a busy machine, or a
layout change elsewhere on the screen composited first)."""

from __future__ import annotations

from pathlib import Path

from textual.app import App, ComposeResult
from textual.pilot import Pilot
from textual.widgets import DataTable

from tests.tui.driving import make_app, settle
from tui.data import Candidate
from tui.screens.detail import JobDetail
from tui.widgets.failures import FailuresTable
from tui.widgets.table import Table

FAILURE = Candidate(
    id=15, ordinal=3, parent_id=14, proposer="agent", language="triton", edit="rewrite: welford",
    state="done", verdict="fail", rule="inputs_modified", reason=None,
    evidence='{"index": [7, 7], "input_set": 0}', max_rel_error=None, tolerance=None,
    candidate_ms=None, speedup=None, speedup_lo=None, speedup_hi=None, faster_than_noise=None,
    accepted=False, created_at=0.0)


class OneTable(App[None]):
    CSS = "DataTable { height: 5; }"      # a fixed height, as the dashboard gives its tables

    def __init__(self, table: DataTable[object]) -> None:
        super().__init__()
        self.table = table

    def compose(self) -> ComposeResult:
        yield self.table


async def _sized(pilot: Pilot[None], table: DataTable[object]) -> None:
    while table._require_update_dimensions or table._updated_cells:
        await pilot.pause()
    await pilot.pause()


async def test_failures_drawn_before_their_sizing_are_redrawn_at_full_width() -> None:
    app = OneTable(FailuresTable())
    async with app.run_test(size=(80, 7)) as pilot:
        table = app.table
        await pilot.pause()
        table.show((FAILURE,))
        app.export_screenshot()                       # a frame drawn before the table's idle
        assert "inputs_modified" not in table.render_line(1).text      # not sized yet
        await _sized(pilot, table)
        assert table.render_line(0).text.split() == ["cand", "rule", "evidence", "edit"]
        assert table.render_line(1).text.split() == [
            "15", "inputs_modified", "at", "[7,", "7],", "input", "set", "0", "rewrite:", "welford"]


async def test_updated_cells_drawn_before_their_sizing_are_redrawn_at_full_width() -> None:
    table: Table[str] = Table()
    app = OneTable(table)
    async with app.run_test(size=(80, 7)) as pilot:
        await pilot.pause()
        table.add_column("state", key="state")
        table.add_row("done", key="1")
        await _sized(pilot, table)
        table.update_cell("1", "state", "interrupted", update_width=True)
        app.export_screenshot()
        await _sized(pilot, table)
        assert table.render_line(1).text.split() == ["interrupted"]


async def test_every_table_of_the_tui_is_a_table(db_path: Path) -> None:
    """The fix lives in ``Table``: a plain ``DataTable`` would bring the stale lines back."""
    app = make_app(db_path)
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        tables = list(app.screen.query(DataTable))
        app.push_screen(JobDetail(2))
        await settle(pilot)
        tables += list(app.screen.query(DataTable))
        assert len(tables) >= 5
        assert [type(t).__name__ for t in tables if not isinstance(t, Table)] == []

