"""Daemon benchmarks for issue 3's "Measured" section; prints one JSON object.

    .venv/bin/python bench/daemon/bench.py [--idle-s 30]

1. drop_200: 200 references submitted at once into a running CPU daemon: seconds until all
   200 are recorded (jobs), duplicates, and ``kernelab status --json`` latency throughout.
2. store_rows_per_s: measurement rows (``blocks``, 8 samples each) written through
   ``Store.finish_candidate`` into the daemon's database while the daemon is busy running a job.
3. idle_cpu_pct: the daemon's CPU use (utime+stime from /proc) over ``--idle-s`` seconds with an
   empty inbox and no jobs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from store.db import connect  # noqa: E402
from store.records import NewProblem, Store  # noqa: E402

KERNELAB = str(Path(sys.executable).with_name("kernelab"))
CONFIG = "[daemon]\nstable_s = 0.5\n[jobs]\nmax_candidates = 50\nproposers = [\"tune\"]\n"


def start(home: Path) -> subprocess.Popen:
    home.mkdir(parents=True, exist_ok=True)
    (home / "kernelab.toml").write_text(CONFIG)
    proc = subprocess.Popen([KERNELAB, "daemon", "--home", str(home), "--device", "cpu"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not (home / "kernelab.db").exists():
        time.sleep(0.05)
    time.sleep(1)
    return proc


def status(home: Path) -> tuple[dict, float]:
    t0 = time.monotonic()
    out = subprocess.run([KERNELAB, "status", "--json", "--home", str(home)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout), time.monotonic() - t0


def drop_200(tmp: Path) -> dict:
    home = tmp / "drop"
    proc = start(home)
    source = (ROOT / "examples" / "softmax.py").read_text()
    files = []
    for i in range(200):
        path = tmp / f"k{i:03d}.py"
        path.write_text(source.replace("dim = 1000", f"dim = {1000 + i}"))
        files.append(str(path))
    t0 = time.monotonic()
    subprocess.run([KERNELAB, "submit", "--home", str(home), *files], check=True,
                   capture_output=True)
    latencies = []
    while True:
        data, took = status(home)
        latencies.append(took)
        if len(data["jobs"]) >= 200 or time.monotonic() - t0 > 30:
            break
    recorded_s = time.monotonic() - t0
    time.sleep(3)
    data, took = status(home)
    latencies.append(took)
    names = [j["problem"] for j in data["jobs"]]
    proc.terminate()
    proc.wait(15)
    return {"files": 200, "recorded": len(names), "unique": len(set(names)),
            "all_recorded_s": round(recorded_s, 3),
            "status_s_max": round(max(latencies), 3),
            "status_s_median": round(statistics.median(latencies), 3),
            "status_calls": len(latencies)}


def store_throughput(tmp: Path, rounds: int = 200, blocks: int = 50) -> dict:
    home = tmp / "busy"
    proc = start(home)
    for name in ("softmax.py", "softmax.toml", "softmax.new.py"):
        (home / "inbox" / name).write_text((ROOT / "examples" / name).read_text())
    conn = connect(home / "kernelab.db", readonly=True)
    while conn.execute("SELECT COUNT(*) FROM jobs WHERE state = 'running'").fetchone()[0] == 0:
        time.sleep(0.1)
    time.sleep(3)   # the worker is now importing torch and running the harness
    store = Store(connect(home / "kernelab.db"))
    _, job = store.add_problem(NewProblem("bench", "bench.py", "# bench\n"), state="done")
    result = {"verdict": "pass", "speedup": 1.0, "speedup_ci": [0.99, 1.01],
              "blocks": [{"side": "AB"[i % 2], "idx": i, "samples_ms": [0.1] * 8,
                          "median_ms": 0.1, "clock": None, "throttled": False}
                         for i in range(blocks)]}
    t0 = time.perf_counter()
    for _ in range(rounds):
        cid = store.add_candidate(job, proposer="bench", source="x")
        store.finish_candidate(cid, result, accepted=False)
    elapsed = time.perf_counter() - t0
    busy = conn.execute("SELECT COUNT(*) FROM jobs WHERE state = 'running'").fetchone()[0]
    proc.terminate()
    proc.wait(15)
    return {"rows": rounds * blocks, "seconds": round(elapsed, 3),
            "rows_per_s": round(rounds * blocks / elapsed), "transactions": rounds * 2,
            "daemon_running_jobs_at_end": busy}


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])    # utime + stime


def idle_cpu(tmp: Path, seconds: float) -> dict:
    proc = start(tmp / "idle")
    time.sleep(3)
    t0, c0 = time.monotonic(), cpu_ticks(proc.pid)
    time.sleep(seconds)
    t1, c1 = time.monotonic(), cpu_ticks(proc.pid)
    proc.terminate()
    proc.wait(15)
    hz = os.sysconf("SC_CLK_TCK")
    return {"seconds": round(t1 - t0, 1), "cpu_s": (c1 - c0) / hz,
            "idle_cpu_pct": round(100 * (c1 - c0) / hz / (t1 - t0), 3)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--idle-s", type=float, default=30.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
               "drop_200": drop_200(Path(tmp)),
               "store": store_throughput(Path(tmp)),
               "idle": idle_cpu(Path(tmp), args.idle_s)}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
