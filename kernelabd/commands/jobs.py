"""``kernelab jobs pause|resume|cancel|retry ID`` and ``kernelab jobs priority ID N``.

Each writes one row to the ``commands`` table (the only write a non-daemon process makes) and
waits briefly for the daemon to apply it, so the user learns the outcome, not just the request.
"""

from __future__ import annotations

import sys

import click

from kernelabd.client import daemon_alive, home_option, post, wait_command
from store.db import connect
from store.home import resolve_home

WAIT_S = 3.0


def _send(home_dir: str | None, verb: str, job_id: int, arg: str | None = None) -> None:
    home = resolve_home(home_dir)
    if not home.db.exists():
        click.echo(f"kernelab jobs: no database in {home.root}", err=True)
        sys.exit(1)
    try:
        command_id = post(home, verb, job_id, arg)
    except LookupError as exc:
        click.echo(f"kernelab jobs: {exc}", err=True)
        sys.exit(1)
    conn = connect(home.db, readonly=True)
    try:
        alive = daemon_alive(conn)
    finally:
        conn.close()
    if not alive:
        click.echo(f"job {job_id}: {verb} queued; no daemon is running, it applies it on start")
        return
    outcome = wait_command(home, command_id, WAIT_S)
    if outcome is None:
        click.echo(f"job {job_id}: {verb} queued; the daemon has not applied it yet")
    elif outcome["status"] == "done":
        click.echo(f"job {job_id}: {outcome['result']}")
    else:
        click.echo(f"job {job_id}: {verb} rejected: {outcome['result']}", err=True)
        sys.exit(1)


@click.group()
def jobs() -> None:
    """Pause, resume, cancel, retry or reprioritise a job; show its agent transcript."""


def _verb(name: str, doc: str) -> click.Command:
    @click.command(name=name, help=doc)
    @home_option
    @click.argument("job_id", type=int)
    def command(home_dir: str | None, job_id: int) -> None:
        _send(home_dir, name, job_id)

    return command


for _name, _doc in (("pause", "Pause a queued or running job (a running one stops at once)."),
                    ("resume", "Queue a paused or interrupted job again (an interrupted one's "
                               "kernelab port died: the daemon takes it over); it resumes where it "
                               "stopped."),
                    ("cancel", "Cancel a job; what it recorded stays."),
                    ("retry", "Queue a failed, cancelled or invalid job again.")):
    jobs.add_command(_verb(_name, _doc))


@jobs.command()
@home_option
@click.argument("job_id", type=int)
@click.argument("priority", type=int)
def priority(home_dir: str | None, job_id: int, priority: int) -> None:
    """Set a job's priority (higher runs first)."""
    _send(home_dir, "priority", job_id, str(priority))


@jobs.command()
@home_option
@click.argument("job_id", type=int)
@click.option("--candidate", "candidate_id", type=int, default=None,
              help="Only the exchanges that produced this candidate.")
@click.option("--json", "as_json", is_flag=True, help="One JSON list of exchange objects.")
def transcript(home_dir: str | None, job_id: int, candidate_id: int | None, as_json: bool) -> None:
    """Show an agent's exchanges for a job (prompt, response, model, tokens, latency)."""
    import json

    from store.exchanges import exchanges

    home = resolve_home(home_dir)
    if not home.db.exists():
        click.echo(f"kernelab jobs: no database in {home.root}", err=True)
        sys.exit(1)
    conn = connect(home.db, readonly=True)
    try:
        rows = exchanges(conn, job_id, candidate_id)
    finally:
        conn.close()
    if as_json:
        click.echo(json.dumps(rows))
        return
    for ex in rows:
        linked = f"candidate #{ex['candidate_id']}" if ex["candidate_id"] else "no candidate"
        click.echo(f"── exchange {ex['id']} · {ex['proposer']} · {ex['model']} · {ex['status']} · "
                   f"{linked} · {ex['tokens_in']} in / {ex['tokens_out']} out · "
                   f"{ex['latency_s']} s · finish {ex['finish_reason']}")
        if ex["error"]:
            click.echo(f"error: {ex['error']}")
        click.echo(f"── prompt\n{ex['prompt']}\n── response\n{ex['response'] or '(none)'}\n")
    if not rows:
        click.echo(f"job {job_id}: no agent exchanges")
