"""The agent proposer against a real chat-completions server on loopback and a real command
agent (a small script): what it sends, what it accepts as one edit, what it records when an
answer is unusable, its budgets and its overlap. No sandbox is started here."""

from __future__ import annotations

import json
import re
import stat
import sys
import time
from pathlib import Path

import pytest

from kernelabd.config import AgentConfig, ConfigError, parse
from kernelabd.propose.agent import AgentProposer
from kernelabd.propose.base import (
    Budget,
    Candidate,
    Decline,
    JobContext,
    Proposal,
    ProposerUnavailable,
    load_proposer,
)
from tests.conftest import EXAMPLES
from tests.propose.chat_server import ChatServer, Step, answer

REFERENCE = (EXAMPLES / "softmax.py").read_text()
PORT = (EXAMPLES / "softmax.new.py").read_text()


def ctx(*history: Candidate, left: int = 10) -> JobContext:
    return JobContext(job_id=1, problem="softmax", reference_source=REFERENCE, device="cpu",
                      budget=Budget(left, 600.0), history=tuple(history))


def incumbent(source: str = PORT) -> Candidate:
    return Candidate(id=1, proposer="template", source=source, edit="port", state="done",
                     verdict="pass", candidate_ms=0.5, speedup=1.2, accepted=True)


def agent(server: ChatServer, **over) -> AgentProposer:
    values = {"kind": "openai", "base_url": server.base_url, "model": "m", "timeout_s": 5.0,
              "retries": 1, **over}
    return AgentProposer("agents.local", AgentConfig(**values))


def test_a_good_answer_is_one_proposal_with_its_exchange_and_the_next_is_asked_ahead(monkeypatch):
    monkeypatch.setenv("MY_KEY", "sk-secret")
    warps4 = PORT.replace("num_warps = 8", "num_warps = 4")
    with ChatServer([answer("num_warps 8 → 4", warps4)]) as server:
        prop = agent(server, api_key_env="MY_KEY", max_tokens=123)
        proposal = prop.propose(ctx(incumbent()))
        assert proposal is not None and proposal.edit == "num_warps 8 → 4"
        assert proposal.source.strip() == warps4.strip() and proposal.parent_id == 1
        assert proposal.params == {"num_warps": 4}
        (ex,) = proposal.exchanges
        assert ex["status"] == "ok" and ex["model"] == "m" and ex["finish_reason"] == "stop"
        assert ex["tokens_in"] == 100 and ex["tokens_out"] > 0 and ex["latency_s"] >= 0
        # While the candidate is gated, the next request is already on its way.
        deadline = time.monotonic() + 5
        while len(server.requests) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(server.requests) == 2
        first = server.requests[0]
        assert first["path"] == "/v1/chat/completions"
        assert first["headers"]["Authorization"] == "Bearer sk-secret"
        body = first["body"]
        assert body["model"] == "m" and body["max_tokens"] == 123 and body["stream"] is True
        system, user = (m["content"] for m in body["messages"])
        assert "class ModelNew" in system and "ONE change per edit" in system
        assert REFERENCE.strip() in user and PORT.strip() in user
        assert "being checked now" in server.requests[1]["body"]["messages"][1]["content"]
    assert "sk-secret" not in json.dumps(ex)


def test_without_api_key_env_no_authorization_is_sent_and_plain_json_answers_work():
    with ChatServer([Step(text=f"EDIT: port\n```python\n{PORT}\n```", stream=False)]) as server:
        proposal = agent(server, stream=False).propose(ctx(left=1))
        assert proposal is not None and proposal.exchanges[0]["tokens_in"] == 100
        assert "Authorization" not in server.requests[0]["headers"]
        assert "stream" not in server.requests[0]["body"]
        assert len(server.requests) == 1, "the job's last candidate: nothing asked ahead"


@pytest.mark.parametrize(("reply", "error"), [
    (Step(text="Use one program per row."), "no usable code"),
    (Step(text=f"EDIT: a\nEDIT: b\n```python\n{PORT}\n```"), "not a single edit: 2 EDIT lines"),
    (Step(text=f"```python\n{PORT}\n```\n```python\n{PORT}\n```"), "not a single edit: the answer holds 2"),
    (answer("nothing", PORT), "no edit: the file is candidate #1 unchanged"),
    (Step(status=500), "HTTP 500"),
    (Step(status=404), "HTTP 404"),
])
def test_unusable_answers_are_failed_proposals_with_their_reason(reply, error):
    with ChatServer([reply]) as server:
        prop = agent(server)
        decline = prop.propose(ctx(incumbent()))
        assert isinstance(decline, Decline)
        failed = prop.take_failed()
        assert failed and all(f["status"] == "failed" for f in failed)
        assert error in failed[-1]["error"] and error in decline.reason
        assert prop.take_failed() == [], "handed over once"
        assert prop.asked == 3, "three failures in a row give the turn away"


def test_two_tunables_changed_at_once_is_not_one_edit():
    two = PORT.replace('TUNABLES = {"num_warps": [1, 2, 4, 8, 16]}',
                       'TUNABLES = {"num_warps": [1, 2, 4, 8, 16], "BLOCK": [1, 2]}\nBLOCK = 1')
    both = two.replace("num_warps = 8", "num_warps = 4").replace("BLOCK = 1", "BLOCK = 2")
    with ChatServer([answer("both", both)]) as server:
        prop = agent(server)
        assert isinstance(prop.propose(ctx(incumbent(two))), Decline)
        assert "2 tunables changed at once (BLOCK, num_warps)" in prop.take_failed()[-1]["error"]


def test_429_is_retried_after_backoff_and_a_slow_answer_times_out():
    with ChatServer([Step(status=429), answer("port", PORT)]) as server:
        proposal = agent(server).propose(ctx(left=1))
        assert isinstance(proposal, Proposal)
        assert [e["status"] for e in proposal.exchanges] == ["failed", "ok"]
        assert proposal.exchanges[0]["error"].startswith("HTTP 429")
    with ChatServer([Step(delay_s=3.0, text="late")]) as server:
        prop = agent(server, timeout_s=0.5)
        started = time.monotonic()
        assert isinstance(prop.propose(ctx(left=1)), Decline)
        assert time.monotonic() - started < 6
        failed = prop.take_failed()
        assert failed[0]["error"].startswith("timeout") and failed[0]["finish_reason"] == "timeout"


def test_budgets_stop_the_agent_with_a_reason():
    with ChatServer([answer("port", PORT)]) as server:
        prop = agent(server, max_proposals=1)
        assert isinstance(prop.propose(ctx(left=1)), Proposal)
        assert prop.propose(ctx(left=1)) == Decline("budget: max_proposals (1) asked")
        spent = agent(server, max_total_tokens=10)
        assert isinstance(spent.propose(ctx(left=1)), Proposal)
        assert "max_total_tokens" in spent.propose(ctx(left=1)).reason


def test_gate_failures_reach_the_prompt_without_the_oracles_values():
    failed = Candidate(id=2, proposer="agents.local", source=PORT, parent_id=1, edit="x",
                       state="done", verdict="fail", rule="timed_mismatch",
                       reason="while timed, output 0 differs",
                       evidence={"sample": 3, "fingerprint": 1.5, "expected": 9.25})
    with ChatServer([answer("port", PORT.replace("8", "4"))]) as server:
        agent(server).propose(ctx(incumbent(), failed, left=1))
        user = server.requests[0]["body"]["messages"][1]["content"]
    assert "#2 (agents.local, edit: x): timed_mismatch: while timed, output 0 differs" in user
    assert '"fingerprint": 1.5' in user and "9.25" not in user and "expected" not in user


def test_an_agent_missing_from_the_config_is_unavailable_with_its_name():
    with pytest.raises(ProposerUnavailable, match=r"no \[agents.nope\] table"):
        load_proposer("agents.nope", parse(""))


def test_agents_tables_are_checked_strictly():
    cfg = parse('[agents.local]\nkind = "openai"\nbase_url = "http://x/v1"\nmodel = "m"\n'
                'timeout_s = 300\n[agents.cli]\nkind = "command"\ncommand = ["a", "{prompt}"]\n')
    assert cfg.agents["local"].timeout_s == 300.0 and cfg.agents["cli"].command == ["a", "{prompt}"]
    for text, message in [('[agents.a]\nkind = "grpc"', "kind must be one of openai, command"),
                          ('[agents.a]\nkind = "openai"\nmodel = "m"', "needs base_url"),
                          ('[agents.a]\nkind = "command"\napi_key = "sk"', "unknown key(s) in "
                                                                           "[agents.a]: api_key"),
                          ('[agents.a]\nkind = "command"', "needs command")]:
        with pytest.raises(ConfigError, match=re.escape(message)):
            parse(text, "k.toml")


AGENT_SCRIPT = """\
import os, pathlib, sys
work = pathlib.Path(sys.argv[2])
prompt = pathlib.Path(sys.argv[1]).read_text()
assert "class Model(nn.Module)" in prompt and (work / "reference.py").is_file()
source = (work / "incumbent.py").read_text().replace("num_warps = 8", "num_warps = 2")
(work / "candidate.py").write_text(source)
(work / "edit.txt").write_text("num_warps 8 -> 2\\n")
"""


def test_a_command_agent_writes_candidate_py_and_edit_txt(tmp_path):
    script = tmp_path / "my-agent.py"
    script.write_text(AGENT_SCRIPT)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    cfg = AgentConfig(kind="command", command=[sys.executable, str(script), "{prompt}", "{workdir}"],
                      timeout_s=30)
    prop = AgentProposer("agents.cli", cfg)
    proposal = prop.propose(ctx(incumbent(), left=1))
    assert proposal is not None, prop.take_failed()
    assert proposal.edit == "num_warps 8 -> 2" and proposal.params == {"num_warps": 2}
    (ex,) = proposal.exchanges
    assert ex["finish_reason"] == "exit 0" and ex["model"] == sys.executable
    assert "candidate.py" in ex["prompt"]


def test_a_command_agent_sees_no_key_and_no_home(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-must-not-leak")
    monkeypatch.setenv("KERNELAB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ALLOWED_TOKEN", "ok")
    out = tmp_path / "seen.json"
    code = (f"import os, json, pathlib; pathlib.Path({str(out)!r}).write_text(json.dumps("
            "{'env': dict(os.environ), 'cwd': os.getcwd()}))")
    cfg = AgentConfig(kind="command", command=[sys.executable, "-c", code], timeout_s=30,
                      pass_env=["ALLOWED_TOKEN"])
    prop = AgentProposer("agents.cli", cfg)
    assert isinstance(prop.propose(ctx(left=1)), Decline)
    assert "without writing candidate.py" in prop.take_failed()[0]["error"]
    seen = json.loads(out.read_text())
    assert "OPENAI_API_KEY" not in seen["env"] and "KERNELAB_HOME" not in seen["env"]
    assert seen["env"]["ALLOWED_TOKEN"] == "ok"
    assert seen["env"]["HOME"] == seen["cwd"] and "kernelab-agent-" in seen["cwd"]
    assert not Path(seen["cwd"]).exists(), "the work directory is removed afterwards"


def test_a_command_agent_past_its_time_limit_is_killed_and_recorded():
    cfg = AgentConfig(kind="command", command=[sys.executable, "-c", "import time; time.sleep(30)"],
                      timeout_s=0.5)
    prop = AgentProposer("agents.cli", cfg)
    started = time.monotonic()
    assert isinstance(prop.propose(ctx(left=1)), Decline)
    assert time.monotonic() - started < 10
    failed = prop.take_failed()
    assert failed[0]["finish_reason"] == "timeout" and failed[0]["error"].startswith("timeout")


def test_closing_records_an_answer_asked_ahead_and_never_used():
    with ChatServer([answer("port", PORT), answer("again", PORT.replace("8", "2"))]) as server:
        prop = agent(server)
        assert isinstance(prop.propose(ctx(left=5)), Proposal)
        deadline = time.monotonic() + 5
        while (prop._ahead is None or prop._ahead.result(wait=False) is None) \
                and time.monotonic() < deadline:
            time.sleep(0.02)
        (unused,) = prop.close()
        assert unused["status"] == "unused" and "job ended" in unused["error"]
        assert "again" in unused["response"]
    with ChatServer([answer("port", PORT), Step(delay_s=3.0, text="late")]) as server:
        prop = agent(server)
        assert isinstance(prop.propose(ctx(left=5)), Proposal)
        (abandoned,) = prop.close()
        assert abandoned["error"].startswith("abandoned") and "class Model" in abandoned["prompt"]


def test_the_capture_and_the_gap_to_the_fastest_candidate_reach_the_prompt():
    capture = {"flops": 48000, "min_bytes": 128000, "sol": {"ms": 0.01, "bound": "memory"},
               "launches": [{"name": "softmax_warp_forward", "count": 1, "device_us": 12.5}]}
    faster = Candidate(id=2, proposer="tune", source=PORT, parent_id=1, edit="num_warps 8 → 4",
                       state="done", verdict="pass", candidate_ms=0.4, speedup=1.01)
    context = JobContext(job_id=1, problem="softmax", reference_source=REFERENCE, device="cuda",
                         budget=Budget(1, 60.0), capture=capture, history=(incumbent(), faster))
    with ChatServer([answer("port", PORT.replace("8", "2"))]) as server:
        agent(server).propose(context)
        user = server.requests[0]["body"]["messages"][1]["content"]
    assert "FLOPs: 48,000" in user and "bytes moved at least: 128,000" in user
    assert "speed-of-light floor on this device: 0.01 ms (memory-bound)" in user
    assert "softmax_warp_forward ×1, 12.5 µs" in user
    assert "fastest passing candidate so far: #2 (tune) 0.4 ms, a gap of 1.250x" in user
    assert "gap to the speed-of-light floor: 50.00x" in user
    assert "#2 tune: num_warps 8 → 4 → passed, not faster than noise (1.010x)" in user
