"""The one table class every table of the TUI derives from.

Textual's ``DataTable`` sizes its columns to new or updated cells on its next idle event, but
caches the lines it draws under a count that this sizing does not change. When a frame is
drawn between ``add_row`` (or ``update_cell``) and that idle event, which happens when a layout
change elsewhere on the screen (the queue's width, say) is composited first, as it can be on a
busy machine, the lines drawn with the old widths stay in the cache: the table keeps showing
its columns at their labels' width, cutting the cells short, until something unrelated (a
cursor move, focus) redraws it. This class drops those lines when the sizing changed a width.
"""

from __future__ import annotations

from typing import TypeVar

from textual import events
from textual.widgets import DataTable

CellT = TypeVar("CellT")


class Table(DataTable[CellT]):
    """A ``DataTable`` that redraws once its columns have been sized to what it holds."""

    def _widths(self) -> tuple[int, ...]:
        return (self._label_column.get_render_width(self),
                *(column.get_render_width(self) for column in self.ordered_columns))

    async def _on_idle(self, event: events.Idle) -> None:
        # Textual dispatches ``_on_idle`` of every class in the MRO, this one first: size the
        # columns here (``DataTable``'s own handler then finds nothing left to do) and drop the
        # lines drawn at the old widths.
        before = self._widths()
        await super()._on_idle(event)
        if self._widths() != before:
            self._clear_caches()
