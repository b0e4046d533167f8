"""KernelBench at its own sizes through ``kernelab inspect``: does every problem either run with
its float64 oracle or get refused up front with its memory reason, and what does each kernelab
process hold meanwhile?

    python3 bench/kernelbench/sweep.py --out $OUT/sweep --device cuda --parallel 6
    python3 bench/kernelbench/sweep.py --out $OUT/sweep2 --device cuda --skip rows.jsonl  # the rest
    python3 bench/kernelbench/sweep.py --out /tmp/sweep --device cpu --only 19_ReLU   # logic check

Problems come from bench/coverage/kernelbench/level{1,2}/ (KernelBench's files, its LICENSE
beside them). Problems whose inputs, outputs and weights (``sizes.json``, measured on the meta
device) pass ``--big-gib`` run one at a time, so that each one's memory plan sees the device
nearly free; the rest run beside them, ``--parallel`` at once (the first alone: it measures
the home's ceilings). Each row: outcome (ok | refused | crashed | timeout), reason, wall
seconds, the trusted process's and the reference sandbox's peak resident memory, the
reference's device peak and arena bytes, and the memory plan. A row is written as soon as its
problem ends, so a cut run keeps what it did.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
PROBLEMS = ROOT / "bench" / "coverage" / "kernelbench"
SIZES = Path(__file__).with_name("sizes.json")
GiB = 1 << 30


def problems(only: list[str]) -> list[Path]:
    found = sorted(PROBLEMS.glob("level1/*.py")) + sorted(PROBLEMS.glob("level2/*.py"))
    return [p for p in found if not only or any(o in f"{p.parent.name}/{p.stem}" for o in only)]


def measure_sizes(paths: list[Path]) -> dict:
    """Each problem's bytes on the meta device (``sizes.py``), when no ``sizes.json`` was committed."""
    from bench.kernelbench.sizes import meta_bytes_many

    return meta_bytes_many(paths)


def size_of(path: Path, sizes: dict) -> float:
    entry = sizes.get(f"{path.parent.name}/{path.name}") or {}
    return float(entry.get("bytes", 0)) / GiB


def inspect(path: Path, device: str, home: Path, timeout_s: float) -> dict:
    t0 = time.monotonic()
    cmd = [sys.executable, "-m", "kernelabd", "inspect", str(path), "--device", device, "--json", "--home", str(home)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                  p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)})
    except subprocess.TimeoutExpired:
        return {"problem": key(path), "outcome": "timeout", "wall_s": timeout_s}
    row = {"problem": key(path), "exit": proc.returncode,
           "wall_s": round(time.monotonic() - t0, 2)}
    try:
        report = json.loads(proc.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        return {**row, "outcome": "crashed", "reason": (proc.stderr or proc.stdout)[-500:]}
    mem = report.get("memory") or {}
    plan = report.get("plan") or {}
    return {**row, "outcome": report["outcome"], "reason": report.get("reason"),
            "trusted_rss_gib": _gib(mem.get("trusted_rss_peak_bytes")),
            "reference_rss_gib": _gib(mem.get("reference_rss_peak_bytes")),
            "reference_device_gib": _gib(mem.get("reference_device_peak_bytes")),
            "reference_arena_gib": _gib(mem.get("reference_arena_bytes")),
            "plan": {k: plan.get(k) for k in ("gate_sets", "timing_sets", "oracle", "oracle_chunks",
                                              "needs_device_bytes", "dropped")} if plan else None,
            "sol_ms": (report.get("speed_of_light") or {}).get("ms")}


def _gib(n: object) -> float | None:
    return round(n / GiB, 3) if isinstance(n, int | float) else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--parallel", type=int, default=6)
    ap.add_argument("--big-gib", type=float, default=2.0)
    ap.add_argument("--timeout-s", type=float, default=300)
    ap.add_argument("--deadline-s", type=float, default=1e9, help="start no problem after this long")
    ap.add_argument("--only", nargs="*", default=[])
    ap.add_argument("--skip", nargs="*", type=Path, default=[],
                    help="rows.jsonl of earlier runs: their problems are done")
    ap.add_argument("--report", nargs="+", type=Path,
                    help="only write OUT/table.md from these rows.jsonl (the last row of a problem counts)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.report:
        rows = latest(args.report)
        seen = {r["problem"] for r in rows}
        rows += [{"problem": key(p), "outcome": "not run"} for p in problems(args.only) if key(p) not in seen]
        (args.out / "table.md").write_text(table(rows) + "\n")
        print(json.dumps(summary(rows)))
        return
    started = time.monotonic()
    rows = sweep(args)
    print(json.dumps(summary(rows) | {"skipped_as_done": len(done_in(args.skip)),
                                      "wall_s": round(time.monotonic() - started, 1)}))


def sweep(args: argparse.Namespace) -> list[dict]:
    home = args.out / "home"
    todo = problems(args.only)
    sizes = json.loads(SIZES.read_text()) if SIZES.exists() else measure_sizes(todo)
    (args.out / "sizes.json").write_text(json.dumps(sizes, indent=1, sort_keys=True))
    done = done_in(args.skip)
    todo = [p for p in todo if key(p) not in done]
    big = [p for p in todo if size_of(p, sizes) >= args.big_gib]
    small = [p for p in todo if p not in big]
    rows_path = args.out / "rows.jsonl"
    start = time.monotonic()
    lock = threading.Lock()
    running = [0]

    def one(path: Path) -> dict:
        if time.monotonic() - start > args.deadline_s:
            return {"problem": key(path), "outcome": "not run (deadline)"}
        with lock:
            beside = running[0]
            running[0] += 1
        try:
            row = {**inspect(path, args.device, home, args.timeout_s), "beside": beside}
        finally:
            with lock:
                running[0] -= 1
        with open(rows_path, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"{row['problem']:70s} {row['outcome']:10s} {row.get('wall_s', 0):7.1f} s "
              f"{(row.get('reason') or '')[:90]}", flush=True)
        return row

    rows = [one(small.pop(0))] if small else []     # measures the home's ceilings, alone
    with ThreadPoolExecutor(args.parallel) as pool:
        lane = pool.submit(lambda: [one(p) for p in big])   # one large problem at a time
        rows += list(pool.map(one, small)) + lane.result()
    again = [r["problem"] for r in rows if crowded_out(r)]
    by_key = {key(p): p for p in todo}
    rows += [one(by_key[name]) for name in again]          # alone, so its plan sees the whole device
    return latest_of(rows)


def crowded_out(row: dict) -> bool:
    """A refusal for memory while other problems ran beside it: their sets held the memory its
    plan needed, so it is run again alone before it counts."""
    reason = row.get("reason") or ""
    return row.get("outcome") == "refused" and row.get("beside", 1) > 0 and (
        "of GPU memory" in reason or "does not fit on the device" in reason)


def key(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"


def latest_of(rows: list[dict]) -> list[dict]:
    """One row a problem: its last, in the order problems first appeared; a cut row or a
    crowded-out refusal never hides a result the problem had."""
    found: dict[str, dict] = {}
    for row in rows:
        had = found.get(row["problem"])
        if had is None or not (row["outcome"].startswith("not run") or (crowded_out(row) and not crowded_out(had))):
            found[row["problem"]] = row
    return list(found.values())


def latest(paths: list[Path]) -> list[dict]:
    return latest_of([json.loads(line) for path in paths for line in path.read_text().splitlines()])


def done_in(paths: list[Path]) -> set[str]:
    """Problems an earlier, cut run already has a row for (``--skip``): a sweep spread over
    several commands of a lent machine's limit. A problem not run, or crowded out of memory by
    its neighbours, is still to do. Any file's final row counts, whatever order the files come in
    (a shell's glob put session 10's alone-rerun before the crowded row it settled)."""
    rows = [json.loads(line) for path in paths for line in path.read_text().splitlines()]
    return {r["problem"] for r in rows if not r["outcome"].startswith("not run") and not crowded_out(r)}


def summary(rows: list[dict]) -> dict:
    outcomes = {k: sum(1 for r in rows if r["outcome"] == k) for k in sorted({r["outcome"] for r in rows})}
    peak = {f"max_{k}": max((r.get(k) or 0) for r in rows) if rows else 0
            for k in ("trusted_rss_gib", "reference_rss_gib", "reference_device_gib", "wall_s")}
    return {"problems": len(rows), "outcomes": outcomes, **peak}


def table(rows: list[dict]) -> str:
    """One line a problem: outcome, wall, each process's peak memory, the plan, the reason."""
    lines = ["| problem | outcome | wall s | trusted RSS GiB | reference RSS GiB | reference device GiB "
             "| arenas GiB | plan (gate/timing sets, oracle chunks, needs GiB) | reason |",
             "|---|---|---:|---:|---:|---:|---:|---|---|"]
    for r in sorted(rows, key=lambda r: (r["problem"].split("/")[0], int(r["problem"].split("/")[1].split("_")[0]))):
        plan = r.get("plan") or {}
        shown = (f"{plan.get('gate_sets')}/{plan.get('timing_sets')}, {plan.get('oracle_chunks')}, "
                 f"{(plan.get('needs_device_bytes') or 0) / GiB:.1f}") if plan.get("gate_sets") else ""
        reason = " ".join((r.get("reason") or "").split()).replace(str(ROOT) + "/", "").replace("|", "/")[:240]
        lines.append(f"| {r['problem']} | {r['outcome']} | {r.get('wall_s', '')} | {_cell(r.get('trusted_rss_gib'))} "
                     f"| {_cell(r.get('reference_rss_gib'))} | {_cell(r.get('reference_device_gib'))} "
                     f"| {_cell(r.get('reference_arena_gib'))} | {shown} | {reason} |")
    return "\n".join(lines)


def _cell(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    main()
