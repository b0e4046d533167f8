"""Agent exchanges: what a proposer agent was asked and what it answered, kept with the
candidate it produced so that every kept kernel's origin can be read back."""

from __future__ import annotations

import sqlite3
import time
from typing import Any

FIELDS = ("proposer", "model", "prompt", "response", "tokens_in", "tokens_out", "latency_s",
          "finish_reason", "status", "error")


def add_exchange(conn: sqlite3.Connection, job_id: int, candidate_id: int | None,
                 exchange: dict[str, Any]) -> int:
    """Record one exchange (the keys of ``FIELDS``; missing ones are NULL)."""
    values = [exchange.get(key) for key in FIELDS]
    with conn:
        row = conn.execute(
            f"INSERT INTO agent_exchanges (job_id, candidate_id, {', '.join(FIELDS)}, created_at) "
            f"VALUES (?, ?, {', '.join('?' for _ in FIELDS)}, ?)",
            (job_id, candidate_id, *values, time.time())).lastrowid
    return int(row)


def exchanges(conn: sqlite3.Connection, job_id: int,
              candidate_id: int | None = None) -> list[dict[str, Any]]:
    """A job's exchanges in order, or only those of one candidate."""
    sql = f"SELECT id, job_id, candidate_id, {', '.join(FIELDS)}, created_at FROM agent_exchanges " \
          "WHERE job_id = ?"
    args: tuple[Any, ...] = (job_id,)
    if candidate_id is not None:
        sql += " AND candidate_id = ?"
        args += (candidate_id,)
    return [dict(r) for r in conn.execute(sql + " ORDER BY id", args)]
