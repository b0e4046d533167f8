"""The dashboard: devices, the queue, and the selected job's convergence and gate failures."""

from __future__ import annotations

from typing import ClassVar

from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Footer, Input

from tui.data import (
    SORT_KEYS,
    Job,
    JobSeries,
    Overview,
    filter_jobs,
    load_overview,
    load_series,
    sort_jobs,
)
from tui.messages import DataChanged
from tui.screens.controls import CONTROL_BINDINGS, JobControls
from tui.widgets.convergence import ConvergenceChart
from tui.widgets.devices import DevicesPanel
from tui.widgets.failures import FailuresTable
from tui.widgets.queue import JobTable
from tui.widgets.status import StatusBar

CHART_MIN = 44
"""Columns the convergence chart keeps when the queue would like more (the queue never takes
less than ``QUEUE_SHARE`` of the screen)."""

QUEUE_SHARE = 0.45


class Dashboard(JobControls):
    """Loads in a worker thread, applies on the UI thread, redraws what changed."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "open", "Open"),
        Binding("slash", "filter", "Filter"),
        Binding("s", "sort", "Sort"),
        *CONTROL_BINDINGS,
    ]

    def __init__(self) -> None:
        super().__init__(id="dashboard")
        self.overview: Overview | None = None
        self.series: JobSeries | None = None
        self.sort_key = SORT_KEYS[0]
        self.filter_text = ""
        self._generation = -1

    def compose(self) -> ComposeResult:
        yield StatusBar(id="status")
        yield DevicesPanel(id="devices")
        with Horizontal(id="middle"):
            with Vertical(id="queue"):
                yield Input(placeholder="filter: words in name, state, device…", id="filter")
                yield JobTable(id="jobs")
            yield ConvergenceChart(id="chart")
        yield FailuresTable(id="failures")
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        self._title_queue()
        self.query_one(JobTable).focus()

    def on_screen_resume(self) -> None:
        if self._generation != self.kapp.generation:
            self.reload()

    @on(DataChanged)
    def reload(self) -> None:
        """Read the overview and the selected job's series off the UI thread."""
        self._generation = self.kapp.generation
        selected = self.query_one(JobTable).selected_job_id
        self.kapp.load(self, lambda c: (load_overview(c),
                                        None if selected is None else load_series(c, selected)),
                       self._apply)

    async def _apply(self, result: tuple[Overview, JobSeries | None] | None) -> None:
        if result is not None:
            self.overview, series = result
            await self.query_one(DevicesPanel).show(self.overview.devices)
            self._show_jobs()
            if series is None and self.query_one(JobTable).selected_job_id is not None:
                # The table had no rows when this load started (first load): fetch the chart
                # of the row the cursor now sits on, without waiting for a highlight event
                # that an unchanged cursor position may never send.
                self._load_selected()
            else:
                self._show_series(series)
        self.refresh_status()

    def refresh_status(self) -> None:
        """Re-evaluated on every poll too, so a daemon that stopped writing shows as down."""
        kapp = self.kapp
        self.query_one(StatusBar).show(kapp.status_line(self.overview))

    def _show_jobs(self) -> None:
        jobs = self.overview.jobs if self.overview else ()
        self.query_one(JobTable).show(sort_jobs(filter_jobs(jobs, self.filter_text),
                                                self.sort_key))
        self._size_queue()
        self._title_queue()

    def on_resize(self, _event: events.Resize) -> None:
        self._size_queue()

    def _size_queue(self) -> None:
        """Give the queue the width its names need whole, as far as the chart can spare it, so
        that every column stays in view; the table shortens the names to what it gets."""
        width = self.size.width
        wanted = self.query_one(JobTable).full_width() + 2          # the queue's border
        share = min(wanted, max(int(width * QUEUE_SHARE), width - CHART_MIN))
        queue = self.query_one("#queue")
        if queue.styles.width is None or queue.styles.width.value != share:
            queue.styles.width = share

    def _title_queue(self) -> None:
        queue = self.query_one("#queue")
        queue.border_title = f"queue · sort {self.sort_key}"
        queue.border_subtitle = f"/{self.filter_text}" if self.filter_text else ""

    def _show_series(self, series: JobSeries | None) -> None:
        selected = self.query_one(JobTable).selected_job_id
        if series is not None and series.job.id != selected:
            self._load_selected()
            return
        self.series = series
        self.query_one(ConvergenceChart).show(series)
        self.query_one(FailuresTable).show(series.failures if series else ())

    def _load_selected(self) -> None:
        selected = self.query_one(JobTable).selected_job_id
        if selected is None:
            self._show_series(None)
            return
        self.kapp.load(self, lambda c: load_series(c, selected), self._apply_series)

    def _apply_series(self, series: JobSeries | None) -> None:
        self._show_series(series)

    @on(DataTable.RowHighlighted, "#jobs")
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        selected = self.query_one(JobTable).selected_job_id
        if self.series is None or self.series.job.id != selected:
            self._load_selected()

    @on(DataTable.RowSelected, "#jobs")
    def _selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_open()

    def current_job(self) -> Job | None:
        selected = self.query_one(JobTable).selected_job_id
        jobs = self.overview.jobs if self.overview else ()
        return next((j for j in jobs if j.id == selected), None)

    def action_open(self) -> None:
        from tui.screens.detail import JobDetail

        job = self.current_job()
        if job is not None:
            self.app.push_screen(JobDetail(job.id))

    def action_sort(self) -> None:
        self.sort_key = SORT_KEYS[(SORT_KEYS.index(self.sort_key) + 1) % len(SORT_KEYS)]
        self._show_jobs()

    def action_filter(self) -> None:
        field = self.query_one("#filter", Input)
        field.display = True
        field.focus()

    @on(Input.Changed, "#filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.filter_text = event.value
        self._show_jobs()

    @on(Input.Submitted, "#filter")
    def _filter_done(self) -> None:
        field = self.query_one("#filter", Input)
        field.display = bool(self.filter_text)
        self.query_one(JobTable).focus()

    def key_escape(self) -> None:
        """Escape clears and hides the filter (elsewhere it does nothing on the dashboard)."""
        field = self.query_one("#filter", Input)
        if field.display or self.filter_text:
            field.value = ""
            field.display = False
            self.query_one(JobTable).focus()
