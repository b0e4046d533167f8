"""Gate failures of one job, newest first: which rule failed and the evidence it recorded."""

from __future__ import annotations

from rich.text import Text

from tui.data import Candidate, format_evidence
from tui.widgets.queue import VIM_BINDINGS
from tui.widgets.table import Table


def failure_cells(cand: Candidate) -> tuple[str | Text, ...]:
    rule = Text(cand.rule or cand.verdict or "?", style="bold red")
    return (str(cand.id), rule, format_evidence(cand.evidence), cand.edit or "")


class FailuresTable(Table[str | Text]):
    """A read-only table; rebuilt only when the failures change."""

    BINDINGS = VIM_BINDINGS

    def __init__(self, **kwargs: str) -> None:
        super().__init__(cursor_type="row", **kwargs)
        self.border_title = "gate failures"
        self._rows: tuple[Candidate, ...] | None = None

    def on_mount(self) -> None:
        self.add_columns("cand", "rule", "evidence", "edit")

    def show(self, failures: tuple[Candidate, ...]) -> None:
        if failures == self._rows:
            return
        self._rows = failures
        self.clear()
        for cand in failures:
            self.add_row(*failure_cells(cand), key=str(cand.id))
        self.border_subtitle = f"{len(failures)}" if failures else "none"
