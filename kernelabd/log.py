"""Structured logging: one ``key=value`` line per event on stdout.

Under systemd, stdout goes to journald, which stamps each line itself and reads a ``<N>``
syslog-priority prefix (sd-daemon(3)) so that ``journalctl -p warning`` works; there we drop our
own timestamp and add the prefix. Anywhere else each line starts with an ISO-8601 UTC ``ts=``.

Fields ride on the standard ``extra=`` argument, so no wrapper API is needed::

    log = logging.getLogger("kernelab.daemon")
    log.info("job.started", extra={"job": 3, "device": "cuda:0"})
    # ts=2026-11-30T01:57:00.123Z level=info logger=kernelab.daemon event=job.started job=3 …
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import IO, Any, TypeVar

import click

LOGGER_NAME = "kernelab"
LEVELS = ("debug", "info", "warning", "error")

# sd-daemon(3) prefixes: journald maps them to the entry's PRIORITY.
_SYSLOG_PRIORITY = {
    logging.DEBUG: 7,
    logging.INFO: 6,
    logging.WARNING: 4,
    logging.ERROR: 3,
    logging.CRITICAL: 2,
}

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD_ATTRS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}

F = TypeVar("F", bound=Callable[..., Any])


def quote(value: object) -> str:
    """Render one value so that a line stays one line and splits unambiguously on spaces."""
    text = str(value)
    if text and not any(c in text for c in ' ="\\\n\r\t'):
        return text
    escaped = (text.replace("\\", "\\\\").replace('"', '\\"')
               .replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t"))
    return f'"{escaped}"'


class LogfmtFormatter(logging.Formatter):
    """``[ts=…] level=… logger=… event=… key=value …``; optionally journald-flavoured."""

    def __init__(self, *, journald: bool = False) -> None:
        super().__init__()
        self.journald = journald

    def format(self, record: logging.LogRecord) -> str:
        parts: list[str] = []
        if not self.journald:
            ts = datetime.fromtimestamp(record.created, UTC)
            parts.append(f"ts={ts.strftime('%Y-%m-%dT%H:%M:%S')}.{ts.microsecond // 1000:03d}Z")
        parts.append(f"level={record.levelname.lower()}")
        parts.append(f"logger={quote(record.name)}")
        parts.append(f"event={quote(record.getMessage())}")
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRS and not key.startswith("_"):
                parts.append(f"{key}={quote(value)}")
        if record.exc_info:
            parts.append(f"exc={quote(self.formatException(record.exc_info))}")
        line = " ".join(parts)
        if self.journald:
            return f"<{_SYSLOG_PRIORITY.get(record.levelno, 6)}>{line}"
        return line


def stream_is_journal(stream: IO[str]) -> bool:
    """True when ``stream`` is the very journald stream systemd handed us.

    ``$JOURNAL_STREAM`` is ``device:inode`` of that stream (systemd.exec(5)); comparing it with
    the stream's own fstat avoids misreading the variable inherited by a child whose stdout was
    redirected to a file or a pipe.
    """
    value = os.environ.get("JOURNAL_STREAM", "")
    dev, sep, ino = value.partition(":")
    if not sep or not dev.isdigit() or not ino.isdigit():
        return False
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return (st.st_dev, st.st_ino) == (int(dev), int(ino))


def setup_logging(level: str, stream: IO[str] | None = None) -> logging.Logger:
    """Send the ``kernelab`` logger tree to ``stream`` (stdout) at ``level``; idempotent.

    Raises ``ValueError`` for an unknown level, so that a typo in the config is an error.
    """
    name = level.lower()
    if name not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
    out = stream if stream is not None else sys.stdout
    logger = logging.getLogger(LOGGER_NAME)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    handler = logging.StreamHandler(out)
    handler.setFormatter(LogfmtFormatter(journald=stream_is_journal(out)))
    logger.addHandler(handler)
    logger.setLevel(name.upper())
    logger.propagate = False
    return logger


def log_level_option(func: F) -> F:
    """``--log-level`` for a click command; ``None`` when not given, so the caller can fall
    back to ``[daemon] log_level`` from kernelab.toml."""
    return click.option(
        "--log-level",
        type=click.Choice(LEVELS, case_sensitive=False),
        default=None,
        envvar="KERNELAB_LOG_LEVEL",
        help="Log verbosity (default: [daemon] log_level in kernelab.toml, else info).",
    )(func)
