"""``kernelab port REFERENCE``: one job in the foreground, with the daemon's loop and records.

The job is recorded in the home's database like any other (the TUI and ``status`` show it);
this process is its writer while it runs, and marks the job with its pid so that a daemon
starting meanwhile leaves it alone. Ctrl-C pauses the job; ``kernelab jobs resume`` hands it
to the daemon.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import click

from kernelabd.client import ensure_home, home_option
from kernelabd.config import ConfigError, load
from kernelabd.service.recorder import LocalRecorder
from store.db import connect
from store.home import resolve_home
from store.records import Store
from store.status import jobs as job_rows

EXIT_CODES = {"done": 0, "failed": 1, "invalid": 2}


def pick_device(requested: str | None) -> str:
    """The harness device: as asked, else the first GPU when NVML finds one, else the CPU."""
    if requested:
        return requested
    from kernelabd.service.devices import discover

    devices, _ = discover(None, [])
    return "cuda" if devices[0].index is not None else "cpu"


@click.command()
@home_option
@click.argument("reference", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--device", default=None, help="cpu | cuda | cuda:N (default: a GPU if any).")
@click.option("--proposer", "proposers", multiple=True,
              help="Proposer to use, in order (repeatable; default: [jobs] proposers).")
@click.option("--json", "as_json", is_flag=True, help="Print the job's status object at the end.")
def port(home_dir: str | None, reference: Path, device: str | None, proposers: tuple[str, ...],
         as_json: bool) -> None:
    """Port/tune REFERENCE in the foreground (NAME.toml and NAME.new.py beside it are used)."""
    from rich.console import Console

    from kernelabd.service.converge import Loop
    from kernelabd.service.inbox import read_problem

    home = ensure_home(resolve_home(home_dir))
    try:
        config = load(home.config)
    except ConfigError as exc:
        click.echo(f"kernelab port: {exc}", err=True)
        sys.exit(2)
    from kernelabd.propose.agent import unconfigured

    unknown = unconfigured(proposers, config)
    if unknown:
        click.echo(f"kernelab port: {unknown}", err=True)
        sys.exit(2)
    device = pick_device(device)
    store = Store(connect(home.db))
    job_config: dict = {"foreground_pid": os.getpid()}
    if proposers:
        job_config["proposers"] = list(proposers)
    problem = read_problem(reference.resolve())
    _, job_id = store.add_problem(problem, job_config=job_config, always=True)  # type: ignore[misc]
    recorder = LocalRecorder(store, home)
    console = Console(stderr=True)
    if problem.error:
        recorder.end_job(job_id, "invalid", None, problem.error)
        outcome_state = "invalid"
    else:
        _pause_on_sigint()
        outcome_state = _run(store, recorder, job_id, device, config, home, console, Loop)
    row = next(j for j in job_rows(store.conn, home) if j["id"] == job_id)
    if as_json:
        click.echo(json.dumps(row))
    else:
        speed = f"{row['best_speedup']:.3f}x" if row["best_speedup"] is not None else "—"
        console.print(f"job {job_id} {row['state']}: {row['candidates']} candidates, "
                      f"{row['accepted']} accepted, best {speed} "
                      f"{row['best_file'] or row['error'] or ''}")
    sys.exit(EXIT_CODES.get(outcome_state, 1))


def _pause_on_sigint() -> None:
    """SIGINT pauses the job even where this process was started with it ignored: a shell
    without job control (a script, CI) starts its background commands so, and ``kill -INT``
    and ``timeout -s INT`` are how scripts and benchmarks stop a port."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _run(store: Store, recorder: LocalRecorder, job_id: int, device: str, config, home,
         console, loop_cls) -> str:
    store.start_job(job_id, device)
    store.event("job.started", f"on {device} (foreground, pid {os.getpid()})", job_id=job_id)
    with console.status(f"job {job_id}: starting") as spinner:
        def progress(line: str) -> None:
            spinner.update(f"job {job_id}: {line}")
            if line.startswith("candidate #") and not line.endswith("checking"):
                console.log(line)

        try:
            outcome = loop_cls(job_id, recorder, config=config, device=device,
                               workdir=home.work / f"job-{job_id}", progress=progress).run()
        except KeyboardInterrupt:
            from kernelabd.service.reports import write_results

            store.interrupt_job(job_id, "paused")
            store.event("job.paused", "interrupted in the foreground; `kernelab jobs resume "
                        f"{job_id}` hands it to the daemon", job_id=job_id)
            write_results(store, home, job_id)   # else report.json says "running" for a paused job
            console.print(f"job {job_id} paused")
            sys.exit(130)
    recorder.end_job(job_id, outcome.state, outcome.stop_reason, outcome.error)
    return outcome.state

