"""The convergence loop with the real harness on CPU, and its stop and acceptance rules."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from kernelabd.client import ensure_home
from kernelabd.config import load
from kernelabd.propose.base import Candidate
from kernelabd.service.converge import Limits, Loop, decide, stop_reason
from kernelabd.service.recorder import LocalRecorder
from store.db import connect
from store.records import NewProblem, Store

REF_RAISING = '''import torch
class Model(torch.nn.Module):
    def forward(self, x):
        return x * 2
def get_inputs():
    raise RuntimeError("no inputs today")
def get_init_inputs():
    return []
'''

WRONG = '''import torch, triton, triton.language as tl
@triton.jit
def k(o, i, n, B: tl.constexpr):
    c = tl.arange(0, B)
    tl.store(o + c, tl.load(i + c, mask=c < n), mask=c < n)
class ModelNew(torch.nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        k[(1,)](out, x, x.numel(), B=triton.next_power_of_2(x.numel()))
        return out
'''


def loop_for(home, problem: NewProblem, job_config: dict | None = None) -> tuple[Loop, Store]:
    ensure_home(home)
    store = Store(connect(home.db))
    _, job_id = store.add_problem(problem, job_config=job_config)
    store.start_job(job_id, "cpu")
    loop = Loop(job_id, LocalRecorder(store, home), config=load(home.config),
                device="cpu", workdir=home.work / f"job-{job_id}")
    return loop, store


def cand(cid: int, accepted: bool = False, state: str = "done", ms: float | None = None):
    return Candidate(id=cid, proposer="t", source="", state=state, accepted=accepted,
                     candidate_ms=ms, verdict="pass")


def test_stop_rules():
    limits = Limits(max_candidates=5, max_minutes=1.0, patience=2)
    assert stop_reason(limits, [cand(1, True)], 0.0, None) is None
    assert "max_candidates" in stop_reason(limits, [cand(i) for i in range(5)], 0.0, None)
    assert "max_minutes" in stop_reason(limits, [cand(1, True)], 60.0, None)
    assert stop_reason(limits, [cand(1, True)], 40.0, None, next_s=20.0) is None, "ends at the limit"
    late = stop_reason(limits, [cand(1, True)], 41.0, None, next_s=20.0)
    assert late == "max_minutes (1) would pass during the next candidate (~20 s each, 19 s left)"
    assert "patience" in stop_reason(limits, [cand(1, True), cand(2), cand(3)], 0.0, None)
    assert stop_reason(limits, [cand(1, True), cand(2), cand(3, state="pending")], 0, None) is None
    assert "speed of light" in stop_reason(limits, [cand(1, True, ms=1.02)], 0.0, 1.0)


def test_acceptance_needs_the_gate_and_then_a_gain_beyond_noise():
    assert decide({"verdict": "pass", "faster_than_noise": False}, has_incumbent=False)
    assert not decide({"verdict": "pass", "faster_than_noise": False}, has_incumbent=True)
    assert decide({"verdict": "pass", "faster_than_noise": True}, has_incumbent=True)
    assert not decide({"verdict": "fail", "faster_than_noise": True}, has_incumbent=False)


def test_a_job_with_nothing_to_run_fails_and_names_the_missing_proposers(home, kit):
    source = (kit.examples / "softmax.py").read_text()
    loop, store = loop_for(home, NewProblem("softmax", "x", source),
                           {"proposers": ["inductor", "nonesuch", "tune"]})
    outcome = loop.run()
    assert outcome.state == "failed"
    assert "no candidate to evaluate" in outcome.error and "inductor" in outcome.error
    kinds = [r[0] for r in store.conn.execute("SELECT kind FROM events ORDER BY id")]
    assert kinds.count("proposer.unavailable") == 2


def test_a_proposer_that_declines_says_why_once(home):
    """A reference no template matches: the template proposer's reason is recorded once, though
    the loop asks it again, and the job fails naming what was configured."""
    source = ("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
              "        return torch.cumsum(x, dim=0)\n"
              "def get_inputs():\n    return [torch.randn(8, 4)]\ndef get_init_inputs():\n    return []\n")
    loop, store = loop_for(home, NewProblem("cumsum", "x", source), {"proposers": ["template", "tune"]})
    outcome = loop.run()
    assert outcome.state == "failed" and "no candidate to evaluate" in outcome.error
    declined = [r[0] for r in store.conn.execute(
        "SELECT message FROM events WHERE kind = 'proposer.declined'")]
    assert len(declined) == 1 and declined[0].startswith("template: no template matches the reference's graph")


def test_reference_failing_at_run_time_makes_the_job_invalid(home):
    loop, _ = loop_for(home, NewProblem("raising", "x", REF_RAISING, start_source=WRONG))
    outcome = loop.run()
    assert outcome.state == "invalid"
    assert "no inputs today" in outcome.error


def test_gate_failure_is_recorded_never_timed_and_fails_the_job(home, kit):
    source = (kit.examples / "softmax.py").read_text()
    loop, store = loop_for(home, NewProblem("softmax", "x", source, start_source=WRONG))
    outcome = loop.run()
    assert outcome.state == "failed" and "no candidate passed the gate" in outcome.error
    (row,) = store.candidates(loop.job_id)
    assert row["verdict"] in ("fail", "error") and row["rule"] and not row["accepted"]
    assert row["candidate_ms"] is None, "a failed candidate is never timed"
    assert store.conn.execute("SELECT COUNT(*) FROM blocks").fetchone()[0] == 0
    (capture,) = store.conn.execute("SELECT capture FROM jobs WHERE id = ?", (loop.job_id,)).fetchone()
    captured = json.loads(capture)
    assert captured["min_bytes"] == 2 * 16 * 1000 * 4, "the reference's input and output, fp32"


def test_the_device_is_measured_once_and_each_job_gets_its_speed_of_light_floor(home, kit):
    source = (kit.examples / "softmax.py").read_text()
    loop, store = loop_for(home, NewProblem("softmax", "x", source, start_source=WRONG))
    store.upsert_device("cpu", "test cpu")
    loop.run()
    ceilings = store.device_ceilings("cpu")
    assert ceilings["copy_gbps"] > 0 and ceilings["fp32_tflops"] > 0 and ceilings["device_name"]
    job = store.job(loop.job_id)
    floor = json.loads(job["capture"])["sol"]
    assert floor["bound"] == "memory", "softmax does no matrix work"
    assert job["sol_ms"] == floor["ms"] == floor["memory_ms"] > 0
    assert floor["ms"] == pytest.approx(2 * 16 * 1000 * 4 / (ceilings["copy_gbps"] * 1e9) * 1e3)

    again, _ = loop_for(home, NewProblem("softmax2", "y", source, start_source=WRONG))
    again.run()
    kinds = [r[0] for r in store.conn.execute("SELECT kind FROM events ORDER BY id")]
    assert kinds.count("ceilings.measured") == 1, "a device is measured once, not per job"
    assert store.job(again.job_id)["sol_ms"] == job["sol_ms"]


def test_port_runs_one_job_in_the_foreground_and_prints_its_status(kit, tmp_path):
    for name in ("softmax.py", "softmax.toml", "softmax.new.py"):
        (tmp_path / name).write_text((kit.examples / name).read_text())
    out = kit.cli("port", str(tmp_path / "softmax.py"), "--device", "cpu", "--proposer", "tune",
                  "--json", timeout=300)
    job = json.loads(out.stdout)
    assert job["state"] == "done" and job["candidates"] == 2 and job["accepted"] >= 1
    assert Path(job["best_file"]).exists()
    report = json.loads(Path(job["best_file"]).with_name("report.json").read_text())
    assert report["job"] == job["id"]
    assert report["speed_of_light"]["bound"] == "memory" and report["speed_of_light"]["ms"] > 0
    assert 0 < report["best"]["fraction_of_speed_of_light"] == pytest.approx(
        report["speed_of_light"]["ms"] / report["best"]["ms"])
    assert "Speed of light:" in Path(job["best_file"]).with_name("report.md").read_text()
    assert [j["id"] for j in kit.status()["jobs"]] == [job["id"]]


def test_prestarted_sandboxes_serve_the_next_evaluation_and_none_outlive_the_job(home, kit, tmp_path,
                                                                                monkeypatch):
    sandboxes = tmp_path / "sandboxes"
    sandboxes.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(sandboxes))
    made = []
    real_mkdtemp = tempfile.mkdtemp
    monkeypatch.setattr(tempfile, "mkdtemp", lambda **kw: made.append(kw) or real_mkdtemp(**kw))
    source = (kit.examples / "softmax.py").read_text()
    honest = (kit.examples / "softmax.new.py").read_text()
    loop, store = loop_for(home, NewProblem("softmax", "x", source, start_source=honest),
                           {"proposers": ["tune"], "max_candidates": 2})
    loop.prestart = True
    loop.config.timing.budget_s = 2.0   # at 0.5 s a loaded CPU once left the A/B median 1.5x off
    outcome = loop.run()
    assert outcome.state == "done", outcome.error
    rows = store.candidates(loop.job_id)
    assert len(rows) == 2 and all(r["verdict"] == "pass" for r in rows), [(r["rule"], r["reason"]) for r in rows]
    assert len(made) == 4, "the job's reference, and one spare started as each candidate took the last"
    assert list(sandboxes.glob("kernelab-*")) == [], "every sandbox, used or spare, is gone with the job"


def test_a_candidate_that_would_end_past_max_minutes_is_not_started(home, kit):
    """The budget is a ceiling: after one evaluation of ~T s with 1.5 T s of budget, a second
    (expected to take ~T s as well) would end past it, so the job stops instead of starting it."""
    source = (kit.examples / "softmax.py").read_text()
    honest = (kit.examples / "softmax.new.py").read_text()
    loop, store = loop_for(home, NewProblem("softmax", "x", source, start_source=honest),
                           {"proposers": ["tune"], "max_candidates": 5})
    loop.config.timing.budget_s = 2.0   # at 0.5 s a loaded CPU once left the A/B median 1.5x off

    evaluate = loop.evaluate

    def evaluate_then_set_budget(cand):
        evaluate(cand)
        if len(loop.costs) == 1:           # the first evaluation sets a budget of 1.5 times it
            loop.limits.max_minutes = 1.5 * loop.costs[0] / 60

    loop.evaluate = evaluate_then_set_budget
    outcome = loop.run()
    assert outcome.state == "done", outcome.error
    assert len(store.candidates(loop.job_id)) == 1, "the tuner had more to offer"
    assert "would pass during the next candidate" in outcome.stop_reason
    assert loop.active_s <= loop.limits.max_minutes * 60


@pytest.mark.parametrize("data, cause", [
    (b"", "softmax.new.py: missing ModelNew (a candidate defines ModelNew)"),
    (b"\x89PNG\r\n\x1a\n\xff\xfe", "softmax.new.py:1: syntax error: invalid character '\ufffd' (U+FFFD)"),
    (b"\x7fELF\x02\x01\x00\x00", "softmax.new.py: syntax error: source code string cannot contain null bytes"),
    (b"class ModelNew(:\n", "softmax.new.py:1: syntax error: "),
    (b"import torch\nclass Model(torch.nn.Module):\n    pass\n", "softmax.new.py: missing ModelNew"),
], ids=["empty", "not_utf8", "null_bytes", "syntax_error", "no_modelnew"])
def test_a_malformed_starting_candidate_is_its_own_recorded_gate_failure(home, kit, tmp_path, data, cause):
    """Not passed over for a proposer's candidate: the dropped file, as read by the inbox, is
    candidate #1, refused by rule bad_candidate with its reason, and the job's error says so."""
    from kernelabd.service.inbox import read_problem

    (tmp_path / "softmax.py").write_text((kit.examples / "softmax.py").read_text())
    (tmp_path / "softmax.new.py").write_bytes(data)
    loop, store = loop_for(home, read_problem(tmp_path / "softmax.py"), {"proposers": ["tune"]})
    outcome = loop.run()
    (row,) = store.candidates(loop.job_id)
    assert (row["proposer"], row["verdict"], row["rule"]) == ("start", "error", "bad_candidate")
    assert row["reason"].startswith(cause) and "\n" not in row["reason"]
    assert outcome.state == "failed"
    assert outcome.error.startswith("no candidate passed the gate (1 rejected; last: softmax.new.py "
                                    "(the starting candidate): bad_candidate: softmax.new.py")


def test_the_first_port_is_evaluated_before_the_peers_are_timed_and_the_job_still_has_them(
        home, kit, monkeypatch):
    """Timing torch.compile's peers compiles the reference twice; the user waits for a first
    verified port, so it comes first, and a job stopping right after it still records them."""
    from kernelabd.harness.session import Session

    source = (kit.examples / "softmax.py").read_text()
    honest = (kit.examples / "softmax.new.py").read_text()
    loop, store = loop_for(home, NewProblem("softmax", "x", source, start_source=honest),
                           {"proposers": ["tune"], "max_candidates": 1})
    loop.config.jobs.peers = ["compile", "compile_max_autotune"]     # the tests' home times none
    evaluated_when_timed = []
    peers = Session.peers

    def spy(self, modes):
        evaluated_when_timed.append([c.verdict for c in loop.history if c.state == "done"])
        return peers(self, modes)

    monkeypatch.setattr(Session, "peers", spy)
    outcome = loop.run()
    assert outcome.state == "done", outcome.error
    assert evaluated_when_timed == [["pass"]], "peers timed once, after the first port passed its gate"
    assert json.loads(store.job(loop.job_id)["peers"])["note"] == "torch.compile is timed on GPU jobs only"


def test_a_cpu_job_with_an_arch_records_every_candidates_fingerprint_after_its_verdict(home, kit):
    """The machine-code fingerprint is made beside the evaluation and recorded when it ends (the
    loop does not wait for it); the last one is waited for when the job ends, nothing lost."""
    source = (kit.examples / "softmax.py").read_text()
    honest = (kit.examples / "softmax.new.py").read_text()
    loop, store = loop_for(home, NewProblem("softmax", "x", source, start_source=honest),
                           {"proposers": ["tune"], "max_candidates": 2})
    loop.config.search.cpu_arch = "sm_90"
    loop.config.timing.budget_s = 2.0
    outcome = loop.run()
    assert outcome.state == "done", outcome.error
    rows = store.candidates(loop.job_id)
    assert len(rows) == 2
    prints = {cid: (arch, json.loads(kernels)) for cid, arch, kernels in store.conn.execute(
        "SELECT candidate_id, arch, kernels FROM fingerprints WHERE error IS NULL")}
    assert sorted(prints) == [r["id"] for r in rows], "one fingerprint a candidate, the last one too"
    for r in rows:
        arch, kernels = prints[r["id"]]
        assert arch == "sm_90" and kernels["kernels"][0]["registers"] > 0
        assert json.loads(r["result"])["stages"]["fingerprint"] > 0, "its seconds join the result's stages"
        assert r["verdict"] == "pass" and r["speedup"] is not None, "the verdict it was recorded after"
