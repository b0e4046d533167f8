"""The job queue: a table the user sorts (``s``), filters (``/``) and moves through.

Every column stays in view: the problem column gets the width the others leave, and a name
longer than that (KernelBench's run to 60 characters) is shortened in the middle, where its
number and its last words stay readable. The job detail shows the full name.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.cells import cell_len
from rich.text import Text
from textual import events
from textual.binding import Binding

from tui.data import Job
from tui.widgets.table import Table

COLUMNS = (("#", "id"), ("problem", "problem"), ("state", "state"), ("cand", "cand"),
           ("fail", "fail"), ("×ref", "speedup"), ("×peer", "peer"), ("dev", "dev"), ("pri", "pri"),
           ("kind", "kind"))
"""``×ref``: the job's speedup over the reference; ``×peer``: over the best of eager PyTorch and
torch.compile (``store.status.speedup_vs_best_peer``)."""

NAME_MIN = 12
"""The problem column never gets narrower than this (below it the table scrolls instead)."""

STATE_STYLE = {"running": "bold green", "interrupted": "bold magenta", "paused": "yellow",
               "queued": "cyan", "failed": "bold red", "invalid": "red", "cancelled": "dim",
               "done": "blue"}

VIM_BINDINGS = [
    Binding("j", "cursor_down", "Down", show=False),
    Binding("k", "cursor_up", "Up", show=False),
    Binding("g", "scroll_top", "Top", show=False),
    Binding("G", "scroll_bottom", "Bottom", show=False),
]
"""Vim motions for every table; the arrow keys come with ``DataTable`` itself."""


def shorten_middle(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters, its middle replaced by an ellipsis."""
    if len(text) <= width:
        return text
    if width < 3:
        return text[:width]
    head = width // 2
    return f"{text[:head]}…{text[len(text) - (width - head - 1):]}"


def _times(value: float | None) -> str:
    return f"{value:.2f}" if value is not None else "–"


def job_cells(job: Job, name_width: int) -> tuple[Text | str, ...]:
    """One job as table cells: state is coloured *and* spelt out, so NO_COLOR loses nothing."""
    return (str(job.id), shorten_middle(job.problem, name_width),
            Text(job.state, style=STATE_STYLE.get(job.state, "")), str(job.candidates),
            str(job.failures) if job.failures else "–", _times(job.speedup),
            _times(job.speedup_vs_best_peer), job.device or "–", str(job.priority), job.kind)


class JobTable(Table[Text | str]):
    """The queue. Rows are updated in place when the set of jobs is unchanged, so the cursor
    stays where the user put it while the daemon writes."""

    BINDINGS = VIM_BINDINGS

    def __init__(self, **kwargs: str) -> None:
        super().__init__(cursor_type="row", zebra_stripes=False, **kwargs)
        self._rows: tuple[Job, ...] = ()
        self._name_width = 0

    def on_mount(self) -> None:
        self._add_columns()

    def on_resize(self, _event: events.Resize) -> None:
        self.show(self._rows, force=True)

    @property
    def selected_job_id(self) -> int | None:
        if not self._rows or self.cursor_row < 0 or self.cursor_row >= len(self._rows):
            return None
        return self._rows[self.cursor_row].id

    def _others(self, jobs: Sequence[Job]) -> int:
        """The width every column but the problem takes (content and padding), and the
        problem column's own padding and the vertical scrollbar."""
        pad = 2 * self.cell_padding
        rows = [job_cells(j, 0) for j in jobs]
        return pad + self.styles.scrollbar_size_vertical + sum(
            pad + max([cell_len(label), *(cell_len(str(r[i])) for r in rows)])
            for i, (label, key) in enumerate(COLUMNS) if key != "problem")

    def full_width(self, jobs: Sequence[Job] | None = None) -> int:
        """The width at which every name fits whole."""
        jobs = self._rows if jobs is None else jobs
        return self._others(jobs) + max([len("problem"), *(len(j.problem) for j in jobs)])

    def name_width(self, jobs: Sequence[Job]) -> int:
        """What the problem column may take: what the other columns leave of the table's width,
        at least ``NAME_MIN``, and no more than the longest name needs."""
        room = self.size.width - self._others(jobs)
        return min(self.full_width(jobs) - self._others(jobs), max(NAME_MIN, room))

    def show(self, jobs: Sequence[Job], *, force: bool = False) -> None:
        jobs = tuple(jobs)
        width = self.name_width(jobs)
        if jobs == self._rows and width == self._name_width and not force:
            return
        if width == self._name_width and [j.id for j in jobs] == [j.id for j in self._rows]:
            for old, new in zip(self._rows, jobs, strict=True):
                if old != new:
                    for (_, column), cell in zip(COLUMNS, job_cells(new, width), strict=True):
                        self.update_cell(str(new.id), column, cell)
            self._rows = jobs
            return
        selected = self.selected_job_id
        self._rows, self._name_width = jobs, width
        self.clear(columns=True)
        self._add_columns()
        for job in jobs:
            self.add_row(*job_cells(job, width), key=str(job.id))
        ids = [j.id for j in jobs]
        if selected in ids:
            self.move_cursor(row=ids.index(selected))

    def _add_columns(self) -> None:
        for label, key in COLUMNS:
            fixed = key == "problem" and self._name_width > 0
            self.add_column(label, key=key, width=self._name_width if fixed else None)
