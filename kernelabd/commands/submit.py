"""``kernelab submit FILE...``: drop references (and sidecars, starting candidates) into the
inbox, each written under a temporary name and renamed into place.

``--proposer`` chooses the job's proposers: it is written into the sidecar that goes with the
reference (``proposers = [...]``, created when none is given), so the choice travels with the
problem through the inbox like its other per-problem settings.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import click

from kernelabd.client import home_option
from kernelabd.client import submit as submit_files
from store.home import resolve_home


def with_proposers(files: list[Path], proposers: list[str], scratch: Path) -> list[Path]:
    """``files`` with each reference's sidecar carrying ``proposers`` (copies in ``scratch``);
    raises ``click.UsageError`` when there is no reference or a sidecar already names them."""
    references = [f for f in files if f.suffix == ".py" and not f.name.endswith(".new.py")]
    if not references:
        raise click.UsageError("--proposer needs a reference NAME.py among the files")
    out = [f for f in files if f.suffix != ".toml"]
    line = f"proposers = {json.dumps(proposers)}\n"
    for ref in references:
        given = next((f for f in files if f.name == f"{ref.stem}.toml"), None)
        text = given.read_text() if given else ""
        if given and any(row.split("=")[0].strip() == "proposers" for row in text.splitlines()):
            raise click.UsageError(f"{given}: already sets proposers; drop --proposer or the key")
        merged = scratch / f"{ref.stem}.toml"
        merged.write_text(line + text)
        out.append(merged)
    named = {f"{r.stem}.toml" for r in references}
    return out + [f for f in files if f.suffix == ".toml" and f.name not in named]


@click.command()
@home_option
@click.option("--proposer", "proposers", multiple=True,
              help="Proposer for these jobs, in order (repeatable; default: [jobs] proposers).")
@click.argument("files", nargs=-1, required=True,
                type=click.Path(exists=True, dir_okay=False, path_type=Path))
def submit(home_dir: str | None, proposers: tuple[str, ...], files: tuple[Path, ...]) -> None:
    """Copy FILES into the inbox (NAME.py, NAME.toml sidecar, NAME.new.py starting candidate)."""
    home = resolve_home(home_dir)
    with tempfile.TemporaryDirectory(prefix="kernelab-submit-") as tmp:
        chosen = list(files)
        if proposers:
            from kernelabd.config import ConfigError, load
            from kernelabd.propose.agent import unconfigured

            try:
                unknown = unconfigured(proposers, load(home.config))
            except ConfigError as exc:
                unknown = str(exc)
            if unknown:
                click.echo(f"kernelab submit: {unknown}", err=True)
                sys.exit(2)
            chosen = with_proposers(chosen, list(proposers), Path(tmp))
        for placed in submit_files(home, chosen):
            click.echo(str(placed))
