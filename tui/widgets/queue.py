"""The job queue: a table the user sorts (``s``), filters (``/``) and moves through."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.binding import Binding
from textual.widgets import DataTable

from tui.data import Job

COLUMNS = (("#", "id"), ("problem", "problem"), ("state", "state"), ("cand", "cand"),
           ("fail", "fail"), ("×ref", "speedup"), ("dev", "dev"), ("pri", "pri"),
           ("kind", "kind"))

STATE_STYLE = {"running": "bold green", "paused": "yellow", "queued": "cyan",
               "failed": "bold red", "invalid": "red", "cancelled": "dim", "done": "blue"}

VIM_BINDINGS = [
    Binding("j", "cursor_down", "Down", show=False),
    Binding("k", "cursor_up", "Up", show=False),
    Binding("g", "scroll_top", "Top", show=False),
    Binding("G", "scroll_bottom", "Bottom", show=False),
]
"""Vim motions for every table; the arrow keys come with ``DataTable`` itself."""


def job_cells(job: Job) -> tuple[Text | str, ...]:
    """One job as table cells: state is coloured *and* spelt out, so NO_COLOR loses nothing."""
    speedup = f"{job.speedup:.2f}" if job.speedup else "–"
    return (str(job.id), job.problem, Text(job.state, style=STATE_STYLE.get(job.state, "")),
            str(job.candidates), str(job.failures) if job.failures else "–", speedup,
            job.device or "–", str(job.priority), job.kind)


class JobTable(DataTable[Text | str]):
    """The queue. Rows are updated in place when the set of jobs is unchanged, so the cursor
    stays where the user put it while the daemon writes."""

    BINDINGS = VIM_BINDINGS

    def __init__(self, **kwargs: str) -> None:
        super().__init__(cursor_type="row", zebra_stripes=False, **kwargs)
        self._rows: tuple[Job, ...] = ()

    def on_mount(self) -> None:
        for label, key in COLUMNS:
            self.add_column(label, key=key)

    @property
    def selected_job_id(self) -> int | None:
        if not self._rows or self.cursor_row < 0 or self.cursor_row >= len(self._rows):
            return None
        return self._rows[self.cursor_row].id

    def show(self, jobs: Sequence[Job]) -> None:
        jobs = tuple(jobs)
        if jobs == self._rows:
            return
        if [j.id for j in jobs] == [j.id for j in self._rows]:
            for old, new in zip(self._rows, jobs, strict=True):
                if old != new:
                    for (_, column), cell in zip(COLUMNS, job_cells(new), strict=True):
                        self.update_cell(str(new.id), column, cell)
            self._rows = jobs
            return
        selected = self.selected_job_id
        self._rows = jobs
        self.clear()
        for job in jobs:
            self.add_row(*job_cells(job), key=str(job.id))
        ids = [j.id for j in jobs]
        if selected in ids:
            self.move_cursor(row=ids.index(selected))
