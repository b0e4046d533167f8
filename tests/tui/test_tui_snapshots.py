"""Snapshots (SVG) of the main screens on the fixed database, at 80×24 and larger.

Update them after an intended change with ``pytest tests/tui --snapshot-update`` and review
the SVGs in the diff.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from conftest import make_app, settle
from textual.pilot import Pilot
from textual.widgets import DataTable


async def _loaded(pilot: Pilot[None]) -> None:
    """Until the screen's job series (chart, candidates) has loaded: it is fetched after the
    queue, so the workers can look idle for a moment in between."""
    deadline = time.monotonic() + 30
    while getattr(pilot.app.screen, "series", None) is None:
        if time.monotonic() > deadline:
            raise AssertionError("the screen's job series did not load within 30 s")
        await settle(pilot)
        await pilot.pause(0.05)
    settled = time.monotonic() + 3
    while _tables_pending(pilot) and time.monotonic() < settled:
        await pilot.pause(0.05)


def _tables_pending(pilot: Pilot[None]) -> bool:
    """A DataTable sizes its columns to new rows on its next idle event; on a loaded machine
    a snapshot can come first (columns as wide as their labels only)."""
    return any(getattr(t, "_require_update_dimensions", False) for t in pilot.app.screen.query(DataTable))


@pytest.mark.parametrize("size", [(80, 24), (140, 40)])
def test_dashboard(snap_compare, db_path: Path, size: tuple[int, int]) -> None:
    assert snap_compare(make_app(db_path), terminal_size=size, run_before=_loaded)


def test_dashboard_softmax_selected(snap_compare, db_path: Path) -> None:
    async def select(pilot: Pilot[None]) -> None:
        await settle(pilot)
        await pilot.press("j")
        for _ in range(100):                    # until the chart shows the new selection
            await settle(pilot)
            series = pilot.app.screen.series    # type: ignore[attr-defined]
            if series is not None and series.job.id == 1:
                break
        await _loaded(pilot)

    assert snap_compare(make_app(db_path), terminal_size=(120, 36), run_before=select)


def test_dashboard_no_color(snap_compare, db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    assert snap_compare(make_app(db_path), terminal_size=(80, 24), run_before=_loaded)


@pytest.mark.parametrize("tab", ["1", "2", "3", "4", "5"])
def test_job_detail(snap_compare, db_path: Path, tab: str) -> None:
    async def open_detail(pilot: Pilot[None]) -> None:
        await _loaded(pilot)
        await pilot.press("j", "enter")
        await _loaded(pilot)
        await pilot.press(tab)
        await settle(pilot)

    assert snap_compare(make_app(db_path), terminal_size=(120, 36), run_before=open_detail)


def test_help(snap_compare, db_path: Path) -> None:
    async def open_help(pilot: Pilot[None]) -> None:
        await _loaded(pilot)
        await pilot.press("question_mark")
        await settle(pilot)

    assert snap_compare(make_app(db_path), terminal_size=(80, 24), run_before=open_help)


def test_cancel_confirmation(snap_compare, db_path: Path) -> None:
    async def ask(pilot: Pilot[None]) -> None:
        await _loaded(pilot)
        await pilot.press("c")
        await settle(pilot)

    assert snap_compare(make_app(db_path), terminal_size=(80, 24), run_before=ask)
