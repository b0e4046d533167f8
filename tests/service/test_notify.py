"""sd_notify(3) over real AF_UNIX datagram sockets: a path socket, an abstract ``@`` socket,
and a child process checked the way systemd checks it (SO_PASSCRED sender pid)."""

from __future__ import annotations

import itertools
import os
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelabd.service.notify import Notifier

UCRED = struct.Struct("3i")   # struct ucred: pid, uid, gid


@pytest.fixture
def path_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    address = str(tmp_path / "notify.sock")
    sock.bind(address)
    sock.settimeout(5)
    yield sock, address
    sock.close()


@pytest.fixture
def abstract_socket() -> Iterator[tuple[socket.socket, str]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    name = f"kernelab-test-{uuid.uuid4().hex}"
    sock.bind("\0" + name)
    sock.settimeout(5)
    yield sock, "@" + name
    sock.close()


def receive(sock: socket.socket) -> list[str]:
    return sock.recv(4096).decode().split("\n")


@pytest.mark.parametrize("which", ["path_socket", "abstract_socket"])
def test_ready_status_watchdog_stopping(which: str, request: pytest.FixtureRequest,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    sock, address = request.getfixturevalue(which)
    monkeypatch.setenv("NOTIFY_SOCKET", address)
    notifier = Notifier.from_env()
    assert notifier.enabled
    assert notifier.ready("watching /var/lib/kernelab/inbox")
    assert receive(sock) == ["READY=1", "STATUS=watching /var/lib/kernelab/inbox"]
    assert notifier.status("2 jobs queued")
    assert receive(sock) == ["STATUS=2 jobs queued"]
    assert notifier.watchdog()
    assert receive(sock) == ["WATCHDOG=1"]
    assert notifier.stopping()
    assert receive(sock) == ["STOPPING=1"]


def test_a_multiline_status_cannot_inject_assignments(path_socket: tuple[socket.socket, str]
                                                      ) -> None:
    sock, address = path_socket
    Notifier(address).status("job 3 failed:\nREADY=1\nWATCHDOG=1")
    lines = receive(sock)
    assert len(lines) == 1
    assert lines[0].startswith("STATUS=job 3 failed:")


def test_outside_systemd_everything_is_a_quiet_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    notifier = Notifier.from_env()
    assert not notifier.enabled
    assert notifier.ready() is False
    assert notifier.watchdog() is False


def test_a_vanished_manager_does_not_raise(tmp_path: Path) -> None:
    assert Notifier(str(tmp_path / "gone.sock")).watchdog() is False


def test_watchdog_interval_is_half_the_period(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert Notifier.from_env().watchdog_interval_s == 15.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))
    assert Notifier.from_env().watchdog_interval_s is None, "meant for another process"
    monkeypatch.delenv("WATCHDOG_PID")
    monkeypatch.setenv("WATCHDOG_USEC", "0")
    assert Notifier.from_env().watchdog_interval_s is None


CHILD = """
import time
from kernelabd.service.notify import Notifier
n = Notifier.from_env()
n.ready("up")
for _ in range(4):
    time.sleep(n.watchdog_interval_s)
    n.watchdog()
n.stopping()
"""


def test_child_pings_in_time_from_its_own_pid(path_socket: tuple[socket.socket, str]) -> None:
    """What systemd enforces: messages come from the main PID (NotifyAccess=main) and
    WATCHDOG=1 arrives more often than WATCHDOG_USEC."""
    sock, address = path_socket
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    period_s = 0.4
    env = {**os.environ, "NOTIFY_SOCKET": address, "WATCHDOG_USEC": str(int(period_s * 1e6))}
    proc = subprocess.Popen([sys.executable, "-c", CHILD], env=env)
    messages: list[tuple[float, int, str]] = []
    while not messages or messages[-1][2] != "STOPPING=1":
        data, ancdata, _, _ = sock.recvmsg(4096, socket.CMSG_SPACE(UCRED.size))
        creds = [UCRED.unpack(d[:UCRED.size]) for level, kind, d in ancdata
                 if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS]
        messages.append((time.monotonic(), creds[0][0], data.decode()))
    assert proc.wait(timeout=10) == 0
    assert [m[2] for m in messages] == ["READY=1\nSTATUS=up", *["WATCHDOG=1"] * 4, "STOPPING=1"]
    assert {m[1] for m in messages} == {proc.pid}
    times = [m[0] for m in messages[:-1]]   # READY, then every ping
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert max(gaps) < period_s
