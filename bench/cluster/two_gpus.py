"""The daemon on a Ray cluster of two GPU worker nodes, one GPU each (issue 18, on the device).

Run from the repository root on a machine with two or more CUDA GPUs, with Ray installed
(``pip install -e '.[ray]'``):

    python3 bench/cluster/two_gpus.py

It starts a local Ray cluster (a head without GPUs and two worker nodes pinned to GPU 0 and
GPU 1 with ``CUDA_VISIBLE_DEVICES``), submits four examples, runs ``kernelab daemon --once``
with ``[cluster] backend = "ray"`` and polls ``kernelab status --json``. Its last lines are a
table: each job's state, node, device and best speedup, how many jobs ran at once (2
expected: one per GPU), and the devices with their nodes and last NVML sample (sampled on
their own node; not null expected).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ray.cluster_utils import Cluster

ROOT = Path(__file__).resolve().parents[2]
EX = ROOT / "examples"
CLI = [sys.executable, "-m", "kernelabd"]
PROBLEMS = ("softmax", "layernorm", "gelu_gate", "matmul")
DEADLINE_S = 480
CONFIG = """\
[jobs]
max_candidates = 4
max_minutes = 3.0
proposers = ["tune"]
[timing]
budget_s = 2.0
[cluster]
backend = "ray"
address = "{address}"
"""


def start_cluster() -> Cluster:
    """A head without GPUs and one worker node per GPU (Ray reads CUDA_VISIBLE_DEVICES when a
    node starts, so each node sees and offers only its own GPU)."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 0,
                                                            "node_name": "head"})
    for index in (0, 1):
        os.environ["CUDA_VISIBLE_DEVICES"] = str(index)
        cluster.add_node(num_cpus=4, num_gpus=1, node_name=f"gpu{index}")
    del os.environ["CUDA_VISIBLE_DEVICES"]
    return cluster


def status(home: Path) -> dict | None:
    out = subprocess.run([*CLI, "status", "--home", str(home), "--json"], capture_output=True,
                         text=True)
    return json.loads(out.stdout) if out.returncode == 0 else None


def run(home: Path, address: str) -> tuple[dict, int, int]:
    home.mkdir(parents=True, exist_ok=True)
    (home / "kernelab.toml").write_text(CONFIG.format(address=address))
    files = [EX / f"{n}{s}" for n in PROBLEMS for s in (".py", ".toml", ".new.py")]
    subprocess.run([*CLI, "submit", "--home", str(home), *map(str, files)], check=True)
    log = (home / "daemon.log").open("w")
    daemon = subprocess.Popen([*CLI, "daemon", "--home", str(home), "--once"], stdout=log,
                              stderr=subprocess.STDOUT)
    most, t0 = 0, time.monotonic()
    while daemon.poll() is None and time.monotonic() - t0 < DEADLINE_S:
        snap = status(home)
        if snap:
            most = max(most, sum(j["state"] == "running" for j in snap["jobs"]))
        time.sleep(1.0)
    if daemon.poll() is None:
        daemon.terminate()
    code = daemon.wait(30)
    return status(home) or {"jobs": [], "devices": []}, most, code


def main() -> None:
    cluster = start_cluster()
    try:
        with tempfile.TemporaryDirectory(prefix="kernelab-cluster-") as tmp:
            snap, most, code = run(Path(tmp) / "home", cluster.address)
            print((Path(tmp) / "home" / "daemon.log").read_text()[-2000:])
    finally:
        cluster.shutdown()
    print(f"daemon exit code {code}; most jobs running at once: {most}")
    print(f"{'job':>4} {'problem':<14} {'state':<9} {'node':<6} {'device':<12} {'speedup':>8}")
    for j in snap["jobs"]:
        speedup = f"{j['best_speedup']:.3f}" if j["best_speedup"] else "—"
        print(f"{j['id']:>4} {j['problem']:<14} {j['state']:<9} {j['node'] or '—':<6} "
              f"{j['device'] or '—':<12} {speedup:>8}")
    for d in snap["devices"]:
        sample = d["sample"] or {}
        print(f"device {d['id']:<12} node {d['node']:<6} {d['name']}  last NVML sample: "
              f"SM {sample.get('sm_clock_mhz')} MHz, {sample.get('temperature_c')} °C, "
              f"{sample.get('power_w')} W")


if __name__ == "__main__":
    main()
