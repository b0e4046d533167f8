"""Jobs recorded through the writer's own ``Store`` methods, as the daemon records them: the
tests of every reader (status, reports, the TUI) start from these."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

from store.db import MIGRATIONS
from store.records import NewProblem, Store

REF = "class Model: pass\ndef get_inputs(): return []\ndef get_init_inputs(): return []\n"

PEERS = {"eager_ms": 2.0, "compile_ms": 1.6, "compile_max_autotune_ms": 1.25, "compile_speedup": 1.25,
         "compile_max_autotune_speedup": 1.6, "best": "compile_max_autotune",
         "errors": {}, "note": None}
"""torch.compile's max-autotune beat eager by 1.6×: a job's ×peer is its ×ref / 1.6."""

PLAN = {"device": "cuda:0", "device_total_bytes": 150 * 2 ** 30, "device_free_bytes": 148 * 2 ** 30,
        "host_total_bytes": 128 * 2 ** 30,
        "bytes": {"inputs": 2 ** 30, "outputs": 2 ** 29, "parameters": 0, "oracle": 3 * 2 ** 30,
                  "reference_peak": 2 * 2 ** 30},
        "gate_sets": 5, "timing_sets": 3, "variants": ["base", "scaled", "heavy"], "dropped": ["heavy"],
        "oracle": "chunked", "needs_device_bytes": 12 * 2 ** 30, "needs_host_bytes": 3 * 2 ** 30,
        "sandbox_host_limit_bytes": 16 * 2 ** 30, "fits": True, "reason": None}


def result(baseline_ms: float, ms: float, stages: dict[str, float] | None = None,
           drift: float = 1.0) -> dict[str, Any]:
    """A passing check result timed against ``baseline_ms`` (the incumbent, or the reference).
    Its A/B speedup is ``drift`` × the ratio of the two times: measured in interleaved blocks, it
    need not equal what separately taken medians say."""
    speedup = baseline_ms / ms * drift
    return {"verdict": "pass", "reference_ms": baseline_ms, "candidate_ms": ms, "speedup": speedup,
            "speedup_ci": [speedup * 0.98, speedup * 1.02], "faster_than_noise": True,
            "max_rel_error": 1e-6, "tolerance": 1e-4, "stages": stages or {}}


def record_job(store: Store, name: str = "softmax", *, reference_ms: float = 2.0,
               accepted_ms: tuple[float, ...] = (1.8, 1.2, 1.0), peers: dict[str, Any] | None = None,
               plan: dict[str, Any] | None = None, config: dict[str, Any] | None = None,
               drift: float = 1.0) -> int:
    """A running job whose candidates were each accepted against the one before (the first
    against the reference), one gate failure between them, with stage wall times recorded."""
    _, job_id = store.add_problem(NewProblem(name, f"/inbox/{name}.py", REF), job_config=config,
                                  always=True)  # type: ignore[misc]
    store.start_job(job_id, "cuda:0")
    facts = {name: json.dumps(value) for name, value in (("peers", peers), ("plan", plan)) if value}
    store.update_job(job_id, reference_ms=reference_ms, reference_noise=0.01, **facts)
    parent, baseline = None, reference_ms
    for i, ms in enumerate(accepted_ms):
        cid = store.add_candidate(job_id, proposer="tune", source=f"# {i}", parent_id=parent,
                                  edit=f"step {i}")
        stages = {"sandbox_start": 0.5, "reference": 2.0 if i == 0 else 0.0, "gate": 1.0 + i, "timing": 4.0}
        store.finish_candidate(cid, result(baseline, ms, stages, drift), True)
        failed = store.add_candidate(job_id, proposer="tune", source="# bad", parent_id=cid)
        store.finish_candidate(failed, {"verdict": "fail", "rule": "nan_inf", "stages": {"gate": 0.5}}, False)
        parent, baseline = cid, ms
    return job_id


def add_screened(store: Store, job_id: int, rows: list[tuple[str, float | None]]) -> None:
    """Configurations the job screened: (status, screened ms)."""
    with store.conn:
        for i, (status, ms) in enumerate(rows):
            store.conn.execute(
                "INSERT INTO screened (job_id, proposer, params, status, ms, registers, spills, created_at) "
                "VALUES (?, 'tune', ?, ?, ?, 32, ?, ?)",
                (job_id, json.dumps({"BLOCK": 64 * (i + 1)}), status, ms, 8 if status == "spills" else 0, i))


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def legacy_database(path: Path, version: int) -> Path:
    """A database as a kernelab of schema ``version`` left it (older than this one)."""
    conn = sqlite3.connect(path)
    for number, script in enumerate(MIGRATIONS[:version]):
        conn.executescript(f"BEGIN;\n{script}\nPRAGMA user_version = {number + 1};\nCOMMIT;")
    conn.close()
    return path
