"""Where kernelab keeps its state: ``--home``, else ``$KERNELAB_HOME``, else systemd's
``$STATE_DIRECTORY``, else the XDG state directory.

It lives in ``store`` because both the daemon and the TUI must agree on it, and the TUI may
import nothing else of ours.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import platformdirs


@dataclass(frozen=True)
class Home:
    """The layout of one kernelab home directory."""

    root: Path

    @property
    def config(self) -> Path:
        return self.root / "kernelab.toml"

    @property
    def inbox(self) -> Path:
        return self.root / "inbox"

    @property
    def results(self) -> Path:
        return self.root / "results"

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def db(self) -> Path:
        return self.root / "kernelab.db"


def resolve_home(explicit: str | os.PathLike[str] | None = None) -> Home:
    """Pick the home directory by the documented order of precedence (creates nothing)."""
    if explicit:
        return Home(Path(explicit).expanduser().resolve())
    for var in ("KERNELAB_HOME", "STATE_DIRECTORY"):
        value = os.environ.get(var)
        if value:
            # systemd may pass several colon-separated directories; the first is ours.
            return Home(Path(value.split(":")[0]).expanduser().resolve())
    return Home(Path(platformdirs.user_state_dir("kernelab")))
