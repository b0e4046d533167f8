"""The search's own records: every configuration a job screened, the per-device cache of the
best configuration found for a kernel at its sizes, and device ceilings kept per device per
home. The tables are the last migration's (``store.db``); this module only reads and writes
them, so that the TUI, reports and the loop agree on what a row means."""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any

SCREENED_STATUSES = ("timed", "spills", "too_big", "failed", "wrong")
SCREENED_FIELDS = ("parent_id", "candidate_id", "proposer", "params", "status", "ms", "registers",
                   "spills", "detail")


def add_screened(conn: sqlite3.Connection, job_id: int, rows: list[dict[str, Any]]) -> list[int]:
    """Record one batch's screened configurations (keys of ``SCREENED_FIELDS``; ``params`` a
    dict), in order, in one transaction; returns their ids."""
    now, ids = time.time(), []
    with conn:
        for row in rows:
            if row["status"] not in SCREENED_STATUSES:
                raise ValueError(f"screened status {row['status']!r} is not one of {SCREENED_STATUSES}")
            values = [json.dumps(row["params"], sort_keys=True) if key == "params" else row.get(key)
                      for key in SCREENED_FIELDS]
            ids.append(int(conn.execute(
                f"INSERT INTO screened (job_id, {', '.join(SCREENED_FIELDS)}, created_at) "
                f"VALUES (?, {', '.join('?' for _ in SCREENED_FIELDS)}, ?)",
                (job_id, *values, now)).lastrowid))
    return ids


def screened(conn: sqlite3.Connection, job_id: int) -> list[dict[str, Any]]:
    """A job's screened configurations in the order they were screened, ``params`` decoded."""
    rows = conn.execute(f"SELECT id, job_id, {', '.join(SCREENED_FIELDS)}, created_at FROM screened "
                        "WHERE job_id = ? ORDER BY id", (job_id,))
    return [{**dict(r), "params": json.loads(r["params"])} for r in rows]


def link_screened(conn: sqlite3.Connection, screened_id: int, candidate_id: int) -> None:
    """Mark a screened configuration as the one that went on to the full gate as a candidate."""
    with conn:
        conn.execute("UPDATE screened SET candidate_id = ? WHERE id = ?", (candidate_id, screened_id))


def cache_best(conn: sqlite3.Connection, entry: dict[str, Any]) -> bool:
    """Keep ``entry`` (``device_name``, ``signature``, ``shapes``, ``params``, ``ms``, ``job_id``)
    as the best known configuration of its kernel at its sizes on its device, unless a faster one
    from another job is already there (a job's own later incumbent always replaces its earlier
    one: it won an A/B against it). True when it was kept."""
    with conn:
        cur = conn.execute(
            "INSERT INTO tuning_cache (device_name, signature, shapes, params, ms, job_id, updated_at) "
            "VALUES (?,?,?,?,?,?,?) ON CONFLICT(device_name, signature, shapes) DO UPDATE SET "
            "params = excluded.params, ms = excluded.ms, job_id = excluded.job_id, "
            "updated_at = excluded.updated_at WHERE tuning_cache.job_id IS excluded.job_id "
            "OR tuning_cache.ms IS NULL OR excluded.ms < tuning_cache.ms",
            (entry["device_name"], entry["signature"], entry["shapes"],
             json.dumps(entry["params"], sort_keys=True), entry.get("ms"), entry.get("job_id"),
             time.time()))
    return cur.rowcount > 0


def cached(conn: sqlite3.Connection, device_name: str, signature: str, family: str,
           shapes: str) -> list[dict[str, Any]]:
    """Cached best configurations on ``device_name`` for a kernel: the exact signature at these
    shapes first, then the same family (its tunables; another source hash or other sizes),
    nearest first by how much matches, newest first among equals. Each row says whether it was
    an ``exact`` match."""
    rows = conn.execute(
        "SELECT signature, shapes, params, ms, job_id, updated_at, "
        "(signature = ? AND shapes = ?) AS exact, (signature = ?) + (shapes = ?) AS closeness "
        "FROM tuning_cache WHERE device_name = ? AND (signature = ? OR signature LIKE ? ESCAPE '\\') "
        "ORDER BY exact DESC, closeness DESC, updated_at DESC",
        (signature, shapes, signature, shapes, device_name, signature, _like_prefix(family)))
    return [{**{k: r[k] for k in ("signature", "shapes", "ms", "job_id")},
             "params": json.loads(r["params"]), "exact": bool(r["exact"])} for r in rows]


def _like_prefix(family: str) -> str:
    escaped = family.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"{escaped}@%"


def ceilings(conn: sqlite3.Connection, key: str) -> dict[str, Any] | None:
    """The ceilings measured under ``key`` (device, driver and clock settings), if any."""
    row = conn.execute("SELECT ceilings FROM ceilings WHERE key = ?", (key,)).fetchone()
    return json.loads(row["ceilings"]) if row else None


def keep_ceilings(conn: sqlite3.Connection, key: str, device_name: str | None,
                  values: dict[str, Any]) -> None:
    """Keep freshly measured ceilings under ``key`` for every later job in this home."""
    with conn:
        conn.execute(
            "INSERT INTO ceilings (key, device_name, ceilings, measured_at) VALUES (?,?,?,?) "
            "ON CONFLICT(key) DO UPDATE SET device_name = excluded.device_name, "
            "ceilings = excluded.ceilings, measured_at = excluded.measured_at",
            (key, device_name, json.dumps(values), time.time()))
