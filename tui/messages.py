"""Messages passed between the app's poller and its screens."""

from __future__ import annotations

from textual.message import Message


class DataChanged(Message):
    """The database changed (or became readable, or unreadable): screens reload what they show.

    Posted by the app to every screen on its stack, because a modal shows the screen beneath.
    """
