"""KernelBench at its own sizes through ``kernelab inspect``: does every problem either run with
its float64 oracle or get refused up front with its memory reason, and what does each kernelab
process hold meanwhile?

    python3 bench/kernelbench/sweep.py --out $OUT/sweep --device cuda --parallel 6
    python3 bench/kernelbench/sweep.py --out /tmp/sweep --device cpu --only 19_ReLU   # logic check

Problems come from bench/coverage/kernelbench/level{1,2}/ (KernelBench's files, its LICENSE
beside them). Problems whose inputs, outputs and weights (``sizes.json``, measured on the meta
device) pass ``--big-gib`` run one at a time; the rest run ``--parallel`` at once. Each row:
outcome (ok | refused | crashed | timeout), reason, wall seconds, the trusted process's and the
reference sandbox's peak resident memory, the reference's device peak and arena bytes, and the
memory plan. A row is written as soon as its problem ends, so a cut run keeps what it did.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
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


def measure_sizes(paths: list[Path], parallel: int) -> dict:
    """Each problem's bytes on the meta device (``sizes.py``), many at once: a few seconds each."""
    from bench.kernelbench.sizes import meta_bytes

    with ThreadPoolExecutor(parallel) as pool:
        found = list(pool.map(meta_bytes, paths))
    return {f"{p.parent.name}/{p.name}": f for p, f in zip(paths, found, strict=True)}


def size_of(path: Path, sizes: dict) -> float:
    entry = sizes.get(f"{path.parent.name}/{path.name}") or {}
    return float(entry.get("bytes", 0)) / GiB


def inspect(path: Path, device: str, home: Path, timeout_s: float) -> dict:
    t0 = time.monotonic()
    cmd = [sys.executable, "-m", "kernelabd", "inspect", str(path), "--device", device, "--json", "--home", str(home)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    except subprocess.TimeoutExpired:
        return {"problem": f"{path.parent.name}/{path.stem}", "outcome": "timeout", "wall_s": timeout_s}
    row = {"problem": f"{path.parent.name}/{path.stem}", "exit": proc.returncode,
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
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    home = args.out / "home"
    todo = problems(args.only)
    sizes = json.loads(SIZES.read_text()) if SIZES.exists() else measure_sizes(todo, args.parallel * 2)
    (args.out / "sizes.json").write_text(json.dumps(sizes, indent=1, sort_keys=True))
    big = [p for p in todo if size_of(p, sizes) >= args.big_gib]
    small = [p for p in todo if p not in big]
    rows_path = args.out / "rows.jsonl"
    start = time.monotonic()

    def one(path: Path) -> dict:
        if time.monotonic() - start > args.deadline_s:
            return {"problem": f"{path.parent.name}/{path.stem}", "outcome": "not run (deadline)"}
        row = inspect(path, args.device, home, args.timeout_s)
        with open(rows_path, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"{row['problem']:70s} {row['outcome']:10s} {row.get('wall_s', 0):7.1f} s "
              f"{(row.get('reason') or '')[:90]}", flush=True)
        return row

    rows = [one(p) for p in big]
    with ThreadPoolExecutor(args.parallel) as pool:
        rows += list(pool.map(one, small))
    summary = {k: sum(1 for r in rows if r["outcome"] == k) for k in sorted({r["outcome"] for r in rows})}
    trusted = max((r.get("trusted_rss_gib") or 0) for r in rows) if rows else 0
    print(json.dumps({"problems": len(rows), "outcomes": summary, "max_trusted_rss_gib": trusted,
                      "wall_s": round(time.monotonic() - start, 1)}))


if __name__ == "__main__":
    main()
