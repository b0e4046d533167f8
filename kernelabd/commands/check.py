"""``kernelab check REFERENCE CANDIDATE``: the harness on the command line.

Exit 0: the candidate passed the gate (timings reported). 1: rejected by the gate, or it crashed
or hung (verdict ``error``). 2: the inputs could not be evaluated. With ``--json`` exactly one
JSON object goes to stdout whatever the exit code; everything else goes to stderr.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from kernelabd.config import ConfigError, load
from kernelabd.harness.problem import one_line
from kernelabd.harness.result import CheckResult
from kernelabd.harness.sandbox import head_start
from store.home import resolve_home


class JsonErrors(click.Command):
    """Usage errors too must come out as one JSON object when ``--json`` was asked for."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--json" not in args:
            return super().parse_args(ctx, args)
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            emit_json(CheckResult.invalid("bad_arguments", exc.format_message(), "cpu"))
            ctx.exit(2)


def emit_json(result: CheckResult) -> None:
    click.echo(json.dumps(result.to_json(), default=str))


def summary(result: CheckResult, console: Console, debug: bool) -> None:
    """A few lines a person reads: the verdict, why, and the numbers that support it.

    Input that could not be evaluated gets one line naming the file and the cause; the
    sandbox's traceback follows only with ``--debug``.
    """
    if result.exit_code == 2:
        click.echo(f"error: {result.reason}", err=True)
        if debug and result.evidence.get("stderr_tail"):
            console.print(result.evidence["stderr_tail"], markup=False, highlight=False)
        return
    colour = {"pass": "green", "fail": "red", "error": "yellow"}[result.verdict]
    head = f"[bold {colour}]{result.verdict.upper()}[/]"
    if result.rule:
        head += f"  rule [bold]{result.rule}[/]"
    console.print(head)
    if result.reason:
        console.print(f"  {result.reason}", markup=False, highlight=False)
    table = Table(show_header=False, box=None, pad_edge=False)
    rows = [
        ("max rel error", result.max_rel_error, "{:.3g}"), ("tolerance", result.tolerance, "{:.3g}"),
        ("baseline ms", result.reference_ms, "{:.4f}"), ("candidate ms", result.candidate_ms, "{:.4f}"),
        ("speedup", result.speedup, "{:.3f}×"),
    ]
    for label, value, fmt in rows:
        if value is not None:
            table.add_row(f"  {label}", fmt.format(value))
    if result.speedup_ci:
        lo, hi = result.speedup_ci
        table.add_row("  95% CI", f"[{lo:.3f}, {hi:.3f}] vs threshold {result.threshold:.3f}")
        table.add_row("  faster than noise", "yes" if result.faster_than_noise else "no")
    if result.clock and "sm_clock_mhz" in result.clock:
        c = result.clock
        table.add_row("  SM clock", f"{c['sm_clock_mhz']} MHz ({c['sm_clock_min_mhz']}–"
                      f"{c['sm_clock_max_mhz']}), max {c['temperature_max_c']} °C, "
                      f"{c['throttled_blocks_discarded']} throttled block(s) re-run")
    table.add_row("  device", result.device)
    if result.wall_s is not None:
        table.add_row("  wall", f"{result.wall_s:.1f} s")
    console.print(table)
    if result.evidence:
        shown = {k: v for k, v in result.evidence.items() if k != "stderr_tail" or debug}
        if shown:
            console.print(f"  evidence: {json.dumps(shown, default=str)[:2000]}", markup=False,
                          highlight=False)


def _is_file(path: str) -> bool:
    return Path(path).is_file()


@click.command(cls=JsonErrors)
@click.argument("reference")
@click.argument("candidate")
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N")
@click.option("--baseline", default=None, help="Time against this candidate instead of the reference.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
@click.option("--timeout-s", type=float, default=None, help="Deadline of the whole evaluation.")
@click.option("--no-timing", is_flag=True, help="Gate only.")
@click.option("--home", default=None, help="Home directory whose kernelab.toml to use.")
@click.option("--debug", is_flag=True, help="Tracebacks and sandbox output on errors.")
def check(reference: str, candidate: str, device: str, baseline: str | None, as_json: bool,
          timeout_s: float | None, no_timing: bool, home: str | None, debug: bool) -> None:
    """Gate CANDIDATE against REFERENCE's float64 oracle; if correct, time it beyond noise."""
    err = Console(stderr=True)
    try:
        config = load(resolve_home(home).config)
    except ConfigError as exc:
        result = CheckResult.invalid("bad_arguments", str(exc), device)
        emit_json(result) if as_json else err.print(f"[red]error:[/] {exc}", highlight=False)
        sys.exit(2)
    if timeout_s is not None:
        if timeout_s <= 0:
            result = CheckResult.invalid("bad_arguments", "--timeout-s must be positive", device)
            emit_json(result) if as_json else err.print("[red]error:[/] --timeout-s must be positive")
            sys.exit(2)
        config.gate.timeout_s = timeout_s
    files = [reference, candidate, *([baseline] if baseline else [])]
    labels = ("reference", "candidate", "baseline")[:len(files)] if all(map(_is_file, files)) else ()
    early = head_start(device, config.sandbox, labels)
    from kernelabd.harness.check import run_check  # torch is imported only once arguments are valid

    try:
        with err.status("starting", spinner="dots") as status:
            result = run_check(Path(reference), Path(candidate), device=device,
                               baseline=Path(baseline) if baseline else None, config=config,
                               progress=lambda msg: status.update(msg), time_it=not no_timing,
                               early=early)
    except Exception as exc:
        if debug:
            traceback.print_exc()
        result = CheckResult(verdict="error", rule="internal", device=device,
                             reason=f"internal error: {one_line(exc)}")
    if as_json:
        emit_json(result)
    else:
        summary(result, Console(stderr=result.exit_code == 2), debug)
    sys.exit(result.exit_code)
