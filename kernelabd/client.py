"""What the CLI uses to talk to the daemon: preparing a home, dropping files into the inbox,
posting commands and waiting for their answers.

Nothing here imports torch: ``submit``, ``status`` and ``jobs`` must answer instantly.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any

from kernelabd.config import DEFAULT_TOML
from store.db import connect
from store.home import Home
from store.records import post_command
from store.status import daemon_up, pid_alive

# pid_alive is the store's, named here too for the daemon and the doctor, which import it from us.
__all__ = ["REFERENCE_SUFFIXES", "daemon_alive", "ensure_home", "home_option", "pid_alive", "post", "submit",
           "submit_order", "wait_command"]
REFERENCE_SUFFIXES = (".new.py", ".toml")   # dropped before the reference they belong to


def ensure_home(home: Home) -> Home:
    """Create the home layout with a commented default ``kernelab.toml`` on first use."""
    for folder in (home.root, home.inbox, home.results, home.work):
        folder.mkdir(parents=True, exist_ok=True)
    if not home.config.exists():
        home.config.write_text(DEFAULT_TOML)
    return home


def submit_order(files: list[Path]) -> list[Path]:
    """Sidecars and starting candidates first, references last: the watcher takes a reference
    together with whatever lies beside it at that moment."""
    return sorted(files, key=lambda p: 0 if p.name.endswith(REFERENCE_SUFFIXES) else 1)


def submit(home: Home, files: list[Path]) -> list[Path]:
    """Copy each file into the inbox under a hidden temporary name, then rename it into
    place, so the daemon never sees a partly written file."""
    ensure_home(home)
    placed = []
    for src in submit_order(files):
        dest = home.inbox / src.name
        tmp = home.inbox / f".{src.name}.tmp-{os.getpid()}"
        shutil.copyfile(src, tmp)
        os.replace(tmp, dest)
        placed.append(dest)
    return placed


def post(home: Home, verb: str, job_id: int, arg: str | None = None) -> int:
    """Queue a job command for the daemon (a short write transaction on ``commands``)."""
    conn = connect(home.db)
    try:
        if conn.execute("SELECT 1 FROM jobs WHERE id = ?", (job_id,)).fetchone() is None:
            raise LookupError(f"no job {job_id}")
        return post_command(conn, verb, job_id, arg)
    finally:
        conn.close()


def wait_command(home: Home, command_id: int, timeout_s: float) -> dict[str, Any] | None:
    """The command's outcome once the daemon applied it, or None if it did not in time."""
    deadline = time.monotonic() + timeout_s
    conn = connect(home.db, readonly=True)
    try:
        while True:
            row = conn.execute("SELECT status, result FROM commands WHERE id = ?",
                               (command_id,)).fetchone()
            if row is not None and row["status"] != "pending":
                return dict(row)
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)
    finally:
        conn.close()


def daemon_alive(conn: sqlite3.Connection) -> bool:
    """Whether a daemon is up on this database (``store.status.daemon_up`` of its heartbeat)."""
    row = conn.execute("SELECT heartbeat_at, status FROM daemon WHERE id = 1").fetchone()
    return row is not None and daemon_up(row["heartbeat_at"], row["status"])


def home_option(func: Any) -> Any:
    """``--home DIR`` for every command (else $KERNELAB_HOME, $STATE_DIRECTORY, XDG)."""
    import click

    return click.option("--home", "home_dir", type=click.Path(file_okay=False), default=None,
                        help="kernelab home directory (default: $KERNELAB_HOME, "
                             "$STATE_DIRECTORY, else the XDG state directory).")(func)
