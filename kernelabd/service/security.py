"""The inbox is a trust boundary: a reference is Python code, so writing into the inbox means
running code as the daemon's user. Only the daemon's group may write there.

``check_inbox_permissions`` is what the daemon calls before watching; ``kernelab service
install`` and the unit create the inbox as ``INBOX_MODE`` (setgid, group-writable, nothing for
others), owned by the kernelab user and group.
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

INBOX_MODE = 0o2770


def _owner(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _writable_by_others(mode: int) -> bool:
    return bool(mode & stat.S_IWOTH)


def _replaceable_by_others(mode: int) -> bool:
    """A world-writable directory lets anyone rename or delete its entries, unless it is
    sticky (like /tmp), where only an entry's owner may do so."""
    return _writable_by_others(mode) and not mode & stat.S_ISVTX


def _ancestors(path: Path) -> list[Path]:
    """Every directory whose write permission decides who can replace ``path``: its parents as
    written and, when a symlink is involved, those of where it really lives."""
    chains = [*path.absolute().parents, *path.resolve().parents]
    return list(dict.fromkeys(chains))


def inbox_problem(path: str | os.PathLike[str]) -> tuple[str, str] | None:
    """Why users outside the daemon's group could put code in the inbox at ``path``, and the
    fix, as ``(reason, fix)``; ``None`` when it is safe (or does not exist yet).

    Unsafe: an inbox writable by others (even sticky: anyone could still drop a file), or a
    parent directory that others may write to without the sticky bit (they could swap the
    inbox for a directory of their own).
    """
    inbox = Path(path)
    try:
        st = inbox.stat()
    except FileNotFoundError:
        return None
    user = _owner(os.geteuid())
    if not stat.S_ISDIR(st.st_mode):
        return f"{inbox} is not a directory", f"remove it; the inbox is a {INBOX_MODE:04o} folder"
    if _writable_by_others(st.st_mode):
        return (f"{inbox} (mode {stat.S_IMODE(st.st_mode):04o}) lets every user drop code "
                f"that kernelab runs as {user}",
                f"chmod o-rwx {inbox} (kernelab service install makes it {INBOX_MODE:04o}, "
                f"group kernelab)")
    for parent in _ancestors(inbox):
        try:
            pmode = parent.stat().st_mode
        except OSError:
            continue
        if _replaceable_by_others(pmode):
            return (f"parent {parent} of {inbox} (mode {stat.S_IMODE(pmode):04o}) lets every "
                    f"user replace the inbox with code that kernelab runs as {user}",
                    f"chmod o-w {parent}, or move the kernelab home where only kernelab can "
                    f"write")
    return None


def check_inbox_permissions(path: str | os.PathLike[str]) -> str | None:
    """A one-line refusal to watch the inbox at ``path`` when others could put code in it;
    ``None`` when watching it is safe. The daemon calls this before it starts watching."""
    problem = inbox_problem(path)
    if problem is None:
        return None
    reason, fix = problem
    return f"refusing to watch the inbox: {reason}; fix: {fix}"
