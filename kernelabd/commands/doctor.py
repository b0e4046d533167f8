"""``kernelab doctor [--json] [--home DIR]``: every check of ``kernelabd.service.doctor``, as a table or
as ``{"checks": [{"name", "status", "detail", "hint"}]}``; exit 1 only when a check fails."""

from __future__ import annotations

import json
import sys

import click
from rich.console import Console
from rich.table import Table

from kernelabd.service.doctor import FAIL, Check, run_checks
from store.home import resolve_home

STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red"}


def render_table(checks: list[Check], home: str) -> Table:
    table = Table(title=f"kernelab doctor — home {home}", title_justify="left",
                  show_lines=False, expand=False)
    table.add_column("check", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("detail")
    table.add_column("fix")
    for check in checks:
        style = STYLE[check.status]
        table.add_row(check.name, f"[{style}]{check.status}[/]", check.detail, check.hint,
                      style="red" if check.status == FAIL else None)
    return table


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print {\"checks\": [...]} as JSON.")
@click.option("--home", type=click.Path(file_okay=False), default=None,
              help="kernelab home (default: $KERNELAB_HOME, $STATE_DIRECTORY, XDG state dir).")
def doctor(as_json: bool, home: str | None) -> None:
    """Check the installation, the GPUs, the home and the daemon; say how to fix each problem."""
    resolved = resolve_home(home)
    checks = run_checks(resolved)
    failed = sum(c.status == FAIL for c in checks)
    if as_json:
        click.echo(json.dumps({"home": str(resolved.root),
                               "checks": [c.to_json() for c in checks]}, indent=2))
    else:
        console = Console()
        console.print(render_table(checks, str(resolved.root)))
        counts = {s: sum(c.status == s for c in checks) for s in STYLE}
        console.print(f"{counts['ok']} ok, {counts['warn']} warn, {counts['fail']} fail")
    sys.exit(1 if failed else 0)
