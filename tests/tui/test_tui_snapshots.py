"""Snapshots (SVG) of the main screens on the fixed database, at 80×24 and larger.

Update them after an intended change with ``pytest tests/tui --snapshot-update`` and review
the SVGs in the diff.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable

from tests.tui import tuidb
from tests.tui.driving import make_app, settle


async def _loaded(pilot: Pilot[None]) -> None:
    """Until the screen's job series (chart, candidates) has loaded and the screen is steady.

    The series is fetched after the queue, so the workers can look idle in between; and a
    table sizes its columns on a later idle event, so a loaded machine could otherwise
    photograph a half-laid-out screen."""
    deadline = time.monotonic() + 30
    while getattr(pilot.app.screen, "series", None) is None:
        if time.monotonic() > deadline:
            raise AssertionError("the screen's job series did not load within 30 s")
        await settle(pilot)
        await pilot.pause(0.05)
    await steady(pilot)


async def steady(pilot: Pilot[None], timeout: float = 30.0) -> None:
    """Until two screenshots a few poll periods apart are identical, workers idle between, and
    no table still owes its column sizing (done on an idle event, which a loaded machine can
    delay past two identical screenshots)."""
    app = pilot.app
    gap = 3 * getattr(app, "poll_s", 0.25)
    deadline = time.monotonic() + timeout
    await settle(pilot)
    before = app.export_screenshot()
    while True:
        await pilot.pause(gap)
        await settle(pilot)
        after = app.export_screenshot()
        if after == before and not _tables_pending(pilot):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"the screen kept changing for {timeout} s")
        before = after


def _tables_pending(pilot: Pilot[None]) -> bool:
    """A DataTable sizes its columns to new or updated cells on its next idle event."""
    return any(getattr(t, "_require_update_dimensions", False) or getattr(t, "_updated_cells", None)
               for t in pilot.app.screen.query(DataTable))


@pytest.mark.parametrize("size", [(80, 24), (140, 40)])
def test_dashboard(snap_compare, db_path: Path, size: tuple[int, int]) -> None:
    assert snap_compare(make_app(db_path), terminal_size=size, run_before=_loaded)


def test_dashboard_with_kernelbench_names(snap_compare, db_path: Path) -> None:
    """KernelBench's names (up to 60 characters) in a 140-column terminal: shortened in the
    middle, every column of the queue in view."""
    tuidb.add_kernelbench_jobs(db_path)
    assert snap_compare(make_app(db_path), terminal_size=(140, 40), run_before=_loaded)


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


@pytest.mark.parametrize("tab", ["1", "2", "3", "4", "5", "6", "8"])
def test_job_detail(snap_compare, db_path: Path, tab: str) -> None:
    async def open_detail(pilot: Pilot[None]) -> None:
        await _loaded(pilot)
        await pilot.press("j", "enter")
        await _loaded(pilot)
        await pilot.press(tab)
        await steady(pilot)

    assert snap_compare(make_app(db_path), terminal_size=(120, 36), run_before=open_detail)


def test_help(snap_compare, db_path: Path) -> None:
    async def open_help(pilot: Pilot[None]) -> None:
        await _loaded(pilot)
        await pilot.press("question_mark")
        await steady(pilot)

    assert snap_compare(make_app(db_path), terminal_size=(80, 24), run_before=open_help)


def test_cancel_confirmation(snap_compare, db_path: Path) -> None:
    async def ask(pilot: Pilot[None]) -> None:
        await _loaded(pilot)
        await pilot.press("c")
        await steady(pilot)

    assert snap_compare(make_app(db_path), terminal_size=(80, 24), run_before=ask)
