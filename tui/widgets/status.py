"""The one-line status bar: is the daemon alive, what is the queue doing, are controls on."""

from __future__ import annotations

from collections import Counter

from textual.widgets import Static

from tui.data import Overview


def status_text(overview: Overview | None, error: str | None, now: float,
                controls_on: bool) -> str:
    """Plain words first and colour second, so the bar reads the same under NO_COLOR."""
    parts = ["[b]kernelab[/b]"]
    if error:
        parts.append(f"[red]⚠ {error}[/red]")
    if overview is not None:
        daemon = overview.daemon
        if daemon is None:
            parts.append("[red]○[/red] daemon never ran")
        elif daemon.is_up(now):
            parts.append(f"[green]●[/green] daemon up ({daemon.host or '?'})")
        else:
            parts.append("[red]○[/red] daemon down")
    parts.append("controls on" if controls_on else "[yellow]controls off (read-only "
                 "database)[/yellow]")
    if overview is not None:
        counts = Counter(j.state for j in overview.jobs)
        queue = [f"{counts[s]} {s}" for s in ("running", "interrupted", "queued", "paused", "failed")
                 if counts[s]]
        idle = f"idle, {len(overview.jobs)} ended" if overview.jobs else "no jobs"
        parts.append(" · ".join(queue) or idle)
    return " │ ".join(parts)


class StatusBar(Static):
    """Updated only when its text changes, so the timer that re-checks the daemon's
    heartbeat costs no redraw."""

    def __init__(self, **kwargs: str) -> None:
        super().__init__("", markup=True, **kwargs)
        self._text = ""

    def show(self, text: str) -> None:
        if text != self._text:
            self._text = text
            self.update(text)
