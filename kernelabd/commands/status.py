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


def _times(value: float | None) -> str:
    return f"{value:.3f}x" if value is not None else "—"


def _render(data: dict, daemon: dict | None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if daemon is None:
        console.print("daemon: never ran with this home")
    else:
        age = time.time() - (daemon["heartbeat_at"] or 0)
        console.print(f"daemon: {'up' if daemon['up'] else 'down'} (pid {daemon['pid']}, "
                      f"{daemon['status']}, heartbeat {age:.0f} s ago)")
    table = Table("id", "problem", "state", "device", "cand", "fail", "acc", "× reference",
                  "× best peer", "best / error")
    for job in data["jobs"]:
        table.add_row(str(job["id"]), job["problem"], job["state"], job["device"] or "—",
                      str(job["candidates"]), str(job["gate_failures"]), str(job["accepted"]),
                      _times(job["best_speedup"]), _times(job["speedup_vs_best_peer"]),
                      job["error"] or job["best_file"] or job["stop_reason"] or "")
    console.print(table)
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
