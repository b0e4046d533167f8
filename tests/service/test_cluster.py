"""The daemon with ``[cluster] backend = "ray"`` on a real local Ray cluster: a head and two
worker nodes on this machine, each offering one CPU "device" (``kernelab_cpu``), and a real
daemon process connected to it as users run it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from store.db import connect
from tests.service.test_daemon import SOFTMAX, evaluating

ray_cluster_utils = pytest.importorskip("ray.cluster_utils")


def cpu_node(cluster: Any, name: str) -> Any:
    """A worker node with one CPU device for kernelab (and a core for its worker process)."""
    return cluster.add_node(num_cpus=1, resources={"kernelab_cpu": 1}, node_name=name)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    c = ray_cluster_utils.Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "node_name": "head",
        # Notice a dead node within a couple of seconds rather than Ray's default ~30 s.
        "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 3}})
    c.nodes_by_name = {n: cpu_node(c, n) for n in ("node-a", "node-b")}
    yield c
    c.shutdown()


def use_cluster(kit, cluster: Any, max_candidates: int) -> None:
    text = kit.home.config.read_text().replace("max_candidates = 2",
                                               f"max_candidates = {max_candidates}")
    kit.home.config.write_text(text + f'[cluster]\nbackend = "ray"\naddress = "{cluster.address}"\n')


def events(kit, kind: str) -> list[dict[str, Any]]:
    conn = connect(kit.home.db, readonly=True)
    try:
        return [dict(r) for r in conn.execute("SELECT * FROM events WHERE kind = ? ORDER BY id",
                                              (kind,))]
    finally:
        conn.close()


def ended(kit) -> dict[str, Any] | None:
    job = kit.job_of("softmax.py")
    return job if job and job["state"] not in ("queued", "running") else None


def test_a_cluster_nobody_answers_at_is_a_one_line_error_naming_the_setting(kit):
    kit.home.config.write_text('[cluster]\nbackend = "ray"\naddress = "127.0.0.1:9"\n')
    out = kit.cli("daemon", "--device", "cpu", check=False, timeout=60)
    assert out.returncode == 1
    assert out.stderr.strip() == ("kernelab daemon: [cluster] address '127.0.0.1:9': no Ray head "
                                  "answers there (ConnectionRefusedError: [Errno 111] Connection "
                                  "refused)")
    kit.home.config.write_text('[cluster]\nbackend = "slurm"\n')
    out = kit.cli("daemon", "--device", "cpu", check=False, timeout=60)
    assert out.returncode == 2 and "[cluster] backend must be one of local, ray" in out.stderr


@pytest.mark.slow
def test_a_job_runs_to_done_on_a_worker_node_and_says_which(kit, cluster):
    use_cluster(kit, cluster, max_candidates=1)
    daemon = kit.daemon()
    kit.drop(*SOFTMAX)
    job = kit.wait_for(lambda: ended(kit), 150, "the softmax job to end")
    assert job["state"] == "done", (job, daemon.output()[-3000:])
    assert job["node"] in ("node-a", "node-b")
    assert job["device"] == f"{job['node']}/cpu:0"
    devices = {d["id"]: d for d in kit.status()["devices"]}
    assert {"node-a/cpu:0", "node-b/cpu:0"} <= set(devices), devices
    assert devices["node-a/cpu:0"]["node"] == "node-a"
    assert devices[job["device"]]["ceilings"]["copy_gbps"] > 0, "measured on that device"
    report = json.loads((kit.home.results / "softmax" / "report.json").read_text())
    assert (report["node"], report["device"]) == (job["node"], job["device"])
    assert f"on node {job['node']}" in (kit.home.results / "softmax" / "report.md").read_text()
    assert daemon.stop() == 0


@pytest.mark.slow
def test_a_node_killed_mid_job_loses_nothing_and_the_job_ends_done_elsewhere(kit, cluster):
    use_cluster(kit, cluster, max_candidates=3)
    daemon = kit.daemon()
    kit.drop(*SOFTMAX)
    kit.wait_for(lambda: evaluating(kit), 150, "an evaluation in flight after an acceptance")
    first = kit.job_of("softmax.py")
    conn = connect(kit.home.db, readonly=True)
    before = [dict(r) for r in conn.execute("SELECT id, state, accepted, params FROM candidates")]
    conn.close()
    cluster.remove_node(cluster.nodes_by_name[first["node"]], allow_graceful=False)

    job = kit.wait_for(lambda: ended(kit), 150, "the job to end after the node loss")
    assert job["state"] == "done", (job, daemon.output()[-3000:])
    assert job["node"] != first["node"], "it went on on the surviving node"
    lost = events(kit, "job.node_lost")
    assert len(lost) == 1 and first["device"] in lost[0]["message"]
    conn = connect(kit.home.db, readonly=True)
    after = [dict(r) for r in conn.execute("SELECT id, state, accepted, params FROM candidates")]
    conn.close()
    assert len(after) == 3 and all(c["state"] == "done" for c in after)
    by_id = {c["id"]: c for c in after}
    for c in before:                           # nothing recorded before the loss was lost …
        assert c["id"] in by_id and by_id[c["id"]]["params"] == c["params"]
        if c["state"] == "done":
            assert by_id[c["id"]]["accepted"] == c["accepted"]
    assert len({c["params"] for c in after}) == len(after), "no configuration evaluated twice"
    assert len(events(kit, "candidate.proposed")) == len(after), "none proposed twice"
    assert len(events(kit, "candidate.redo")) == 1, "the in-flight one evaluated again"
    assert daemon.stop() == 0
