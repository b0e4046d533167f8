"""``kernelab submit FILE...``: drop references (and sidecars, starting candidates) into the
inbox, each written under a temporary name and renamed into place."""

from __future__ import annotations

from pathlib import Path

import click

from kernelabd.client import home_option
from kernelabd.client import submit as submit_files
from store.home import resolve_home


@click.command()
@home_option
@click.argument("files", nargs=-1, required=True,
                type=click.Path(exists=True, dir_okay=False, path_type=Path))
def submit(home_dir: str | None, files: tuple[Path, ...]) -> None:
    """Copy FILES into the inbox (NAME.py, NAME.toml sidecar, NAME.new.py starting candidate)."""
    for placed in submit_files(resolve_home(home_dir), list(files)):
        click.echo(str(placed))
