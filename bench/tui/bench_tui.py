"""Measure ``kernelab tui``: start-up to first full frame, CPU idle and under a writer, and
latency from a database write to the screen.

Runs the real command in a pty (80×24) against the fixed test database in a temporary home,
with a second connection playing the daemon. Usage: ``python bench/tui/bench_tui.py``.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import pty
import re
import select
import signal
import sqlite3
import statistics
import struct
import sys
import tempfile
import termios
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "tui"))

import tuidb  # noqa: E402

from store import connect  # noqa: E402

KERNELAB = str(Path(sys.executable).with_name("kernelab"))
ANSI = re.compile(rb"\x1b\[[0-9;?<>=]*[ -/]*[@-~]|\x1b[P\]_^][^\x1b]*\x1b\\|\x1b.")
CLK_TCK = os.sysconf("SC_CLK_TCK")


class Tui:
    """``kernelab tui`` in a pty whose output we drain and search."""

    def __init__(self, home: Path) -> None:
        self.started = time.monotonic()
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.environ["TERM"] = "xterm-256color"
            os.execv(KERNELAB, [KERNELAB, "tui", "--home", str(home)])
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        self.text = b""

    def pump(self, timeout: float) -> None:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if ready:
            self.text += ANSI.sub(b"", os.read(self.fd, 1 << 20))

    def wait_for(self, needle: bytes, timeout: float = 30) -> float:
        deadline = time.monotonic() + timeout
        while needle not in self.text:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{needle!r} never appeared")
            self.pump(0.01)
        return time.monotonic()

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def drain_for(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.pump(min(0.1, end - time.monotonic()))

    def stop(self) -> None:
        os.kill(self.pid, signal.SIGHUP)
        os.waitpid(self.pid, 0)
        os.close(self.fd)


def cpu_percent(tui: Tui, seconds: float, writer_every: float | None,
                conn: sqlite3.Connection) -> float:
    before, start = tui.cpu_s(), time.monotonic()
    next_write = start
    while time.monotonic() - start < seconds:
        if writer_every is not None and time.monotonic() >= next_write:
            with conn:
                tuidb.add_candidate(conn, 1, edit="bench", verdict="pass", ms=0.35)
            next_write += writer_every
        tui.pump(0.05)
    return 100 * (tui.cpu_s() - before) / (time.monotonic() - start)


def main() -> None:
    runs: dict[str, list[float]] = {"startup_s": [], "latency_s": []}
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(5):
            home = Path(tmp) / f"start{n}"
            tuidb.build(home / "kernelab.db")
            conn = connect(home / "kernelab.db")
            tui = Tui(home)
            runs["startup_s"].append(tui.wait_for(b"inputs_modified") - tui.started)
            tui.stop()
            conn.close()
        home = Path(tmp) / "live"
        tuidb.build(home / "kernelab.db")
        conn = connect(home / "kernelab.db")
        tui = Tui(home)
        tui.wait_for(b"inputs_modified")
        tui.drain_for(2)
        idle = cpu_percent(tui, 30, None, conn)
        writing = cpu_percent(tui, 30, 1.0, conn)
        for i in range(20):                          # a gate failure of the selected job
            marker = f"probe{i:03d}"
            time.sleep(0.5 + 0.037 * i)              # spread writes across the poll phase
            with conn:
                tuidb.add_candidate(conn, 2, edit="probe", verdict="fail", ms=None,
                                    rule=marker, evidence={"input_set": i})
            written = time.monotonic()
            runs["latency_s"].append(tui.wait_for(marker.encode(), 5) - written)
        tui.stop()
        conn.close()
    lat = sorted(runs["latency_s"])
    result = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                   f"{platform.system()} {platform.release()}, Python {platform.python_version()}",
        "startup_to_first_full_frame_s": {"median": statistics.median(runs["startup_s"]),
                                          "max": max(runs["startup_s"])},
        "cpu_idle_pct_of_one_core": round(idle, 2),
        "cpu_one_candidate_per_s_pct_of_one_core": round(writing, 2),
        "write_to_screen_latency_s": {"median": statistics.median(lat),
                                      "p90": lat[int(0.9 * (len(lat) - 1))], "max": lat[-1]},
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
