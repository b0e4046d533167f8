"""The real ``kernelab tui`` process in a real terminal: a pty for hang-up, tmux for what a
user sees (read-only controls, and a live job from a real daemon on CPU)."""

from __future__ import annotations

import contextlib
import os
import pty
import re
import select
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from store import connect
from tests.tui import tuidb

ROOT = Path(__file__).resolve().parents[2]
KERNELAB = str(Path(sys.executable).with_name("kernelab"))
ANSI = re.compile(rb"\x1b\[[0-9;?<>=]*[ -/]*[@-~]|\x1b[P\]_^][^\x1b]*\x1b\\|\x1b.")

needs_tmux = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


def read_until(fd: int, needle: bytes, timeout: float) -> bytes:
    """Read a pty until ``needle`` appears in its output with escape sequences removed."""
    seen = b""
    deadline = time.monotonic() + timeout
    while needle not in ANSI.sub(b"", seen):
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise AssertionError(f"{needle!r} not on screen after {timeout} s")
        seen += os.read(fd, 65536)
    return seen


def test_sighup_ends_the_process_cleanly(db_path: Path) -> None:
    """A dropped SSH connection closes the pty; the TUI must exit 0 promptly, not spin."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: the pty is its controlling terminal, as under sshd
        os.environ["TERM"] = "xterm-256color"
        os.execv(KERNELAB, [KERNELAB, "tui", "--home", str(db_path.parent)])
    try:
        read_until(fd, b"softmax", timeout=15)
        os.kill(pid, signal.SIGHUP)
        deadline = time.monotonic() + 5
        done = 0
        while not done and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                os.read(fd, 65536)       # keep draining so the child never blocks on output
            done, status = os.waitpid(pid, os.WNOHANG)
            time.sleep(0.02)
        assert done, "kernelab tui still running 5 s after SIGHUP"
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    finally:
        if not done:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)


class Tmux:
    """One tmux server of our own (its own socket), so tests never touch a user's sessions."""

    def __init__(self) -> None:
        self.socket = f"kernelab-test-{os.getpid()}-{time.monotonic_ns()}"

    def run(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True,
                              text=True, check=True).stdout

    def start(self, name: str, command: str, width: int = 80, height: int = 24) -> None:
        self.run("new-session", "-d", "-s", name, "-x", str(width), "-y", str(height),
                 "-c", str(ROOT), command)
        self.run("set-option", "-t", name, "remain-on-exit", "on")

    def screen(self, name: str) -> str:
        return self.run("capture-pane", "-p", "-t", name)

    def wait_for(self, name: str, pattern: str, timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while True:
            match = re.search(pattern, self.screen(name))
            if match:
                return match
            if time.monotonic() > deadline:
                raise AssertionError(f"{pattern!r} not on screen after {timeout} s:\n"
                                     f"{self.screen(name)}")
            time.sleep(0.25)

    def keys(self, name: str, *keys: str) -> None:
        self.run("send-keys", "-t", name, *keys)

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)


@pytest.fixture
def tmux() -> Iterator[Tmux]:
    server = Tmux()
    yield server
    server.kill()


@needs_tmux
def test_controls_are_off_for_a_user_who_cannot_write(tmux: Tmux) -> None:
    """With the database and its directory read-only for this user, the TUI shows everything,
    says controls are off, and a control key writes nothing. Root runs the TUI without its
    capabilities, so that file permissions bind it as they bind any other user."""
    base = Path(tempfile.mkdtemp(prefix="kernelab-ro-"))
    try:
        db_path = tuidb.build(base / "kernelab.db")
        writer = connect(db_path)            # the daemon's connection keeps the WAL index
        db_path.chmod(0o444)
        base.chmod(0o555)
        command = f"{KERNELAB} tui --home {base}"
        if os.geteuid() == 0:
            command = f"setpriv --inh-caps=-all --bounding-set=-all {command}"
        tmux.start("ro", f"env TERM=xterm-256color {command}")
        tmux.wait_for("ro", r"controls off \(read-only database\)", timeout=15)
        tmux.wait_for("ro", r"softmax", timeout=5)
        tmux.keys("ro", "p")
        tmux.wait_for("ro", r"controls off", timeout=5)
        assert writer.execute("SELECT COUNT(*) FROM commands").fetchone()[0] == 0
        writer.close()
    finally:
        base.chmod(0o755)
        shutil.rmtree(base, ignore_errors=True)


DAEMON = ROOT / "kernelabd" / "commands" / "daemon.py"


@needs_tmux
@pytest.mark.slow
@pytest.mark.skipif(not DAEMON.exists(),
                    reason="kernelabd/commands/daemon.py has not landed: no daemon to watch")
def test_tui_shows_a_real_daemons_job_and_candidates(tmux: Tmux, home) -> None:
    """End to end: real daemon on CPU, real TUI in tmux, an example submitted to the inbox."""
    h = str(home.root)
    tmux.start("daemon", f"{KERNELAB} daemon --home {h} --device cpu", width=120)
    tmux.start("tui", f"env TERM=xterm-256color {KERNELAB} tui --home {h}", width=120,
               height=36)
    tmux.wait_for("tui", r"daemon up", timeout=60)
    examples = [ROOT / "examples" / n for n in ("softmax.toml", "softmax.new.py", "softmax.py")]
    subprocess.run([KERNELAB, "submit", "--home", h, *map(str, examples)], check=True,
                   capture_output=True, timeout=60)
    row = tmux.wait_for("tui", r"\d+\s+softmax\s+(running|done|queued)\s+[1-9]\d*\s",
                        timeout=240)
    assert "softmax" in row.group(0)
    tmux.keys("tui", "enter")
    tmux.wait_for("tui", r"candidates", timeout=10)
    tmux.wait_for("tui", r"\b(pass|fail|error)\b", timeout=30)
    conn = sqlite3.connect(f"file:{home.db}?mode=ro", uri=True)
    assert conn.execute("SELECT COUNT(*) FROM candidates").fetchone()[0] >= 1
    conn.close()
