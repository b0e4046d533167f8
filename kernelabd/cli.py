"""The ``kernelab`` command line.

Commands are loaded lazily: ``kernelab tui`` must start in well under a second over SSH and
must never import torch, so nothing heavy is imported until a command that needs it runs.
"""

from __future__ import annotations

import importlib
import sys

import click

from kernelabd import __version__

# command name -> "module:attribute"; each module owns its command.
COMMANDS: dict[str, str] = {
    "check": "kernelabd.commands.check:check",
    "inspect": "kernelabd.commands.inspect:inspect",
    "daemon": "kernelabd.commands.daemon:daemon",
    "port": "kernelabd.commands.port:port",
    "submit": "kernelabd.commands.submit:submit",
    "status": "kernelabd.commands.status:status",
    "jobs": "kernelabd.commands.jobs:jobs",
    "tui": "tui.cli:tui",
    "doctor": "kernelabd.commands.doctor:doctor",
    "demo": "kernelabd.commands.demo:demo",
    "service": "kernelabd.commands.service:service",
    "fingerprint": "kernelabd.commands.fingerprint:fingerprint",
}

HELP = {
    "check": "Gate a candidate against a float64 oracle and time it beyond noise.",
    "inspect": "Run a reference once with its oracle: shapes, work, speed of light, memory plan.",
    "daemon": "Run the daemon: watch the inbox, queue jobs, converge.",
    "port": "Run one port/tune job in the foreground.",
    "submit": "Drop reference files into the inbox.",
    "status": "Show jobs and devices.",
    "jobs": "Pause, resume, cancel, retry or reprioritise a job.",
    "tui": "Watch the daemon live (read-only database access is enough).",
    "doctor": "Explain why nothing is happening.",
    "demo": "Run the daemon on the bundled examples in a throw-away home.",
    "service": "Install kernelab as a systemd service.",
    "fingerprint": "Registers, spills, shared memory and SASS mix of a candidate's kernels (no GPU).",
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        return getattr(importlib.import_module(module_name), attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """List commands from ``HELP`` so that ``kernelab --help`` imports none of them."""
        with formatter.section("Commands"):
            formatter.write_dl([(name, HELP[name]) for name in self.list_commands(ctx)])


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kernelab")
def main() -> None:
    """kernelab: port and tune GPU kernels; correctness is a gate, measured runtime the score."""


def daemon_main() -> None:
    """Entry point of ``kernelabd``: the same as ``kernelab daemon``."""
    main(args=["daemon", *sys.argv[1:]], prog_name="kernelabd")
