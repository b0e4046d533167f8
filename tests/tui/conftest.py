"""Fixtures for the TUI tests: a real SQLite file with fixed content, and a helper that lets
the app's worker threads finish before a test looks at the screen."""

from __future__ import annotations

import asyncio
import inspect
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from store import connect
from tests.tui import tuidb


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
