"""Job controls shared by the dashboard and the job detail screen.

A control is one row in the ``commands`` table; the daemon applies it and records the
outcome. The TUI checks only what it can see (the job's state, write access) so that an
obviously useless command is explained instead of queued.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen

from store.records import COMMAND_STATES
from tui.data import Job
from tui.screens.confirm import ConfirmScreen

if TYPE_CHECKING:
    from tui.app import KernelabApp

CONTROL_BINDINGS = [
    Binding("p", "control('pause')", "Pause"),
    Binding("r", "control('resume')", "Resume"),
    Binding("c", "control('cancel')", "Cancel"),
    Binding("R", "control('retry')", "Retry"),
    Binding("plus", "priority(1)", "Pri+"),
    Binding("minus", "priority(-1)", "Pri-"),
]


class JobControls(Screen[None]):
    """A screen with a current job that the control keys act on. A control is posted as a
    ``CommandRequested`` message, which the app writes to the database."""

    class CommandRequested(Message):
        """The user asked for ``verb`` (with ``arg``) on ``job``, and confirmed if asked to."""

        def __init__(self, verb: str, job: Job, arg: str | None = None) -> None:
            super().__init__()
            self.verb, self.job, self.arg = verb, job, arg

    @property
    def kapp(self) -> KernelabApp:
        return cast("KernelabApp", self.app)

    def current_job(self) -> Job | None:
        """The job the controls apply to; screens override this."""
        raise NotImplementedError

    def action_control(self, verb: str) -> None:
        job = self._controllable(verb)
        if job is None:
            return
        if verb == "cancel":
            def confirmed(answer: bool | None) -> None:
                if answer:
                    self.post_message(self.CommandRequested(verb, job))
            self.app.push_screen(
                ConfirmScreen(f"Cancel job {job.id} ({job.problem})? Its candidates are kept."),
                confirmed)
            return
        self.post_message(self.CommandRequested(verb, job))

    def action_priority(self, delta: int) -> None:
        job = self._controllable("priority")
        if job is not None:
            self.post_message(self.CommandRequested("priority", job, str(job.priority + delta)))

    def _controllable(self, verb: str) -> Job | None:
        if not self.kapp.controls_on:
            self.notify("controls off (read-only database)", severity="warning")
            return None
        job = self.current_job()
        if job is None:
            self.notify("no job selected", severity="warning")
            return None
        if job.state not in COMMAND_STATES[verb]:
            self.notify(f"job {job.id} is {job.state}: nothing to {verb}", severity="warning")
            return None
        return job
