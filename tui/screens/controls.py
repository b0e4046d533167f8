"""Job controls shared by the dashboard and the job detail screen.

A control is one row in the ``commands`` table; the daemon applies it and records the
outcome. The TUI checks only what it can see (the job's state, write access) so that an
obviously useless command is explained instead of queued.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from textual.binding import Binding
from textual.screen import Screen

from tui.data import ALLOWED_STATES, Job
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
    """A screen with a current job that the control keys act on."""

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
                    self.kapp.send_command(verb, job)
            self.app.push_screen(
                ConfirmScreen(f"Cancel job {job.id} ({job.problem})? Its candidates are kept."),
                confirmed)
            return
        self.kapp.send_command(verb, job)

    def action_priority(self, delta: int) -> None:
        job = self._controllable("priority")
        if job is not None:
            self.kapp.send_command("priority", job, str(job.priority + delta))

    def _controllable(self, verb: str) -> Job | None:
        if not self.kapp.controls_on:
            self.notify("controls off (read-only database)", severity="warning")
            return None
        job = self.current_job()
        if job is None:
            self.notify("no job selected", severity="warning")
            return None
        if job.state not in ALLOWED_STATES[verb]:
            self.notify(f"job {job.id} is {job.state}: nothing to {verb}", severity="warning")
            return None
        return job
