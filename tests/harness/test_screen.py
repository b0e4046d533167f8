"""Screening in real sandboxes on CPU: configurations compiled for sm_90 without a GPU (ptxas's
figures), those that spill dropped before timing, the rest checked and timed on the host."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kernelabd.harness.sandbox import SandboxSpec
from kernelabd.harness.screen import MIN_COMPILE_S, Options, Screened, Screener, _result, screen
from kernelabd.propose.tune import with_params

HERE = Path(__file__).parent / "screen"
REFERENCE = HERE / "wide_softmax.py"
CANDIDATE = (HERE / "wide_softmax.new.py").read_text()


def variants(*configs: dict) -> list[tuple[dict, str]]:
    return [(c, with_params(CANDIDATE, c)) for c in configs]


def test_a_spilling_configuration_is_dropped_before_timing_and_a_wrong_one_is_not_timed():
    spilling, good, wrong = {"num_warps": 1, "SCALE": 1}, {"num_warps": 8, "SCALE": 1}, {"num_warps": 8, "SCALE": 2}
    results = screen(REFERENCE, variants(spilling, good, wrong), SandboxSpec(device="cpu"),
                     Options(screen_ms=1.0, workers=2, arch="sm_90"))
    assert [r.params for r in results] == [spilling, good, wrong]
    dropped, timed, off = results
    assert dropped.status == "spills" and dropped.ms is None, "never timed"
    assert dropped.spills >= 64 and ("local memory" in dropped.detail or "spills" in dropped.detail)
    assert timed.status == "timed" and timed.ms > 0 and timed.spills < 64 and timed.registers > 0
    assert "host clock" in timed.detail
    assert off.status == "wrong" and off.ms is None and "normwise error" in off.detail


def test_without_an_arch_on_cpu_nothing_is_compiled_and_every_variant_is_timed_or_refused():
    broken = CANDIDATE.replace("def forward(self, x: torch.Tensor) -> torch.Tensor:",
                               "def forward(self, x: torch.Tensor) -> torch.Tensor:\n        raise ValueError('no')")
    results = screen(REFERENCE, [({"num_warps": 4}, CANDIDATE), ({"num_warps": 8}, broken)],
                     SandboxSpec(device="cpu"), Options(screen_ms=1.0))
    assert results[0].status == "timed" and results[0].registers is None
    assert results[1].status == "failed" and "ValueError: no" in results[1].detail


def test_a_variant_that_kills_the_sandbox_fails_alone_and_the_rest_are_screened_again():
    dying = CANDIDATE.replace("def forward(self, x: torch.Tensor) -> torch.Tensor:",
                              "def forward(self, x: torch.Tensor) -> torch.Tensor:\n        import os\n"
                              "        os._exit(3)")
    results = screen(REFERENCE, [({"num_warps": 4}, dying), ({"num_warps": 8}, CANDIDATE)],
                     SandboxSpec(device="cpu"), Options(screen_ms=1.0))
    assert results[0].status == "failed" and "exited with status 3" in results[0].detail
    assert results[1].status == "timed"


def test_a_jobs_batches_share_one_sandbox_which_ends_with_it():
    with Screener(REFERENCE, SandboxSpec(device="cpu"), Options(screen_ms=1.0)) as screener:
        first = screener.screen(variants({"num_warps": 4}))
        box = screener.box
        second = screener.screen(variants({"num_warps": 8}, {"num_warps": 1}))
        assert screener.box is box and box.workdir.exists(), "the second batch reuses the first's sandbox"
    assert [r.status for r in first + second] == ["timed"] * 3
    assert not box.workdir.exists(), "closed with the screener"


@pytest.mark.parametrize(("entry", "expected"), [
    ({"status": "timed", "ms": 0.5, "registers": 40}, Screened({}, "timed", 0.5, 40)),
    ({"status": "timed", "ms": -1.0}, Screened({}, "failed")),
    ({"status": "timed", "ms": float("nan")}, Screened({}, "failed")),
    ({"status": "timed"}, Screened({}, "failed")),
    ({"status": "fastest", "ms": 0.1}, Screened({}, "failed")),
    ({"status": "wrong", "ms": 0.1, "registers": True, "spills": -3}, Screened({}, "wrong")),
])
def test_the_sandboxs_account_is_read_as_untrusted_input(entry, expected):
    assert _result({}, entry) == expected


def test_a_prewarmed_screener_has_its_compile_processes_before_the_first_batch():
    spilling, good = {"num_warps": 1, "SCALE": 1}, {"num_warps": 8, "SCALE": 1}
    with Screener(REFERENCE, SandboxSpec(device="cpu"), Options(screen_ms=1.0, workers=2, arch="sm_90")) as screener:
        screener.prewarm(reference_bytes=1 << 20)
        screener._warming.join(timeout=120)
        assert screener.warmed is not None and screener.warmed["workers"] == 2
        box = screener.box
        dropped, timed = screener.screen(variants(spilling, good))
        assert screener.box is box, "the batch ran in the sandbox started ahead"
        assert (dropped.status, timed.status) == ("spills", "timed")
        assert "(sandbox started ahead)" in screener.costs() and "compiles" in screener.costs()


def test_closing_a_screener_cuts_a_prewarm_short():
    screener = Screener(REFERENCE, SandboxSpec(device="cpu"), Options(screen_ms=1.0, workers=2, arch="sm_90"))
    screener.prewarm(reference_bytes=1 << 20)
    started = time.monotonic()
    screener.close()
    assert not screener._warming.is_alive() and screener.box is None
    assert time.monotonic() - started < 30, "killed, not waited for"


def test_a_variant_still_compiling_when_the_batch_is_out_of_time_is_dropped_and_the_next_batch_compiles_afresh():
    """A compile that does not end (here a forward that sleeps in the compile-only process; on
    the H100, Triton spent 47 s and more on an Inductor reduction's 16 × 4096-element tile) is
    dropped once the batch's compile budget is spent, not waited for past its job's budget; its
    stuck process is killed and the next batch compiles in fresh ones."""
    stuck = CANDIDATE.replace("def forward(self, x: torch.Tensor) -> torch.Tensor:",
                              "def forward(self, x: torch.Tensor) -> torch.Tensor:\n        import time\n"
                              "        time.sleep(600)")
    good = {"num_warps": 8, "SCALE": 1}
    with Screener(REFERENCE, SandboxSpec(device="cpu"), Options(screen_ms=1.0, workers=2, arch="sm_90")) as screener:
        started = time.monotonic()
        dropped, timed = screener.screen([({"num_warps": 4, "SCALE": 1}, stuck), *variants(good)], compile_s=0)
        assert time.monotonic() - started < MIN_COMPILE_S + 60
        assert dropped.status == "failed" and "still compiling after the batch's 20 s" in dropped.detail
        assert timed.status == "timed" and timed.registers > 0
        again = screener.screen(variants({"num_warps": 4, "SCALE": 1}))
        assert again[0].status == "timed" and again[0].registers > 0, "compiled by a fresh process"
