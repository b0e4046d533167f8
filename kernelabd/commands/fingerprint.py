"""``kernelab fingerprint FILE [B] [--arch sm_90] [--json]``: what each kernel of a candidate
becomes on the machine, made without a GPU.

One file: its kernels' registers, spills, shared memory, launch and SASS instruction mix. Two
files: side by side, every figure that differs marked. Exit 0 on success, 1 when a CUDA source
does not compile (the compiler's log follows), 2 when a file cannot be fingerprinted.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

ARCH = "sm_90"


def _fingerprint(path: str, arch: str, reference: str | None) -> list:
    from kernelabd.fingerprint.build import fingerprint_file

    return fingerprint_file(Path(path), arch, Path(reference) if reference else None)


def _fail(message: str, code: int, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"error": message}))
    else:
        click.echo(f"error: {message}", err=True)
    sys.exit(code)


@click.command()
@click.argument("files", nargs=-1, required=True)
@click.option("--arch", default=ARCH, show_default=True, help="Architecture to compile for (sm_NN).")
@click.option("--reference", default=None,
              help="Reference whose GPU sizes drive forward (default: NAME.py beside NAME.new.py).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
def fingerprint(files: tuple[str, ...], arch: str, reference: str | None, as_json: bool) -> None:
    """Fingerprint FILE's kernels for ARCH, or compare two files' (A B), without a GPU."""
    from kernelabd.cudalang.loader import CompileError
    from kernelabd.fingerprint import differences, render, render_pair, to_json
    from kernelabd.fingerprint.build import FingerprintError

    if len(files) > 2:
        _fail("fingerprint takes one file, or two to compare", 2, as_json)
    prints = []
    for path in files:
        try:
            prints.append(_fingerprint(path, arch, reference))
        except CompileError as exc:
            _fail(f"{path}: {exc}", 1, as_json)
        except FingerprintError as exc:
            _fail(str(exc), 2, as_json)
    if len(prints) == 1:
        click.echo(json.dumps(to_json(prints[0]), indent=1) if as_json else render(prints[0]))
        return
    a, b = prints
    if as_json:
        click.echo(json.dumps({"a": to_json(a), "b": to_json(b), "differences": differences(a, b)},
                              indent=1))
    else:
        click.echo(render_pair(a, b, Path(files[0]).name, Path(files[1]).name))
