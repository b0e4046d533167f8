"""Driving the app in tests: build it as ``kernelab tui`` does, and wait for its loads."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from textual.pilot import Pilot
from textual.worker import WorkerState

from tests.tui import tuidb
from tui.app import KernelabApp


def make_app(db_path: Path) -> KernelabApp:
    """The app as ``kernelab tui`` builds it, with the clock fixed for stable snapshots."""
    return KernelabApp(db_path, now=lambda: tuidb.NOW)


async def settle(pilot: Pilot[None], timeout: float = 5.0) -> None:
    """Wait until loads started by the poller or a key press have reached the screen.

    Polls worker states rather than awaiting the workers: an exclusive load cancels its
    predecessor, and awaiting a cancelled worker raises.
    """
    deadline = time.monotonic() + timeout
    idle_rounds = 0
    while idle_rounds < 3:
        await pilot.pause()
        busy = [w for w in pilot.app.workers
                if w.state in (WorkerState.PENDING, WorkerState.RUNNING)]
        idle_rounds = 0 if busy else idle_rounds + 1
        if busy and time.monotonic() > deadline:
            # (Only when busy: on a loaded machine three idle rounds can outlast the deadline.)
            raise AssertionError(f"workers still busy after {timeout} s: {busy}")
        if busy:
            await pilot.pause(0.01)


async def until(pilot: Pilot[None], condition: Callable[[], object], what: str,
                timeout: float = 30.0) -> None:
    """Settle until ``condition()`` holds: on a loaded machine a load can start after the
    workers looked idle (the poller's next tick), so one settle is not always enough."""
    deadline = time.monotonic() + timeout
    while True:
        await settle(pilot)
        if condition():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not on screen after {timeout} s")
        await pilot.pause(0.05)
