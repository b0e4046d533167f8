"""The snapshot behind ``kernelab status --json`` (``{"jobs": [...], "devices": [...]}``) and
every number derived from the store that a user reads.

It lives in ``store`` so that every reader (the CLI, the reports, the TUI, scripts) computes the
same numbers from the same rows: a job's speedup, its speedup over the best peer, whether the
daemon is up, whether a job is ``interrupted``. It only reads, so it works on a read-only
connection, and it tolerates a database written by an older kernelab: a column or table that is
not there yet reads as absent, never as an error.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import time
from collections.abc import Iterable
from typing import Any

from store.home import Home

HEARTBEAT_STALE_S = 10.0
"""A daemon whose last heartbeat is older than this is down (it beats every second)."""

PEER_MODES = ("compile", "compile_max_autotune")
"""The torch.compile modes a job's peers are timed in beside eager: ``jobs.peers`` holds
``MODE_ms`` and ``MODE_speedup`` (eager_ms / MODE_ms, measured in interleaved A/B) for each."""

PEER_LABELS = {"eager": "eager", "compile": "compile", "compile_max_autotune": "max-autotune"}
"""How each peer is named where it is shown: eager PyTorch, ``torch.compile`` by default and in
``max-autotune-no-cudagraphs`` mode."""

GIB = 2 ** 30

JOBS_SQL = """
SELECT j.id, p.name, p.revision, j.kind, j.state, j.config, j.device, {node} AS node, j.priority,
       j.error, j.stop_reason, j.reference_ms, j.reference_noise, j.sol_ms, {peers} AS peers,
       j.best_candidate_id, j.created_at, j.started_at, j.finished_at,
       COUNT(c.id) AS candidates,
       SUM(CASE WHEN c.verdict IN ('fail', 'error') THEN 1 ELSE 0 END) AS gate_failures,
       SUM(c.accepted) AS accepted,
       b.candidate_ms AS best_ms
FROM jobs j
JOIN problems p ON p.id = j.problem_id
LEFT JOIN candidates c ON c.job_id = j.id
LEFT JOIN candidates b ON b.id = j.best_candidate_id
{where}
GROUP BY j.id
ORDER BY j.id
"""


# ---------------------------------------------------------------- processes and the daemon


def pid_alive(pid: int) -> bool:
    """Whether a process exists on this host (one owned by another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def daemon_up(heartbeat_at: float | None, status: str | None, now: float | None = None) -> bool:
    """Whether a daemon is alive: it has not said it stopped and it beat recently."""
    if heartbeat_at is None or status == "stopped":
        return False
    return (time.time() if now is None else now) - heartbeat_at < HEARTBEAT_STALE_S


def foreground_pid(config: str | dict[str, Any] | None) -> int | None:
    """The pid of the ``kernelab port`` process that owns a job, from its ``jobs.config``."""
    settings = loads(config) if isinstance(config, str) else config
    pid = settings.get("foreground_pid") if isinstance(settings, dict) else None
    return int(pid) if isinstance(pid, int) and pid > 0 else None


def shown_state(state: str, config: str | dict[str, Any] | None) -> str:
    """The state a user is shown: a ``running`` job whose foreground process is gone (an
    out-of-memory kill, ``kill -9``) is ``interrupted``, so that nobody waits on it; ``kernelab
    jobs resume`` hands it to the daemon."""
    if state == "running":
        pid = foreground_pid(config)
        if pid is not None and not pid_alive(pid):
            return "interrupted"
    return state


def daemon(conn: sqlite3.Connection) -> dict[str, Any] | None:
    row = conn.execute("SELECT * FROM daemon WHERE id = 1").fetchone()
    if row is None:
        return None
    info = dict(row)
    info["heartbeat_age_s"] = time.time() - info["heartbeat_at"] if info["heartbeat_at"] else None
    info["up"] = daemon_up(info["heartbeat_at"], info["status"])
    return info


# ---------------------------------------------------------------- speedups


def chain_speedup(steps: Iterable[float | None]) -> float | None:
    """A job's speedup over the reference from its accepted steps: the product of their
    speedups, since each was measured in interleaved A/B blocks against the one before it (the
    first against the reference). Unknown when there is no step or a step was not timed."""
    values = list(steps)
    if not values or any(v is None for v in values):
        return None
    return math.prod(values)  # type: ignore[arg-type]


def speedups(conn: sqlite3.Connection) -> dict[int, float | None]:
    """Each job's ``chain_speedup`` (jobs with no accepted candidate are absent)."""
    steps: dict[int, list[float | None]] = {}
    for job_id, speedup in conn.execute(
            "SELECT job_id, speedup FROM candidates WHERE accepted = 1 ORDER BY job_id, id"):
        steps.setdefault(job_id, []).append(speedup)
    return {job_id: chain_speedup(values) for job_id, values in steps.items()}


def speedup_vs_best_peer(speedup: float | None, peers: dict[str, Any] | None) -> float | None:
    """The speedup over what the user already has: over the reference, divided by the best of
    eager (1) and each torch.compile mode's speedup over eager. None without peers or a best."""
    if speedup is None or not isinstance(peers, dict):
        return None
    rivals = [_num(peers.get(f"{mode}_speedup")) for mode in PEER_MODES]
    return speedup / max([1.0, *(r for r in rivals if r is not None and r > 0)])


# ---------------------------------------------------------------- jobs and devices


def jobs(conn: sqlite3.Connection, home: Home | None = None,
         job_id: int | None = None) -> list[dict[str, Any]]:
    """The ``status --json`` job rows (one job with ``job_id``); ``best_file`` needs ``home``."""
    gains = speedups(conn)
    shown = latest_with_best(conn) if home is not None else {}
    present = columns(conn, "jobs")
    sql = JOBS_SQL.format(node="j.node" if "node" in present else "NULL",
                          peers="j.peers" if "peers" in present else "NULL",
                          where="" if job_id is None else "WHERE j.id = ?")
    out = []
    for r in conn.execute(sql, () if job_id is None else (job_id,)):
        best = gains.get(r["id"]) if r["best_candidate_id"] else None
        peers = loads(r["peers"])
        out.append({
            "id": r["id"], "problem": f"{r['name']}.py", "state": shown_state(r["state"], r["config"]),
            "error": r["error"], "candidates": r["candidates"],
            "gate_failures": r["gate_failures"] or 0, "accepted": r["accepted"] or 0,
            "best_speedup": best, "peers": peers, "speedup_vs_best_peer": speedup_vs_best_peer(best, peers),
            "best_file": _best_file(home, r["name"], r["id"], shown),
            "revision": r["revision"], "kind": r["kind"],
            "device": r["device"], "node": r["node"], "priority": r["priority"], "stop_reason": r["stop_reason"],
            "reference_ms": r["reference_ms"], "reference_noise": r["reference_noise"],
            "sol_ms": r["sol_ms"], "best_ms": r["best_ms"],
            "created_at": r["created_at"], "started_at": r["started_at"],
            "finished_at": r["finished_at"],
        })
    return out


def latest_with_best(conn: sqlite3.Connection) -> dict[str, int]:
    """Problem name → the newest job with a best candidate: the one ``results/NAME/`` shows."""
    rows = conn.execute("SELECT p.name, MAX(j.id) FROM jobs j JOIN problems p "
                        "ON p.id = j.problem_id WHERE j.best_candidate_id IS NOT NULL "
                        "GROUP BY p.name")
    return {name: jid for name, jid in rows}


def _best_file(home: Home | None, name: str, job_id: int, shown: dict[str, int]) -> str | None:
    if home is None or shown.get(name) != job_id:
        return None
    best = home.results / name / "best.py"
    return str(best) if best.exists() else None


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


def snapshot(conn: sqlite3.Connection, home: Home) -> dict[str, Any]:
    """Exactly the documented ``status --json`` object (scripts depend on its keys)."""
    return {"jobs": jobs(conn, home), "devices": devices(conn)}


# ---------------------------------------------------------------- a job's recorded facts


def job_facts(conn: sqlite3.Connection, job_id: int) -> dict[str, Any]:
    """A job's memory plan and peers (``jobs.plan``, ``jobs.peers``), None where not recorded."""
    present = sorted(columns(conn, "jobs") & {"plan", "peers"})
    row = conn.execute(f"SELECT {', '.join(present)} FROM jobs WHERE id = ?",
                       (job_id,)).fetchone() if present else None
    return {c: loads(row[c]) if row is not None and c in present else None for c in ("plan", "peers")}


def screened(conn: sqlite3.Connection, job_id: int) -> list[dict[str, Any]]:
    """Every configuration the job screened, fastest first (untimed ones last). A screened time
    is a filter for the full gate and A/B, never a result."""
    if "screened" not in tables(conn):
        return []
    rows = conn.execute(
        "SELECT id, parent_id, candidate_id, proposer, params, status, ms, registers, spills, "
        "detail, created_at FROM screened WHERE job_id = ? ORDER BY ms IS NULL, ms, id", (job_id,))
    return [{**dict(r), "params": loads(r["params"])} for r in rows]


def screened_count(conn: sqlite3.Connection, job_id: int) -> int:
    if "screened" not in tables(conn):
        return 0
    return int(conn.execute("SELECT COUNT(*) FROM screened WHERE job_id = ?", (job_id,)).fetchone()[0])


def describe_peers(peers: dict[str, Any] | None) -> str | None:
    """One line: eager and each compile mode's time with its speedup over eager, which was
    best, and why a mode has no time."""
    if not isinstance(peers, dict):
        return None
    parts = []
    eager = _num(peers.get("eager_ms"))
    if eager is not None:
        parts.append(f"eager {eager:.4g} ms")
    errors = peers.get("errors") if isinstance(peers.get("errors"), dict) else {}
    for mode in PEER_MODES:
        ms, speedup = _num(peers.get(f"{mode}_ms")), _num(peers.get(f"{mode}_speedup"))
        if ms is not None:
            parts.append(f"{PEER_LABELS[mode]} {ms:.4g} ms"
                         + (f" (×{speedup:.2f} eager)" if speedup is not None else ""))
        elif errors.get(mode):
            parts.append(f"{PEER_LABELS[mode]} failed: {errors[mode]}")
    if peers.get("best") in PEER_LABELS:
        parts.append(f"best {PEER_LABELS[peers['best']]}")
    if peers.get("note"):
        parts.append(str(peers["note"]))
    return " · ".join(parts) or None


def describe_plan(plan: dict[str, Any] | None, *, sizes: bool = True) -> list[str]:
    """The memory plan in a few short lines (GiB): what the job needs against what the device
    and host have; how many input sets it uses and how the oracle is computed; with ``sizes``,
    what each kind of tensor takes; and, when it does not fit, why."""
    if not isinstance(plan, dict):
        return []
    verdict = {True: "fits", False: "does not fit"}.get(plan.get("fits"), "planned")
    limit = _num(plan.get("sandbox_host_limit_bytes"))
    host = _needs("host", plan.get("needs_host_bytes"), plan.get("host_total_bytes"))
    head = [f"memory plan: {verdict}",
            _needs(f"device {plan.get('device') or ''}".strip(), plan.get("needs_device_bytes"),
                   plan.get("device_total_bytes"), plan.get("device_free_bytes")),
            host + (f" (sandbox limit {gib(limit)})" if host and limit else "")]
    sets = [f"{plan[k]} {label} sets" for k, label in (("gate_sets", "gate"), ("timing_sets", "timing"))
            if isinstance(plan.get(k), int)]
    sets += [f"oracle {plan['oracle']}"] if plan.get("oracle") else []
    sets += [f"{key} " + ", ".join(map(str, plan[key])) for key in ("variants", "dropped")
             if isinstance(plan.get(key), list) and plan[key]]
    lines = [" · ".join(p for p in head if p), " · ".join(sets)]
    tensors = plan.get("bytes") if isinstance(plan.get("bytes"), dict) else {}
    shown = [f"{name.replace('_', ' ')} {gib(v)}" for name, v in tensors.items() if _num(v) is not None]
    if sizes and shown:
        lines.append("GiB: " + " · ".join(shown))
    if plan.get("reason"):
        lines.append(str(plan["reason"]))
    return [line for line in lines if line]


def _needs(where: str, needs: Any, total: Any, free: Any = None) -> str:
    if _num(needs) is None:
        return ""
    text = f"{where} needs {gib(needs)}"
    if _num(total) is not None:
        text += f" of {gib(total)}"
    text += " GiB"
    if _num(free) is not None:
        text += f" ({gib(free)} free)"
    return text


def gib(n: Any) -> str:
    """Bytes as GiB, to a tenth above one GiB and to three figures below."""
    value = float(n) / GIB
    return f"{value:.1f}" if value >= 1 else f"{value:.3g}"


# ---------------------------------------------------------------- reading older databases


def columns(conn: sqlite3.Connection, table: str) -> set[str]:
    """The columns a table has in this database (an older schema lacks newer ones)."""
    return {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}


def tables(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def loads(text: str | None) -> Any:
    """A JSON column's value; None when empty or malformed (shown as absent, never a crash)."""
    if not text:
        return None
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return None


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
