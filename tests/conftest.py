"""Shared fixtures: a throw-away kernelab home with settings sized for a 2-core CI machine,
and helpers to run the real ``kernelab`` CLI and daemon as subprocesses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from store.home import Home

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
KERNELAB = [str(Path(sys.executable).with_name("kernelab"))]

# Small budgets: a CPU check then takes seconds, and a job a handful of checks.
FAST_TOML = """\
[daemon]
stable_s = 0.5
rescan_s = 5.0
[jobs]
max_candidates = {max_candidates}
proposers = ["tune"]
peers = []
[timing]
budget_s = 0.5
min_pairs = 2
"""


def write_config(home: Home, max_candidates: int = 2) -> None:
    home.inbox.mkdir(parents=True, exist_ok=True)
    home.config.write_text(FAST_TOML.format(max_candidates=max_candidates))


@pytest.fixture
def home(tmp_path: Path) -> Home:
    h = Home(tmp_path / "home")
    write_config(h)
    return h


def cli(home: Home, *args: str, check: bool = True,
        timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``kernelab ARGS --home HOME`` the way a user does."""
    return subprocess.run([*KERNELAB, *args, "--home", str(home.root)], capture_output=True,
                          text=True, check=check, timeout=timeout, cwd=ROOT)


def status(home: Home) -> dict[str, Any]:
    return json.loads(cli(home, "status", "--json").stdout)


def job_of(home: Home, problem: str) -> dict[str, Any] | None:
    return next((j for j in status(home)["jobs"] if j["problem"] == problem), None)


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, step: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def drop(home: Home, *names: str) -> None:
    """Submit example files (by name) into the home's inbox."""
    cli(home, "submit", *(str(EXAMPLES / n) for n in names))


class DaemonProcess:
    """A real ``kernelab daemon`` subprocess with its log in a file."""

    def __init__(self, home: Home, *args: str, env: dict[str, str] | None = None) -> None:
        self.log = home.root / f"daemon-{time.monotonic_ns()}.log"
        self.home = home
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(
                [*KERNELAB, "daemon", "--home", str(home.root), "--device", "cpu", *args],
                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                env={**os.environ, **(env or {})})

    def output(self) -> str:
        return self.log.read_text()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout)


class Kit:
    """The helpers tests use, bound to one home (a fixture, so test modules import nothing)."""

    examples = EXAMPLES

    def __init__(self, home: Home) -> None:
        self.home = home
        self.started: list[DaemonProcess] = []

    def cli(self, *args: str, check: bool = True,
            timeout: float = 120) -> subprocess.CompletedProcess:
        return cli(self.home, *args, check=check, timeout=timeout)

    def status(self) -> dict[str, Any]:
        return status(self.home)

    def job_of(self, problem: str) -> dict[str, Any] | None:
        return job_of(self.home, problem)

    def drop(self, *names: str) -> None:
        drop(self.home, *names)

    wait_for = staticmethod(wait_for)

    def daemon(self, *args: str, env: dict[str, str] | None = None) -> DaemonProcess:
        d = DaemonProcess(self.home, *args, env=env)
        self.started.append(d)
        return d

    def cleanup(self) -> None:
        """Kill daemons a test left running (their workers die with them)."""
        for d in self.started:
            if d.proc.poll() is None:
                d.proc.kill()
                d.proc.wait(10)


@pytest.fixture
def kit(home: Home) -> Iterator[Kit]:
    k = Kit(home)
    yield k
    k.cleanup()
