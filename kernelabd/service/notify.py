"""systemd's notify protocol: datagrams to ``$NOTIFY_SOCKET``; a no-op outside systemd.

No dependency is needed: the protocol is one ``KEY=VALUE`` datagram per message
(sd_notify(3)); an abstract socket is spelled with a leading ``@``.
"""

from __future__ import annotations

import os
import socket


def _one_line(text: str) -> str:
    """Each line of a datagram is one assignment: a newline inside a status (an exception
    message, say) would otherwise let it inject ``READY=1`` or ``WATCHDOG=1``."""
    return " ".join(text.splitlines())


class Notifier:
    """Tells systemd we are ready, what we are doing, and that we are alive."""

    def __init__(self, address: str | None, watchdog_usec: int | None = None) -> None:
        self.address = address
        self.watchdog_usec = watchdog_usec

    @classmethod
    def from_env(cls) -> Notifier:
        watchdog = os.environ.get("WATCHDOG_USEC")
        pid = os.environ.get("WATCHDOG_PID")
        usec = int(watchdog) if watchdog and watchdog.isdigit() else None
        if pid and pid.isdigit() and int(pid) != os.getpid():
            usec = None  # the watchdog is meant for another process
        return cls(os.environ.get("NOTIFY_SOCKET"), usec)

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    @property
    def watchdog_interval_s(self) -> float | None:
        """How often to ping: half the watchdog period, as sd_watchdog_enabled(3) advises."""
        return self.watchdog_usec / 2e6 if self.watchdog_usec else None

    def send(self, *lines: str) -> bool:
        if not self.address:
            return False
        addr = self.address
        if addr.startswith("@"):
            addr = "\0" + addr[1:]
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            try:
                sock.sendto("\n".join(lines).encode(), addr)
            except OSError:
                return False
        return True

    def ready(self, status: str | None = None) -> bool:
        return self.send("READY=1", *([f"STATUS={_one_line(status)}"] if status else []))

    def status(self, text: str) -> bool:
        return self.send(f"STATUS={_one_line(text)}")

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")

    def stopping(self) -> bool:
        return self.send("STOPPING=1")
