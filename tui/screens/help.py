"""The help screen: every key, and where the data comes from."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

HELP = """\
[b]kernelab tui[/b] — watch the daemon through its database

[b]Everywhere[/b]
  q            quit                    ?          this help
  ↑ ↓  j k     move                    g G        first / last row
  tab          next panel              escape     back / close

[b]Dashboard[/b]
  enter        open the selected job   /          filter jobs (escape clears)
  s            sort: state, priority, id, name, speedup

[b]Job detail[/b]
  1 … 8        source, diff vs parent, timing, clock, gate, agent transcript,
               machine code, screened configurations (the job's)
  h  escape    back to the dashboard

[b]Controls[/b] (written to the commands table; the daemon applies them)
  p pause   r resume   c cancel (asks first)   R retry   + / - priority

Queue: ×ref speedup over the reference, ×peer over the best of eager and
torch.compile; a long name is shortened in the middle (the job shows it).
Chart: • candidate time, x gate failure (never timed), step line the
incumbent, reference with its noise band, = speed-of-light floor.
Controls are off when this user cannot write the database.
"""


class HelpScreen(ModalScreen[None]):
    """Closed by escape, q or ? again."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,question_mark", "close", "Close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            yield Static(HELP, markup=True)

    def action_close(self) -> None:
        self.dismiss(None)
