"""Screens of the kernelab TUI: dashboard, job detail, help and the cancel confirmation."""
