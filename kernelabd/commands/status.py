"""``kernelab status [--json]``: jobs and devices, read from the database (read-only)."""

from __future__ import annotations

import json
import time

import click

from kernelabd.client import home_option
from store.db import NotCreatedYet, connect
from store.home import Home, resolve_home
from store.status import daemon as daemon_row
from store.status import snapshot

COLUMNS = ("id", "problem", "state", "device", "cand", "fail", "acc", "× reference", "× best peer")
"""The table's columns; each job's best file, error or stop reason follows the table on a line
of its own, so that a long path never squeezes the columns of an 80-column terminal."""


NAME_MIN = 12
"""The problem column's least width; a longer name folds onto more lines."""


def _times(value: float | None) -> str:
    return f"{value:.3f}x" if value is not None else "—"


def _render(data: dict, daemon: dict | None) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if daemon is None:
        console.print("daemon: never ran with this home")
    else:
        age = time.time() - (daemon["heartbeat_at"] or 0)
        console.print(f"daemon: {'up' if daemon['up'] else 'down'} (pid {daemon['pid']}, "
                      f"{daemon['status']}, heartbeat {age:.0f} s ago)")
    rows, notes = [], []
    for job in data["jobs"]:
        rows.append((str(job["id"]), job["problem"], job["state"], job["device"] or "—",
                     str(job["candidates"]), str(job["gate_failures"]), str(job["accepted"]),
                     _times(job["best_speedup"]), _times(job["speedup_vs_best_peer"])))
        note = job["error"] or job["best_file"] or job["stop_reason"]
        if note:
            notes.append(f"  {job['id']}: {note}")
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, collapse_padding=True)
    for i, label in enumerate(COLUMNS):
        # Every column keeps its width (``interrupted`` must read as a word); a long name folds.
        widest = max([len(label), *(len(r[i]) for r in rows)])
        table.add_column(label, min_width=NAME_MIN if label == "problem" else widest, overflow="fold")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    for note in notes:
        console.print(note, soft_wrap=True, highlight=False)
    for dev in data["devices"]:
        sample = dev["sample"] or {}
        extra = (f" {sample.get('util_pct')}% {sample.get('sm_clock_mhz')} MHz "
                 f"{sample.get('temperature_c')} °C {sample.get('power_w')} W") if sample else ""
        running = f", job {dev['job']}" if dev["job"] else ""
        console.print(f"{dev['id']}: {dev['name']}{extra}{running}")


@click.command()
@home_option
@click.option("--json", "as_json", is_flag=True, help='Print {"jobs": [...], "devices": [...]}.')
def status(home_dir: str | None, as_json: bool) -> None:
    """Show jobs and devices."""
    home: Home = resolve_home(home_dir)
    data: dict = {"jobs": [], "devices": []}
    daemon = None
    if home.db.exists():
        try:
            conn = connect(home.db, readonly=True)
        except NotCreatedYet:       # the daemon is creating it this moment: nothing to show yet
            conn = None
        if conn is not None:
            try:
                data = snapshot(conn, home)
                daemon = daemon_row(conn)
            finally:
                conn.close()
    if as_json:
        click.echo(json.dumps(data))
    else:
        _render(data, daemon)
