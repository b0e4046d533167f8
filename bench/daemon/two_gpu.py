"""Two GPUs: do two jobs run at once, one per GPU, without disturbing each other's timings?

Run from the repository root on a machine with two CUDA GPUs:

    python3 bench/daemon/two_gpu.py --out DIR

1. ``kernelab check`` of the softmax example on cuda:0 alone;
2. the same check on cuda:0 and cuda:1 at the same time (compare cuda:0 with 1.);
3. ``kernelab daemon --once --device cuda`` on two submitted examples, polling
   ``kernelab status --json`` to see both jobs running at once, each on its own GPU.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EX = ROOT / "examples"
CLI = [sys.executable, "-m", "kernelabd"]
QUICK = """\
[jobs]
max_candidates = 2
proposers = ["tune"]
[timing]
budget_s = 2.0
"""


def check_cmd(device: str) -> list[str]:
    return [*CLI, "check", str(EX / "softmax.py"), str(EX / "softmax.new.py"), "--device", device, "--json"]


def summary(stdout: str) -> dict:
    r = json.loads(stdout)
    return {k: r.get(k) for k in ("verdict", "reference_ms", "candidate_ms", "speedup", "speedup_ci", "device")}


def concurrent_checks() -> list[dict]:
    procs = [subprocess.Popen(check_cmd(d), stdout=subprocess.PIPE, text=True) for d in ("cuda:0", "cuda:1")]
    return [summary(p.communicate(timeout=400)[0]) for p in procs]


def daemon_run(home: Path) -> dict:
    home.mkdir(parents=True, exist_ok=True)
    (home / "kernelab.toml").write_text(QUICK)
    files = [EX / f"{n}{s}" for n in ("softmax", "layernorm") for s in (".py", ".toml", ".new.py")]
    subprocess.run([*CLI, "submit", "--home", str(home), *map(str, files)], check=True)
    t0 = time.monotonic()
    daemon = subprocess.Popen([*CLI, "daemon", "--home", str(home), "--once", "--device", "cuda"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    most, devices_seen = 0, set()
    while daemon.poll() is None and time.monotonic() - t0 < 420:
        out = subprocess.run([*CLI, "status", "--home", str(home), "--json"], capture_output=True, text=True)
        if out.returncode == 0:
            jobs = json.loads(out.stdout)["jobs"]
            running = [j for j in jobs if j["state"] == "running"]
            most = max(most, len(running))
            devices_seen |= {j.get("device") for j in running}
        time.sleep(0.5)
    final = json.loads(subprocess.run([*CLI, "status", "--home", str(home), "--json"],
                                      capture_output=True, text=True).stdout)
    return {"max_running_at_once": most, "devices_running": sorted(d for d in devices_seen if d),
            "wall_s": time.monotonic() - t0, "exit": daemon.returncode,
            "jobs": [{k: j.get(k) for k in ("problem", "state", "device", "candidates", "best_speedup")}
                     for j in final["jobs"]]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    alone = summary(subprocess.run(check_cmd("cuda:0"), capture_output=True, text=True, timeout=400).stdout)
    both = concurrent_checks()
    daemon = daemon_run(args.out / "home")
    result = {"alone_cuda0": alone, "together": both, "daemon": daemon}
    (args.out / "two_gpu.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    print("\n| measurement | value |\n|---|---|")
    print(f"| softmax cuda:0 alone: ref ms / cand ms | {alone['reference_ms']:.4f} / {alone['candidate_ms']:.4f} |")
    for r in both:
        print(f"| softmax {r['device']} with the other GPU busy: ref ms / cand ms | "
              f"{r['reference_ms']:.4f} / {r['candidate_ms']:.4f} |")
    print(f"| daemon: most jobs running at once | {daemon['max_running_at_once']} on {daemon['devices_running']} |")


if __name__ == "__main__":
    main()
