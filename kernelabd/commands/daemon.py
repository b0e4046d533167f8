"""``kernelab daemon`` (also ``kernelabd``): watch the inbox, queue jobs, converge."""

from __future__ import annotations

import sys

import click

from kernelabd.client import ensure_home, home_option
from kernelabd.config import ConfigError, load
from kernelabd.log import log_level_option, setup_logging
from store.db import StoreError
from store.home import resolve_home


@click.command()
@home_option
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None,
              help="cpu: one CPU worker (Triton interpreter); cuda: every GPU NVML finds "
                   "(default: GPUs if any, else the CPU).")
@click.option("--once", is_flag=True,
              help="Process what is in the inbox, wait for every job to end, exit 0.")
@log_level_option
def daemon(home_dir: str | None, device: str | None, once: bool, log_level: str | None) -> None:
    """Run the daemon until SIGTERM (or, with --once, until the inbox's jobs are done)."""
    from kernelabd.service.daemon import AlreadyRunning, Daemon, Options
    from kernelabd.service.devices import DeviceError

    home = ensure_home(resolve_home(home_dir))
    try:
        config = load(home.config)
        setup_logging(log_level or config.daemon.log_level)
        code = Daemon(home, config, Options(device=device, once=once)).run()
    except (ConfigError, ValueError) as exc:
        click.echo(f"kernelab daemon: {exc}", err=True)
        sys.exit(2)
    except (AlreadyRunning, DeviceError, StoreError) as exc:
        click.echo(f"kernelab daemon: {exc}", err=True)
        sys.exit(1)
    sys.exit(code)
