"""``kernelab port REF --proposer agents.local`` against a real chat-completions server on
loopback, and a daemon job running ``["template", "agents.local", "tune"]`` in that order.

One port job walks through every scripted outcome (429 then success, an answer without code,
code that does not compile, a slow answer past the timeout, 500s), so the sandboxes are paid
for once: the job must end with each of them recorded, none crashing it.
"""

from __future__ import annotations

import json
import sqlite3

import pytest

from tests.conftest import EXAMPLES
from tests.propose.chat_server import ChatServer, Step, answer

SOFTMAX = (EXAMPLES / "softmax.new.py").read_text()
BROKEN = SOFTMAX.replace("def forward(self, x: torch.Tensor)", "def forward(self, x: torch.Tensor")

AGENT_TOML = """
[agents.local]
kind = "openai"
base_url = "{url}"
model = "scripted-coder"
api_key_env = "KERNELAB_TEST_KEY"
timeout_s = {timeout_s}
retries = 1
max_proposals = {max_proposals}
"""


def configure(kit, server: ChatServer, *, timeout_s: float = 20.0, max_proposals: int = 20,
              proposers: str = '["tune"]', max_candidates: int = 4) -> None:
    text = kit.home.config.read_text().replace('proposers = ["tune"]', f"proposers = {proposers}")
    text = text.replace("max_candidates = 2", f"max_candidates = {max_candidates}")
    kit.home.config.write_text(text + AGENT_TOML.format(url=server.base_url, timeout_s=timeout_s,
                                                        max_proposals=max_proposals))


def rows(kit, sql: str, *args) -> list[dict]:
    conn = sqlite3.connect(kit.home.db)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(sql, args)]
    finally:
        conn.close()


@pytest.mark.slow
def test_port_with_an_agent_records_every_outcome_and_names_it_in_the_lineage(kit, monkeypatch,
                                                                            tmp_path):
    reference = tmp_path / "softmax.py"       # without softmax.new.py: the agent writes the port
    reference.write_text((EXAMPLES / "softmax.py").read_text())
    monkeypatch.setenv("KERNELAB_TEST_KEY", "sk-test-secret")
    script = [Step(status=429, headers=(("Retry-After", "0"),)),
              answer("port: one program per row, num_warps 8", SOFTMAX),
              Step(text="I would use a Triton kernel with one program per row."),
              answer("rewrite the forward signature", BROKEN),
              Step(delay_s=6.0, text="too late"),
              Step(status=500)]
    with ChatServer(script) as server:
        configure(kit, server, timeout_s=3.0)
        out = kit.cli("port", str(reference), "--proposer", "agents.local",
                      "--device", "cpu", "--json", check=False, timeout=300)
    assert out.returncode == 0, out.stderr
    assert server.requests[0]["headers"]["Authorization"] == "Bearer sk-test-secret"
    job = json.loads(out.stdout)
    assert job["state"] == "done" and job["accepted"] == 1, job
    cands = rows(kit, "SELECT id, proposer, verdict, rule, candidate_ms, accepted, edit "
                      "FROM candidates ORDER BY id")
    assert [c["proposer"] for c in cands] == ["agents.local", "agents.local"]
    good, broken = cands
    assert good["verdict"] == "pass" and good["accepted"] and good["candidate_ms"] > 0
    assert good["edit"] == "port: one program per row, num_warps 8"
    assert broken["verdict"] in ("fail", "error") and not broken["accepted"]

    ex = rows(kit, "SELECT * FROM agent_exchanges ORDER BY id")
    outcome = [(e["candidate_id"], e["status"], (e["error"] or "").split(":")[0]) for e in ex]
    # The 429 and its retry belong to the transcript of the candidate they produced.
    assert outcome[:5] == [(good["id"], "failed", "HTTP 429"), (good["id"], "ok", ""),
                           (None, "failed", "no usable code"), (broken["id"], "ok", ""),
                           (None, "failed", "timeout")], outcome
    assert all(o == (None, "failed", "HTTP 500") for o in outcome[5:])
    assert len(outcome) > 5
    first = ex[1]
    assert first["model"] == "scripted-coder" and first["tokens_in"] == 100 and first["tokens_out"] > 0
    assert first["finish_reason"] == "stop" and first["latency_s"] >= 0
    assert "class Model(nn.Module)" in first["prompt"] and "class ModelNew" in first["response"]
    assert "sk-test-secret" not in json.dumps(ex), "the key is never recorded"
    # The answer after the broken file saw the gate's verdict on it (its rule, its evidence).
    later = [e["prompt"] for e in ex if e["id"] > ex[3]["id"]]
    assert any(f"#{broken['id']}" in p and broken["rule"] in p for p in later)

    shown = json.loads(kit.cli("jobs", "transcript", str(job["id"]), "--candidate",
                               str(good["id"]), "--json").stdout)
    assert [e["id"] for e in shown] == [ex[0]["id"], ex[1]["id"]]
    assert "EDIT: port: one program per row" in kit.cli("jobs", "transcript", str(job["id"])).stdout

    report = json.loads((kit.home.results / "softmax" / "report.json").read_text())
    assert [s["proposer"] for s in report["lineage"]] == ["agents.local"]
    events = {e["kind"] for e in rows(kit, "SELECT kind FROM events")}
    assert {"proposal.failed", "proposer.declined"} <= events


@pytest.mark.slow
def test_a_daemon_job_runs_template_then_the_agent_then_tune(kit):
    tuned = SOFTMAX.replace("num_warps = 8", "num_warps = 4")
    with ChatServer([answer("num_warps 8 → 4", tuned)]) as server:
        configure(kit, server, max_proposals=1, proposers='["template", "agents.local", "tune"]',
                  max_candidates=4)
        kit.drop("softmax.py")
        daemon = kit.daemon("--once")
        assert daemon.proc.wait(400) == 0, daemon.output()
    order = [c["proposer"] for c in rows(kit, "SELECT proposer FROM candidates ORDER BY id")]
    first = {name: order.index(name) for name in ("template", "agents.local", "tune")}
    assert first["template"] < first["agents.local"] < first["tune"], order
    assert order.count("agents.local") == 1
    (ex,) = rows(kit, "SELECT e.status, c.proposer FROM agent_exchanges e "
                      "JOIN candidates c ON c.id = e.candidate_id")
    assert ex == {"status": "ok", "proposer": "agents.local"}, "recorded through the worker's pipe"
    assert order == sorted(order, key=["template", "agents.local", "tune"].index), order


def test_port_refuses_an_agent_missing_from_the_config_before_recording_a_job(kit):
    out = kit.cli("port", str(EXAMPLES / "softmax.py"), "--proposer", "agents.local",
                  "--device", "cpu", check=False)
    assert out.returncode == 2
    assert out.stderr.strip() == ("kernelab port: proposer 'agents.local': kernelab.toml has no "
                                  "[agents.local] table (agents: none configured)")
    assert not kit.home.db.exists() or not rows(kit, "SELECT id FROM jobs")
