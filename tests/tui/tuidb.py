"""A fixed kernelab database for the TUI's tests, snapshots and bench.

Written through ``store.connect`` into a real SQLite file, with fixed timestamps and values so
that snapshots are byte-stable. ``add_candidate`` is the writer the live tests and the bench
use to play the daemon.
"""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

from store import connect, fingerprints

T0 = 1_767_225_600.0
"""2026-01-01 00:00:00 UTC: every timestamp in the fixture is an offset from it."""

NOW = T0 + 605.0
"""The clock the snapshot app is given: five seconds after the last heartbeat."""

SOURCE = '''# {edit}
import torch
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n_cols + offs, mask=offs < n_cols, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    tl.store(y_ptr + row * n_cols + offs, num / tl.sum(num, axis=0), mask=offs < n_cols)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        softmax_kernel[(x.shape[0],)](x, y, x.shape[1], BLOCK={block}, num_warps={warps})
        return y
'''

# (edit, block, warps, verdict, ms, accepted, rule, evidence)
SOFTMAX = [
    ("port of reference", 1024, 4, "pass", 0.481, True, None, None),
    ("BLOCK 1024 → 2048", 2048, 4, "pass", 0.452, True, None, None),
    ("num_warps 4 → 8", 2048, 8, "pass", 0.447, False, None, None),
    ("rewrite: online softmax, one pass", 2048, 8, "fail", None, False, "max_rel_error",
     {"max_rel_error": 0.031, "tolerance": 0.001, "index": [3, 517], "input_set": 2}),
    ("num_warps 4 → 16", 2048, 16, "pass", 0.401, True, None, None),
    ("BLOCK 2048 → 4096", 4096, 16, "error", None, False, "compile",
     {"stage": "compile", "message": "out of shared memory"}),
    ("rewrite: fp16 accumulation", 2048, 16, "fail", None, False, "max_rel_error",
     {"max_rel_error": 0.0082, "tolerance": 0.001, "index": [0, 12], "input_set": 4}),
    ("num_stages 2 → 3", 2048, 16, "pass", 0.405, False, None, None),
    ("rewrite: vectorised loads", 2048, 16, "pass", 0.362, True, None, None),
    ("rewrite: skip mask on full rows", 2048, 16, "fail", None, False, "nan_inf",
     {"count": 96, "index": [1023, 0], "input_set": 1}),
    ("num_warps 16 → 32", 2048, 32, "pass", 0.371, False, None, None),
    ("rewrite: persistent rows", 2048, 16, "pass", 0.331, True, None, None),
]

LAYERNORM = [
    ("port of reference", 512, 4, "pass", 0.214, True, None, None),
    ("BLOCK 512 → 1024", 1024, 4, "pass", 0.199, True, None, None),
    ("rewrite: welford", 1024, 4, "fail", None, False, "inputs_modified",
     {"input": 0, "index": [7, 7], "input_set": 0}),
]

RMSNORM = [
    ("port of reference", 256, 4, "pass", 0.095, True, None, None),
    ("BLOCK 256 → 512", 512, 4, "pass", 0.094, False, None, None),
]


def _problem(conn: sqlite3.Connection, name: str, offset: float, status: str = "ok",
             error: str | None = None) -> int:
    cur = conn.execute(
        "INSERT INTO problems (name, path, content_hash, source, status, error, created_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        (name, f"/srv/kernelab/inbox/{name}.py", f"hash-{name}", "class Model: ...", status,
         error, T0 + offset))
    return int(cur.lastrowid or 0)


def _job(conn: sqlite3.Connection, problem_id: int, offset: float, **values: object) -> int:
    columns = {"problem_id": problem_id, "created_at": T0 + offset, **values}
    names = ", ".join(columns)
    marks = ", ".join("?" for _ in columns)
    cur = conn.execute(f"INSERT INTO jobs ({names}) VALUES ({marks})", tuple(columns.values()))
    return int(cur.lastrowid or 0)


def add_candidate(conn: sqlite3.Connection, job_id: int, *, edit: str, verdict: str,
                  ms: float | None, accepted: bool = False, rule: str | None = None,
                  evidence: dict[str, object] | None = None, source: str | None = None,
                  parent_id: int | None = None, created_at: float = T0,
                  baseline_ms: float | None = None) -> int:
    """Insert one finished candidate (as the daemon would) and return its id.

    Its speedup is ``baseline_ms / ms``: the daemon times a candidate against the incumbent (the
    first against the reference). An accepted candidate also becomes the job's incumbent
    (``best_candidate_id``).
    """
    speedup = baseline_ms / ms if (baseline_ms and ms) else None
    cur = conn.execute(
        "INSERT INTO candidates (job_id, parent_id, proposer, source, edit, state, verdict, "
        "rule, reason, evidence, max_rel_error, tolerance, candidate_ms, baseline_ms, speedup, "
        "speedup_lo, speedup_hi, faster_than_noise, accepted, created_at, finished_at) "
        "VALUES (?, ?, 'search', ?, ?, 'done', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (job_id, parent_id, source or SOURCE.format(edit=edit, block=1024, warps=4), edit,
         verdict, rule,
         f"{rule} failed" if rule else None, json.dumps(evidence) if evidence else None,
         (evidence or {}).get("max_rel_error"), (evidence or {}).get("tolerance"), ms,
         baseline_ms, speedup, speedup and speedup * 0.98, speedup and speedup * 1.02,
         None if ms is None else int(accepted), int(accepted), created_at, created_at + 1))
    cand_id = int(cur.lastrowid or 0)
    if accepted:
        conn.execute("UPDATE jobs SET best_candidate_id = ?, updated_at = ? WHERE id = ?",
                     (cand_id, created_at, job_id))
    return cand_id


def _candidates(conn: sqlite3.Connection, job_id: int, rows: list[tuple], reference_ms: float,
                offset: float) -> list[int]:
    ids: list[int] = []
    incumbent: int | None = None
    incumbent_ms = reference_ms
    for i, (edit, block, warps, verdict, ms, accepted, rule, evidence) in enumerate(rows):
        cand = add_candidate(conn, job_id, edit=edit, verdict=verdict, ms=ms, accepted=accepted,
                             rule=rule, evidence=evidence,
                             source=SOURCE.format(edit=edit, block=block, warps=warps),
                             parent_id=incumbent, created_at=T0 + offset + 20 * i,
                             baseline_ms=incumbent_ms)
        if ms is not None:
            _blocks(conn, cand, incumbent_ms, ms, T0 + offset + 20 * i)
            _fingerprint(conn, cand, block, warps)
            _stages(conn, cand, i)
        if accepted:
            incumbent, incumbent_ms = cand, ms
        ids.append(cand)
    return ids


def _stages(conn: sqlite3.Connection, cand: int, i: int) -> None:
    """The wall seconds of each stage of the evaluation, in the recorded result."""
    stages = {"sandbox_start": 0.4, "reference": 1.5 if i == 0 else 0.0, "gate": 0.8 + 0.1 * (i % 3),
              "timing": 3.2 + 0.2 * (i % 4), "fingerprint": 0.6}
    conn.execute("UPDATE candidates SET result = ? WHERE id = ?",
                 (json.dumps({"stages": stages, "wall_s": round(sum(stages.values()), 3)}), cand))


SOFTMAX_PEERS = {"eager_ms": 0.42, "compile_ms": 0.362, "compile_max_autotune_ms": 0.35,
                 "compile_speedup": 1.16, "compile_max_autotune_speedup": 1.2,
                 "best": "compile_max_autotune", "errors": {}, "note": None}
"""torch.compile beat eager on softmax: max-autotune by 1.2×, so ×peer is ×ref / 1.2."""

LAYERNORM_PEERS = {"eager_ms": 0.251, "compile_ms": 0.262, "compile_max_autotune_ms": None,
                   "compile_speedup": 0.958, "compile_max_autotune_speedup": None, "best": "eager",
                   "errors": {"compile_max_autotune": "InductorError: out of shared memory"},
                   "note": None}
"""Eager beat the default compile and max-autotune failed: ×peer equals ×ref."""

GIB = 2 ** 30

SOFTMAX_PLAN = {"device": "cuda:0", "device_total_bytes": 150_000_000_000,
                "device_free_bytes": 148_000_000_000, "host_total_bytes": 135_000_000_000,
                "bytes": {"inputs": 268_435_456, "outputs": 268_435_456, "parameters": 0,
                          "oracle": 536_870_912, "reference_peak": 805_306_368},
                "gate_sets": 5, "timing_sets": 3, "variants": ["base", "scaled", "heavy"], "dropped": [],
                "oracle": "whole", "needs_device_bytes": 6 * GIB, "needs_host_bytes": GIB // 2,
                "sandbox_host_limit_bytes": 16 * GIB, "fits": True, "reason": None}

# (parent, params, status, ms, registers, spills, detail, went on to the gate as)
SCREENED = [
    (5, {"BLOCK": 2048, "num_warps": 8}, "timed", 0.398, 32, 0, None, None),
    (5, {"BLOCK": 2048, "num_warps": 16}, "timed", 0.371, 40, 0, None, 9),
    (5, {"BLOCK": 4096, "num_warps": 16}, "spills", None, 255, 48, "ptxas: 48 bytes spilled", None),
    (5, {"BLOCK": 8192, "num_warps": 32}, "too_big", None, None, None, "needs 256 KiB of shared memory",
     None),
    (5, {"BLOCK": 1024, "num_warps": 4}, "timed", 0.452, 24, 0, None, None),
    (5, {"BLOCK": 2048, "num_warps": 2}, "failed", None, None, None, "CompilationError: num_warps", None),
]


def _screened(conn: sqlite3.Connection, job_id: int, candidates: list[int]) -> None:
    for i, (parent, params, status, ms, regs, spills, detail, went) in enumerate(SCREENED):
        conn.execute(
            "INSERT INTO screened (job_id, parent_id, candidate_id, proposer, params, status, ms, "
            "registers, spills, detail, created_at) VALUES (?, ?, ?, 'tune', ?, ?, ?, ?, ?, ?, ?)",
            (job_id, candidates[parent - 1], went and candidates[went - 1], json.dumps(params), status,
             ms, regs, spills, detail, T0 + 200 + i))


def _fingerprint(conn: sqlite3.Connection, cand: int, block: int, warps: int) -> None:
    """A Triton row kernel's machine code as ``kernelab fingerprint`` would read it."""
    vector = max(1, min(4, block // (32 * warps)))
    kernel = {"name": "softmax_kernel", "arch": "sm_90", "registers": 16 + 8 * vector,
              "spills": 0, "spill_loads": 0, "local_bytes": 0, "shared_bytes": 8 * warps,
              "static_shared_bytes": 0,
              "launch": {"grid": [4096], "block": [32 * warps, 1, 1], "num_warps": warps},
              "instructions": {f"LDG.{32 * vector}": block // (32 * warps * vector) or 1,
                               "SHFL": 10, "MUFU": block // (32 * warps) or 1, "BAR": 2,
                               "total": 200 + block // 8 + 7 * (cand % 4)},
              "ptx": "", "sass": ""}
    fingerprints.save(conn, cand, {"arch": "sm_90", "kernels": [kernel]})


def _blocks(conn: sqlite3.Connection, cand: int, base_ms: float, ms: float, ts: float) -> None:
    """Four interleaved A/B blocks of ten samples, deterministic and slightly noisy."""
    for idx in range(4):
        for side, centre in (("A", base_ms), ("B", ms)):
            samples = [round(centre * (1 + 0.01 * math.sin(7 * idx + k + (side == "B"))), 5)
                       for k in range(10)]
            conn.execute(
                "INSERT INTO blocks (candidate_id, side, idx, samples, median_ms, sm_clock_mhz, "
                "clock_reasons, temperature_c, power_w, throttled, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?)",
                (cand, side, idx, json.dumps(samples), sorted(samples)[5], 1980.0,
                 "gpu_idle" if idx == 0 else "none", 54.0 + idx, 410.0 + 5 * idx, ts + idx))


def _devices(conn: sqlite3.Connection) -> None:
    for n in range(2):
        dev = f"cuda:{n}"
        conn.execute("INSERT INTO devices (id, name, uuid, memory_total_mb, updated_at) "
                     "VALUES (?, 'NVIDIA H200', ?, 143771, ?)", (dev, f"GPU-{n:08d}", T0))
        for k in range(40):
            phase = k / 4 + n
            conn.execute(
                "INSERT INTO gpu_samples (device_id, ts, util_pct, sm_clock_mhz, mem_clock_mhz, "
                "temperature_c, power_w, mem_used_mb, mem_total_mb, clock_reasons) "
                "VALUES (?, ?, ?, ?, 3201, ?, ?, ?, 143771, 'none')",
                (dev, T0 + 560 + k, round(70 + 25 * math.sin(phase), 1),
                 round(1900 + 80 * math.cos(phase)), round(55 + 6 * math.sin(phase / 2), 1),
                 round(380 + 150 * math.sin(phase), 1), 20480 + 512 * (k % 8)))


def build(path: Path) -> Path:
    """Create the fixed database at ``path`` (through ``store.connect``) and return it."""
    conn = connect(path)
    with conn:
        _devices(conn)
        conn.execute("INSERT INTO daemon (id, pid, host, version, started_at, heartbeat_at, "
                     "status) VALUES (1, 4242, 'gpubox', '0.1.0', ?, ?, 'running')",
                     (T0, T0 + 600))
        softmax = _job(conn, _problem(conn, "softmax", 0), 0, state="running", device="cuda:0",
                       reference_ms=0.42, reference_noise=0.012, sol_ms=0.118,
                       started_at=T0 + 1, peers=json.dumps(SOFTMAX_PEERS), plan=json.dumps(SOFTMAX_PLAN))
        _screened(conn, softmax, _candidates(conn, softmax, SOFTMAX, 0.42, 10))
        layernorm = _job(conn, _problem(conn, "layernorm", 5), 5, kind="tune", state="running",
                         device="cuda:1", priority=1, reference_ms=0.251, reference_noise=0.02,
                         sol_ms=0.061, started_at=T0 + 6, peers=json.dumps(LAYERNORM_PEERS))
        _candidates(conn, layernorm, LAYERNORM, 0.251, 15)
        _job(conn, _problem(conn, "matmul_bias", 30), 30, priority=2)
        _job(conn, _problem(conn, "gelu", 40), 40, state="paused", device="cuda:0")
        rmsnorm = _job(conn, _problem(conn, "rmsnorm", -900), -900, state="done",
                       device="cuda:1", reference_ms=0.102, reference_noise=0.015, sol_ms=0.04,
                       stop_reason="inside the reference's noise floor")
        _candidates(conn, rmsnorm, RMSNORM, 0.102, -880)
        bad = _problem(conn, "conv_bad", 50, status="invalid",
                       error="get_inputs() raised ValueError: negative dimension")
        _job(conn, bad, 50, state="invalid", error="get_inputs() raised ValueError")
    conn.close()
    return path


KERNELBENCH = ("63_conv_standard_2D__square_input__square_kernel",
               "58_conv_transposed_3D__asymmetric_input__asymmetric_kernel",
               "23_Softmax", "97_ScaledDotProductAttention",
               "44_ConvTranspose2d_Multiply_GlobalAvgPool_GlobalAvgPool_Mean")
"""KernelBench's own file names (levels 1 and 2), up to 60 characters (the last one)."""


def add_kernelbench_jobs(path: Path) -> list[int]:
    """Queue a job for each of ``KERNELBENCH``, as dropping the files unchanged would."""
    conn = connect(path)
    with conn:
        ids = [_job(conn, _problem(conn, name, 60 + i), 60 + i, state="queued" if i else "running",
                    device=None if i else "cuda:1", reference_ms=None if i else 3.1)
               for i, name in enumerate(KERNELBENCH)]
    conn.close()
    return ids
