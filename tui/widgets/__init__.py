"""Widgets of the kernelab TUI; each takes the frozen values of ``tui.data`` and redraws only
when they differ from what it shows."""
