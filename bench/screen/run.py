"""Screening benchmark (issue 14): screened and verified configurations per GPU-minute on
bench/port's problems, through ``kernelab port`` as a user runs it.

    python3 bench/screen/run.py --out DIR [--only NAME ...] [--minutes 1] [--proposer template --proposer tune]
    python3 bench/screen/run.py --device cpu --out DIR --only gelu --minutes 0.5   # logic check
    python3 bench/screen/run.py --from-homes HOME... --out DIR      # the table of existing homes

All problems run one after another in one fresh home (``DIR/home``), so the device's ceilings
are measured by the first job only and the tuning cache fills as the run goes. For each
problem, ``python3 -m kernelabd port NAME.py --device DEVICE --json`` with ``[jobs] max_minutes``
as the budget (on a CPU, ``[search] on_cpu = true``: screening runs in Triton's interpreter with
the host clock). Read back from the home's database: the job's active (device) time, its
screened configurations by status and the seconds its batches took (the ``batch.screened``
events), its candidates (gated; gated and timed in A/B), how long the first verified candidate
took, and the best speedup. Rates are per GPU-minute of the job's active time; the screening
rate is also given per minute of screening alone.

Raw rows go to ``DIR/screen.jsonl`` as each problem ends, with a copy of the database
(``DIR/kernelab.db``); the table is printed last and written to ``DIR/table.md``, then the
issue's goals (>= 200 screened and >= 10 verified a GPU-minute; a first verified port within
30 s).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PROBLEMS = ROOT / "bench" / "port" / "problems"
GOALS = {"screened_per_min": 200.0, "verified_per_min": 10.0, "first_verified_s": 30.0}
BATCH_SECONDS = re.compile(r"\((\d+(?:\.\d+)?) s\)$")


def config_text(minutes: float, device: str, proposers: list[str], peers: bool = True) -> str:
    """The home's ``kernelab.toml``: the budget, the proposers, screening on a CPU too; without
    the peers (torch.compile's two modes, uncharged but 37-121 s of wall a job on the H200) where
    only the search's speed is measured."""
    lines = ["[jobs]", f"max_minutes = {minutes}", "max_candidates = 400", "patience = 40",
             f"proposers = {json.dumps(proposers)}", *([] if peers else ["peers = []"])]
    if device == "cpu":
        lines += ["", "[search]", "on_cpu = true", "screen_ms = 20.0", "batch = 8"]
    return "\n".join(lines) + "\n"


def port(name: str, home: Path, device: str, timeout_s: float) -> dict[str, Any]:
    """One ``kernelab port`` in its own process: its exit status, wall time and last words."""
    cmd = [sys.executable, "-m", "kernelabd", "port", str(PROBLEMS / f"{name}.py"), "--device", device,
           "--json", "--home", str(home)]
    started = time.monotonic()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"exit": None, "wall_s": time.monotonic() - started, "error": f"timed out after {timeout_s:.0f} s"}
    error = None if done.returncode in (0, 1) else (done.stderr.strip().splitlines() or ["?"])[-1][:300]
    return {"exit": done.returncode, "wall_s": time.monotonic() - started, "error": error}


def job_figures(db: Path, name: str) -> dict[str, Any] | None:
    """The latest job of ``name`` in the home's database, as this benchmark counts it."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    job = conn.execute("SELECT j.* FROM jobs j JOIN problems p ON p.id = j.problem_id WHERE p.name = ? "
                       "ORDER BY j.id DESC LIMIT 1", (name,)).fetchone()
    if job is None:
        return None
    jid = job["id"]
    statuses = dict(conn.execute("SELECT status, COUNT(*) FROM screened WHERE job_id = ? GROUP BY status",
                                 (jid,)).fetchall())
    cands = [dict(r) for r in conn.execute(
        "SELECT id, proposer, edit, verdict, rule, candidate_ms, speedup, accepted, finished_at, result "
        "FROM candidates WHERE job_id = ? ORDER BY id", (jid,))]
    results = [json.loads(c.pop("result") or "{}") or {} for c in cands]
    walls = [w for r in results if isinstance(w := r.get("wall_s"), int | float)]
    batches = [m for (m,) in conn.execute("SELECT message FROM events WHERE job_id = ? AND kind = 'batch.screened' "
                                          "ORDER BY id", (jid,))]
    ceilings = [ts for (ts,) in conn.execute("SELECT ts FROM events WHERE job_id = ? AND kind = 'ceilings.measured'",
                                              (jid,))]
    first = next((c["finished_at"] for c in cands if c["accepted"]), None)
    conn.close()
    return {"job": jid, "state": job["state"], "stop_reason": job["stop_reason"], "error": job["error"],
            "active_s": job["active_s"], "screened": statuses, "batches": len(batches),
            "screening_s": sum(float(m.group(1)) for b in batches if (m := BATCH_SECONDS.search(b))),
            "gated": sum(c["verdict"] is not None for c in cands),
            "ab_timed": sum(c["verdict"] == "pass" and c["candidate_ms"] is not None for c in cands),
            "accepted": sum(bool(c["accepted"]) for c in cands),
            "first_verified_s": first - job["started_at"] if first and job["started_at"] else None,
            "best_speedup_vs_reference": over_reference(cands), "ceilings_measured": len(ceilings),
            "ceilings_s": ceilings[0] - job["started_at"] if ceilings and job["started_at"] else None,
            "evaluation_wall_s": walls, "candidates": cands}


def over_reference(cands: list[dict[str, Any]]) -> float | None:
    """The best candidate's speedup over the reference: each accepted candidate's speedup is over
    the incumbent it replaced (the first's over the reference), so the product of the chain."""
    chain = [c["speedup"] for c in cands if c["accepted"] and c["speedup"]]
    return math.prod(chain) if chain else None


def derive(row: dict[str, Any]) -> dict[str, Any]:
    """Per-minute rates of one row (None where the job did not run)."""
    figures = row.get("figures") or {}
    minutes = (figures.get("active_s") or 0) / 60
    screened = sum((figures.get("screened") or {}).values())
    screening_min = (figures.get("screening_s") or 0) / 60
    return {"problem": row["problem"], "minutes": minutes, "screened": screened,
            "screened_per_min": screened / minutes if minutes else None,
            "screened_per_screening_min": screened / screening_min if screening_min else None,
            "verified_per_min": figures.get("gated", 0) / minutes if minutes else None,
            "first_verified_s": figures.get("first_verified_s"), "ceilings_s": figures.get("ceilings_s"),
            "evaluation_wall_s": figures.get("evaluation_wall_s") or [],
            "charged": charged_parts(figures),
            "speedup": figures.get("best_speedup_vs_reference"),
            "dropped": {k: v for k, v in (figures.get("screened") or {}).items() if k != "timed"},
            "note": row["port"].get("error") or figures.get("error")}


def charged_parts(figures: dict[str, Any]) -> tuple[float, float, float]:
    """Where the job's charged seconds went: evaluations (gate and A/B), screening batches, and
    the rest (the reference's session and capture, charged with the first evaluation's turn)."""
    evaluations = sum(figures.get("evaluation_wall_s") or [])
    screening = figures.get("screening_s") or 0.0
    return evaluations, screening, max(0.0, (figures.get("active_s") or 0.0) - evaluations - screening)


def _f(value: float | None, spec: str = ".3g") -> str:
    return "—" if value is None else format(value, spec)


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| problem | GPU-min | screened | screened/GPU-min | screened/screening-min | verified/GPU-min "
             "| first verified s (ceilings' s in it) | evaluation wall s (min–max) "
             "| charged s: evaluations / screening / rest | best × ref | dropped | note |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for d in map(derive, rows):
        dropped = ", ".join(f"{n} {s}" for s, n in d["dropped"].items()) or "—"
        walls = d["evaluation_wall_s"]
        wall = f"{min(walls):.1f}–{max(walls):.1f}" if walls else "—"
        ceilings = f" ({d['ceilings_s']:.1f})" if d["ceilings_s"] is not None else ""
        charged = " / ".join(f"{x:.1f}" for x in d["charged"])
        lines.append(f"| {d['problem']} | {_f(d['minutes'])} | {d['screened']} | {_f(d['screened_per_min'])} "
                     f"| {_f(d['screened_per_screening_min'])} | {_f(d['verified_per_min'])} "
                     f"| {_f(d['first_verified_s'])}{ceilings} | {wall} | {charged} "
                     f"| {_f(d['speedup'], '.3f')} | {dropped} "
                     f"| {d['note'] or ''} |")
    return "\n".join(lines)


def goals(rows: list[dict[str, Any]]) -> list[str]:
    """The issue's goals, met or not, over the whole run."""
    derived = [derive(r) for r in rows]
    minutes = sum(d["minutes"] for d in derived)
    screened = sum(d["screened"] for d in derived)
    gated = sum((r.get("figures") or {}).get("gated", 0) for r in rows)
    out = []
    if minutes:
        for key, value in (("screened_per_min", screened / minutes), ("verified_per_min", gated / minutes)):
            out.append(f"- {key}: {value:.1f} (goal >= {GOALS[key]:g}) {'met' if value >= GOALS[key] else 'MISSED'}")
    late = [d["problem"] for d in derived
            if d["first_verified_s"] is None or d["first_verified_s"] > GOALS["first_verified_s"]]
    out.append(f"- a first verified port within {GOALS['first_verified_s']:g} s: {len(derived) - len(late)}"
               f"/{len(derived)}" + (f" (not: {', '.join(late)})" if late else ""))
    measured = sum((r.get("figures") or {}).get("ceilings_measured", 0) for r in rows)
    out.append(f"- ceilings measured {measured} time(s) in {len(rows)} jobs (goal: once per device per home)")
    return out


def copy_database(src: Path, dst: Path) -> None:
    """A consistent copy of the home's database (WAL included), for the raw numbers."""
    with sqlite3.connect(f"file:{src}?mode=ro", uri=True) as source, sqlite3.connect(dst) as target:
        source.backup(target)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", nargs="+", metavar="NAME", help="problems (default: all of bench/port)")
    parser.add_argument("--minutes", type=float, default=1.0, help="budget a problem ([jobs] max_minutes)")
    parser.add_argument("--device", default="cuda", help="cuda | cuda:N | cpu")
    parser.add_argument("--proposer", action="append", dest="proposers",
                        help="proposers in order (repeatable; default: template, tune)")
    parser.add_argument("--no-peers", action="store_true",
                        help="time no torch.compile peers in the jobs (their wall is not charged, so the "
                             "rates do not change; the run is shorter)")
    parser.add_argument("--timeout-s", type=float, default=0.0, help="wall limit a port (default: 3 × budget + 120 s)")
    parser.add_argument("--from-homes", nargs="+", type=Path, metavar="HOME",
                        help="run nothing: the table of the jobs already in these kernelab homes (each with a "
                             "kernelab.db, e.g. bench/port's homes), one row a problem")
    return parser.parse_args(argv)


def rows_of_homes(homes: list[Path]) -> list[dict[str, Any]]:
    """One row a problem of each home's database, as if this benchmark had run it."""
    rows = []
    for home in homes:
        db = home / "kernelab.db"
        if not db.exists():
            raise SystemExit(f"{home}: no kernelab.db (not a kernelab home)")
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            names = [n for (n,) in conn.execute("SELECT DISTINCT p.name FROM jobs j JOIN problems p "
                                                "ON p.id = j.problem_id ORDER BY j.id")]
        rows += [{"problem": n, "port": {}, "figures": job_figures(db, n), "home": str(home)} for n in names]
    return rows


def write_table(rows: list[dict[str, Any]], out: Path) -> None:
    text = table(rows) + "\n\n" + "\n".join(goals(rows))
    (out / "table.md").write_text(text + "\n")
    print(text)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_homes:
        args.out.mkdir(parents=True, exist_ok=True)
        rows = rows_of_homes(args.from_homes)
        with (args.out / "screen.jsonl").open("w") as raw:
            raw.writelines(json.dumps(row) + "\n" for row in rows)
        write_table(rows, args.out)
        return 0
    names = sorted(p.stem for p in PROBLEMS.glob("*.py"))
    unknown = set(args.only or []) - set(names)
    if unknown:
        print(f"unknown problem(s): {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    names = [n for n in names if not args.only or n in args.only]
    home = args.out / "home"
    home.mkdir(parents=True, exist_ok=True)
    (home / "kernelab.toml").write_text(config_text(args.minutes, args.device, args.proposers or ["template", "tune"],
                                                           peers=not args.no_peers))
    rows = []
    with (args.out / "screen.jsonl").open("a") as raw:
        for i, name in enumerate(names, 1):
            print(f"[{i}/{len(names)}] {name}", file=sys.stderr, flush=True)
            ran = port(name, home, args.device, args.timeout_s or 3 * args.minutes * 60 + 120)
            row = {"problem": name, "device": args.device, "minutes_budget": args.minutes, "port": ran,
                   "figures": job_figures(home / "kernelab.db", name)}
            rows.append(row)
            raw.write(json.dumps(row) + "\n")
            raw.flush()
    if (home / "kernelab.db").exists():
        copy_database(home / "kernelab.db", args.out / "kernelab.db")
    write_table(rows, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
