"""The scheduler's poison rule with a real daemon: a candidate during whose evaluation the worker
died twice is recorded failed, rule ``hostile``, with both deaths as evidence; it is never
evaluated again, the job goes on to its end, and the daemon keeps serving."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from store.db import NotCreatedYet, connect

CONFIG = """\
[daemon]
stable_s = 0.5
rescan_s = 5.0
[jobs]
max_candidates = 1
proposers = []
[gate]
timeout_s = 300.0
"""


def worker_of(daemon_pid: int) -> int | None:
    """The daemon's worker process (spawned by multiprocessing), if one runs."""
    for entry in os.listdir("/proc"):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text() if entry.isdigit() else ""
            if stat and int(stat.rsplit(")", 1)[1].split()[1]) == daemon_pid and \
                    b"spawn_main" in Path(f"/proc/{entry}/cmdline").read_bytes():
                return int(entry)
        except OSError:
            continue
    return None


def candidate(kit) -> dict | None:
    if not kit.home.db.exists():
        return None
    try:
        conn = connect(kit.home.db, readonly=True)
    except NotCreatedYet:
        return None
    try:
        row = conn.execute("SELECT * FROM candidates ORDER BY id LIMIT 1").fetchone()
    finally:
        conn.close()
    return dict(row) if row else None


@pytest.mark.slow
def test_a_candidate_whose_evaluation_the_worker_dies_in_twice_is_poison_and_the_job_goes_on(kit, tmp_path):
    kit.home.config.write_text(CONFIG)
    hang = (kit.examples / "softmax.new.py").read_text().replace(
        "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n",
        "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n        while True:\n            pass\n")
    (tmp_path / "poison.py").write_text((kit.examples / "softmax.py").read_text())
    (tmp_path / "poison.new.py").write_text(hang)
    daemon = kit.daemon()
    kit.cli("submit", str(tmp_path / "poison.py"), str(tmp_path / "poison.new.py"))
    for death in range(2):
        kit.wait_for(lambda d=death: (c := candidate(kit)) and c["state"] == "evaluating" and c["crashes"] == d,
                     180, f"the candidate's evaluation number {death + 1}")
        time.sleep(2)                                   # well inside its forward
        worker = worker_of(daemon.proc.pid)
        assert worker is not None
        os.kill(worker, signal.SIGKILL)
        kit.wait_for(lambda d=death: (c := candidate(kit)) and c["crashes"] == d + 1, 30, "the death to count")
    job = kit.wait_for(lambda: (j := kit.job_of("poison.py")) and j["state"] not in ("queued", "running") and j,
                       120, "the job to end")
    cand = candidate(kit)
    assert (cand["state"], cand["verdict"], cand["rule"], cand["crashes"]) == ("done", "fail", "hostile", 2)
    deaths = json.loads(cand["evidence"])["deaths"]
    assert [d["cause"] for d in deaths] == ["worker process died (killed by SIGKILL)"] * 2
    assert job["state"] == "failed" and "hostile" in job["error"], job
    assert daemon.proc.poll() is None, "the daemon is still serving"
    assert "event=candidate.hostile" in daemon.output() and "event=job.requeued" in daemon.output()
    assert daemon.stop() == 0
