"""``kernelab demo``: the daemon on the bundled examples, in a throw-away home, start to end.

It is the README's first command: a real daemon process run with ``--once`` on the examples
(reference, sidecar and starting Triton candidate each), with a configuration sized so that
the whole demo ends in minutes on a laptop CPU. Results land in ``DIR/results/``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click

from kernelabd.client import ensure_home, submit
from store.home import Home

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DEMO_TOML = """\
# A quick demo configuration: a few candidates per job, short timing budgets.
[jobs]
max_candidates = 3
patience = 2
proposers = ["tune"]

[timing]
budget_s = 1.0
min_pairs = 3
"""


@click.command()
@click.option("--home", "home_dir", type=click.Path(file_okay=False), default="demo-home",
              show_default=True, help="Home directory for the demo (created if missing).")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None,
              help="Default: GPUs if any, else the CPU (Triton interpreter).")
def demo(home_dir: str, device: str | None) -> None:
    """Submit the bundled examples and run the daemon until their jobs end."""
    if not EXAMPLES.is_dir():
        raise click.ClickException(f"no examples at {EXAMPLES}: run the demo from a checkout")
    home = Home(Path(home_dir).resolve())
    if not home.config.exists():
        home.root.mkdir(parents=True, exist_ok=True)
        home.config.write_text(DEMO_TOML)
    ensure_home(home)
    files = sorted(p for p in EXAMPLES.iterdir() if p.suffix in (".py", ".toml"))
    submit(home, files)
    click.echo(f"submitted {len(files)} files from {EXAMPLES} to {home.inbox}", err=True)
    base = [sys.executable, "-m", "kernelabd"]
    daemon = [*base, "daemon", "--home", str(home.root), "--once", *(["--device", device] if device else [])]
    code = subprocess.call(daemon)
    subprocess.call([*base, "status", "--home", str(home.root)])
    click.echo(f"results: {home.results}  (watch live next time: kernelab tui --home {home.root})",
               err=True)
    sys.exit(code)
