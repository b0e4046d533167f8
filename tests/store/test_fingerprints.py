"""Fingerprints kept with candidates: the recorder stores what the loop hands it after a
result (code compressed), readers get it back, and proposers see the difference to the incumbent."""

from __future__ import annotations

import json
from pathlib import Path

from kernelabd.propose.base import Budget, Candidate, JobContext
from kernelabd.service.recorder import LocalRecorder
from store import Home, connect, fingerprints
from store.records import NewProblem, Store

SASS = "        /*0000*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24 ;\n" * 400


def kernel(registers: int, hgmma: int, ffma: int) -> dict:
    return {"name": "gemm_kernel", "arch": "sm_90", "registers": registers, "spills": 0,
            "spill_loads": 0, "local_bytes": 0, "shared_bytes": 98304, "static_shared_bytes": 0,
            "launch": {"grid": [32, 32], "block": [256, 1, 1]},
            "instructions": {"HGMMA": hgmma, "FFMA": ffma}, "ptx": ".version 8.7\n" * 100,
            "sass": SASS}


def test_recorded_with_the_result_and_read_back(tmp_path: Path) -> None:
    conn = connect(tmp_path / "kernelab.db")
    store = Store(conn)
    _, job = store.add_problem(NewProblem("gemm", "gemm.py", "source"))
    rec = LocalRecorder(store, Home(tmp_path / "home"))
    fma, tc = (store.add_candidate(job, proposer="template", source=s) for s in ("a", "b"))
    failed = store.add_candidate(job, proposer="template", source="c")
    for cid, verdict, accepted in ((fma, "pass", True), (tc, "pass", False), (failed, "fail", False)):
        rec.finish_candidate(job, cid, {"verdict": verdict, "stages": {"gate": 1.0}}, accepted)
    rec.add_fingerprint(fma, {"arch": "sm_90", "kernels": [kernel(255, 0, 4096)]}, 6.5)
    rec.add_fingerprint(tc, {"arch": "sm_90", "kernels": [kernel(110, 4, 0)]}, 7.25)
    rec.add_fingerprint(failed, {"error": "does not compile"}, 0.5)

    (back,) = fingerprints.load(conn, tc, with_code=True)
    assert (back.registers, back.instructions, back.sass) == (110, {"HGMMA": 4, "FFMA": 0}, SASS)
    assert fingerprints.load(conn, tc)[0].sass == ""             # code only when asked for
    stored = conn.execute("SELECT length(code) FROM fingerprints WHERE candidate_id = ?",
                          (tc,)).fetchone()[0]
    assert stored < len(SASS) / 20                                # compressed
    result = json.loads(conn.execute("SELECT result FROM candidates WHERE id = ?", (tc,)).fetchone()[0])
    assert "fingerprint" not in result                            # kept apart, not twice
    assert result["stages"] == {"gate": 1.0, "fingerprint": 7.25}  # its seconds, a stage of the result

    state = rec.load(job)
    assert set(state["fingerprints"]) == {fma, tc}               # the failed one has none
    history = tuple(Candidate.from_row(r) for r in state["candidates"])
    ctx = JobContext(job_id=job, problem="gemm", reference_source="", device="cuda:0",
                     budget=Budget(1, 60.0), history=history, fingerprints=state["fingerprints"])
    assert ctx.incumbent is not None and ctx.incumbent.id == fma
    assert {d["figure"]: (d["a"], d["b"]) for d in ctx.fingerprint_difference(tc)} == {
        "registers": (255, 110), "HGMMA": (0, 4), "FFMA": (4096, 0)}
    assert ctx.fingerprint_difference(tc + 1) == []
