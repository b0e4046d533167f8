"""``kernelab tui [--home DIR]``: registered lazily by ``kernelabd.cli``.

Imports only click, the store and Textual, so the command starts fast even on a box whose
Python environment has torch and CUDA installed.
"""

from __future__ import annotations

import click

from store import resolve_home


@click.command()
@click.option("--home", type=click.Path(file_okay=False), default=None,
              help="kernelab home (default: $KERNELAB_HOME, $STATE_DIRECTORY, XDG state dir).")
def tui(home: str | None) -> None:
    """Watch the daemon live: queue, devices, convergence and gate failures."""
    from tui.app import KernelabApp

    KernelabApp(resolve_home(home).db, handle_signals=True).run()
