"""Fixtures for the TUI tests: a real SQLite file with fixed content, and a helper that lets
the app's worker threads finish before a test looks at the screen."""

from __future__ import annotations

import asyncio
import inspect
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import tuidb
from textual.pilot import Pilot
from textual.worker import WorkerState

from store import connect
from tui.app import KernelabApp


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run ``async def`` tests in a fresh event loop (Pilot needs one; no plugin required)."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    asyncio.run(pyfuncitem.obj(**{n: pyfuncitem.funcargs[n] for n in names}))
    return True


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """A fresh copy of the fixed database in ``tmp_path/home``."""
    return tuidb.build(tmp_path / "home" / "kernelab.db")


@pytest.fixture
def writer(db_path: Path) -> Iterator[sqlite3.Connection]:
    """A second connection playing the daemon: it keeps the WAL alive, as the daemon does."""
    conn = connect(db_path)
    yield conn
    conn.close()


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
        if time.monotonic() > deadline:
            raise AssertionError(f"workers still busy after {timeout} s: {busy}")
        if busy:
            await pilot.pause(0.01)
