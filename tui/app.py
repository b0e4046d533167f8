"""The kernelab TUI application: one read-only reader, a poller, and the screens.

The poller runs on the UI thread every ``POLL_S`` seconds but costs microseconds: it asks
SQLite for ``data_version`` and stats the file. Only when those change does it tell the
screens, which load in worker threads and redraw only the widgets whose data differs. That
keeps an idle TUI near 0 % CPU and puts a daemon's write on screen within about half a second.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from textual import on
from textual.app import App
from textual.binding import Binding, BindingType
from textual.dom import DOMNode
from textual.worker import get_current_worker

from store import StoreError
from tui.data import Overview, Reader, controls_available, send_command
from tui.messages import DataChanged
from tui.screens.controls import JobControls
from tui.screens.dashboard import Dashboard
from tui.screens.help import HelpScreen
from tui.widgets.status import StatusBar, status_text

T = TypeVar("T")

POLL_S = 0.25
"""Poll period: twice this is the worst-case delay from a daemon write to the screen."""


class KernelabApp(App[None]):
    """``kernelab tui``. ``now`` is injectable so snapshots of the daemon's liveness are fixed."""

    CSS_PATH = "kernelab.tcss"
    TITLE = "kernelab"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit"),
        Binding("question_mark", "help", "Help"),
    ]

    def __init__(self, db_path: Path, *, now: Callable[[], float] = time.time,
                 poll_s: float = POLL_S, handle_signals: bool = False) -> None:
        super().__init__()
        self.db_path = db_path
        self.reader = Reader(db_path)
        self.now = now
        self.poll_s = poll_s
        self.generation = 0
        self.controls_on = controls_available(db_path)
        self._handle_signals = handle_signals
        self._overview: Overview | None = None
        self._tty_fd: int | None = None

    def on_mount(self) -> None:
        if self._handle_signals:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGHUP, signal.SIGTERM):
                loop.add_signal_handler(sig, self._hang_up)
            stdin = sys.__stdin__
            if stdin is not None and os.isatty(stdin.fileno()):
                self._tty_fd = stdin.fileno()
        self.reader.poll()
        self.push_screen(Dashboard())
        self.set_interval(self.poll_s, self._poll)

    def on_unmount(self) -> None:
        self.reader.close()

    def _hang_up(self) -> None:
        """The terminal went away (SSH dropped) or we were asked to stop: exit cleanly now
        rather than let Textual spin on a dead terminal."""
        self.exit()

    def _poll(self) -> None:
        if not self.screen_stack:
            return  # shutting down: Textual closes the screens before it stops our timer
        if self._tty_fd is not None and not os.isatty(self._tty_fd):
            self._hang_up()
            return
        if self.reader.poll():
            self.generation += 1
            self.controls_on = controls_available(self.db_path)
            for screen in self.screen_stack:
                screen.post_message(DataChanged())
        else:
            for bar in self.screen.query(StatusBar):
                bar.show(self.status_line())

    def status_line(self, overview: Overview | None = None) -> str:
        """The status bar's text; a screen that loaded a fresh overview passes it in."""
        if overview is not None:
            self._overview = overview
        return status_text(self._overview, self.reader.error, self.now(), self.controls_on)

    def load(self, owner: DOMNode, query: Callable[[sqlite3.Connection], T],
             apply: Callable[[T | None], Awaitable[None] | None]) -> None:
        """Run ``query`` on the reader in a thread, then ``apply`` its result on the UI thread
        (None when the database cannot be read). A newer load of the same kind supersedes an
        older one that has not finished."""
        def work() -> None:
            try:
                result: Any = self.reader.read(query)
            except (StoreError, sqlite3.Error):
                result = None
            if not get_current_worker().is_cancelled:
                self.call_from_thread(apply, result)

        owner.run_worker(work, thread=True, exclusive=True, exit_on_error=False,
                         group=f"load-{getattr(apply, '__name__', 'apply')}")

    @on(JobControls.CommandRequested)
    def _command_requested(self, request: JobControls.CommandRequested) -> None:
        """Queue a command in a worker (the write may wait on the daemon's lock)."""
        verb, job, arg = request.verb, request.job, request.arg

        def work() -> None:
            try:
                send_command(self.db_path, verb, job.id, arg, now=self.now)
            except sqlite3.Error as exc:
                self.call_from_thread(self.notify, f"{verb} failed: {exc}", severity="error")
                return
            shown = f"{verb} {arg}" if arg else verb
            self.call_from_thread(self.notify, f"{shown} → job {job.id} ({job.problem}) sent")

        self.run_worker(work, thread=True, group="command")

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())
