"""The snapshot behind ``kernelab status --json``: ``{"jobs": [...], "devices": [...]}``.

It lives in ``store`` so that every reader (the CLI, the TUI, scripts) computes the same
numbers from the same rows, and it only reads, so it works on a read-only connection.
"""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any

from store.home import Home

JOBS_SQL = """
SELECT j.id, p.name, p.revision, j.kind, j.state, j.device, j.node, j.priority, j.error, j.stop_reason,
       j.reference_ms, j.best_candidate_id, j.created_at, j.started_at, j.finished_at,
       COUNT(c.id) AS candidates,
       SUM(CASE WHEN c.verdict IN ('fail', 'error') THEN 1 ELSE 0 END) AS gate_failures,
       SUM(c.accepted) AS accepted,
       b.candidate_ms AS best_ms
FROM jobs j
JOIN problems p ON p.id = j.problem_id
LEFT JOIN candidates c ON c.job_id = j.id
LEFT JOIN candidates b ON b.id = j.best_candidate_id
GROUP BY j.id
ORDER BY j.id
"""


def speedups(conn: sqlite3.Connection) -> dict[int, float]:
    """Each job's best speedup over the reference: the product of its accepted candidates'
    speedups, since each was measured in interleaved A/B blocks against the one before it (the
    first against the reference)."""
    out: dict[int, float] = {}
    for job_id, speedup in conn.execute(
            "SELECT job_id, speedup FROM candidates WHERE accepted = 1 AND speedup IS NOT NULL "
            "ORDER BY job_id, id"):
        out[job_id] = out.get(job_id, 1.0) * speedup
    return out


def latest_with_best(conn: sqlite3.Connection) -> dict[str, int]:
    """Problem name → the newest job with a best candidate: the one ``results/NAME/`` shows."""
    rows = conn.execute("SELECT p.name, MAX(j.id) FROM jobs j JOIN problems p "
                        "ON p.id = j.problem_id WHERE j.best_candidate_id IS NOT NULL "
                        "GROUP BY p.name")
    return {name: jid for name, jid in rows}


def jobs(conn: sqlite3.Connection, home: Home) -> list[dict[str, Any]]:
    gains = speedups(conn)
    shown = latest_with_best(conn)
    out = []
    for r in conn.execute(JOBS_SQL):
        best = home.results / r["name"] / "best.py"
        best_file = str(best) if shown.get(r["name"]) == r["id"] and best.exists() else None
        out.append({
            "id": r["id"], "problem": f"{r['name']}.py", "state": r["state"],
            "error": r["error"], "candidates": r["candidates"],
            "gate_failures": r["gate_failures"] or 0, "accepted": r["accepted"] or 0,
            "best_speedup": gains.get(r["id"]) if r["best_candidate_id"] else None,
            "best_file": best_file, "revision": r["revision"], "kind": r["kind"],
            "device": r["device"], "node": r["node"], "priority": r["priority"], "stop_reason": r["stop_reason"],
            "reference_ms": r["reference_ms"], "best_ms": r["best_ms"],
            "created_at": r["created_at"], "started_at": r["started_at"],
            "finished_at": r["finished_at"],
        })
    return out


def devices(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """Each device with its latest NVML sample (none for the CPU)."""
    out = []
    for d in conn.execute("SELECT * FROM devices ORDER BY id"):
        sample = conn.execute("SELECT * FROM gpu_samples WHERE device_id = ? ORDER BY ts DESC "
                              "LIMIT 1", (d["id"],)).fetchone()
        running = conn.execute("SELECT id FROM jobs WHERE state = 'running' AND device = ?",
                               (d["id"],)).fetchone()
        entry = {"id": d["id"], "node": d["node"], "name": d["name"], "uuid": d["uuid"],
                 "memory_total_mb": d["memory_total_mb"],
                 "ceilings": json.loads(d["ceilings"]) if d["ceilings"] else None,
                 "job": running[0] if running else None, "sample": None}
        if sample is not None:
            entry["sample"] = {k: v for k, v in dict(sample).items()
                               if k not in ("id", "device_id")}
        out.append(entry)
    return out


def daemon(conn: sqlite3.Connection) -> dict[str, Any] | None:
    row = conn.execute("SELECT * FROM daemon WHERE id = 1").fetchone()
    if row is None:
        return None
    info = dict(row)
    info["heartbeat_age_s"] = time.time() - info["heartbeat_at"] if info["heartbeat_at"] else None
    return info


def snapshot(conn: sqlite3.Connection, home: Home) -> dict[str, Any]:
    """Exactly the documented ``status --json`` object (scripts depend on its keys)."""
    return {"jobs": jobs(conn, home), "devices": devices(conn)}
