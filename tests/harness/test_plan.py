"""The memory plan: what a job keeps of a problem, decided from the probe's sizes before any
candidate runs, and a refusal that names what it needed when even the least does not fit."""

from __future__ import annotations

import pytest

from kernelabd.harness.plan import GiB, PlanError, make_plan

H200 = (143 * GiB, 139 * GiB)       # total, free
HOST = (128 * GiB, 120 * GiB)
ALL = ["base", "scaled", "heavy"]


def probe(inputs_gib: float, outputs_gib: float | None = None, params_gib: float = 0.0,
          peak_gib: float | None = None, batch: int | None = 4096, f64: float = 2.0) -> dict:
    out = inputs_gib if outputs_gib is None else outputs_gib
    return {"inputs_bytes": int(inputs_gib * GiB), "outputs_bytes": int(out * GiB),
            "params_bytes": int(params_gib * GiB), "oracle_bytes": int(out * GiB),
            "peak_bytes": int((out if peak_gib is None else peak_gib) * GiB), "f64_factor": f64, "batch": batch}


def test_a_small_problem_keeps_every_input_set():
    plan = make_plan([probe(0.1)], "cuda:0", *H200, *HOST, ALL)
    assert (plan.gate_sets, plan.timing_sets, plan.oracle) == (4, 2, "whole")
    assert plan.variants == ["base", "base", "scaled", "heavy"] and plan.dropped == []
    assert 0 < plan.needs_device_bytes < H200[1] and plan.needs_host_bytes == 0


def test_kernelbench_softmax_at_its_own_size_fits_with_one_timing_set():
    """23_Softmax: 4096 × 393216 fp32, 6 GiB in and out: one timing set, the gate's four kept."""
    plan = make_plan([probe(6.0)], "cuda:0", *H200, *HOST, ALL)
    assert (plan.gate_sets, plan.timing_sets) == (4, 1)
    assert plan.needs_device_bytes <= 0.85 * H200[1]


def test_larger_problems_drop_the_gate_variants_before_its_two_base_sets():
    plan = make_plan([probe(9.0)], "cuda:0", *H200, *HOST, ALL)
    assert plan.dropped and plan.variants[:2] == ["base", "base"] and plan.gate_sets >= 2


def test_a_tight_problem_gives_up_screening_before_a_gate_set():
    """36_RMSNorm_ at its own size (7 GiB in and out, batch 112) on an H200 with 124.1 GiB free,
    as the port of session 9 found it: with the screening sandbox it needed 105.8 GiB of 105.5
    usable and was refused; without it, the gate keeps its base sets and the job runs."""
    rmsnorm = probe(7.0, peak_gib=7.1, batch=112)
    plan = make_plan([rmsnorm], "cuda:0", 139.8 * GiB, 124.1 * GiB, *HOST, ALL)
    assert not plan.screening and plan.gate_sets >= 2 and plan.variants[:2] == ["base", "base"]
    assert plan.needs_device_bytes <= 0.85 * 124.1 * GiB
    assert make_plan([probe(0.1)], "cuda:0", *H200, *HOST, ALL).screening, "screening wherever it fits"


def test_the_oracle_is_chunked_only_along_a_batch():
    tight = make_plan([probe(5.0, peak_gib=16.0)], "cuda:0", *H200, *HOST, ["base"])
    assert tight.oracle == "chunked" and 4096 % tight.oracle_chunks == 0
    with pytest.raises(PlanError):
        make_plan([probe(5.0, peak_gib=16.0, batch=None)], "cuda:0", *H200, *HOST, ["base"])


def test_a_large_float64_transient_is_chunked_even_where_it_would_fit_whole():
    """63_conv at its own size: 1 GiB in, 8 GiB out, batch 16. Whole, its float64 re-check
    (18 GiB) fit the model and not the device; the plan chunks it. Half its output fits whole
    too, and is still chunked for margin, saying that the whole would fit (so a reference that
    is not separable still runs)."""
    conv = make_plan([probe(1.0, 8.0, batch=16)], "cuda:0", *H200, *HOST, ALL)
    assert conv.oracle == "chunked" and 16 % conv.oracle_chunks == 0
    half = make_plan([probe(0.5, 4.0, batch=16)], "cuda:0", *H200, *HOST, ALL)
    assert half.oracle == "chunked" and half.oracle_whole_fits
    small = make_plan([probe(0.1)], "cuda:0", *H200, *HOST, ALL)
    assert (small.oracle, small.oracle_chunks, small.oracle_whole_fits) == ("whole", 1, True)
    tight = make_plan([probe(5.0, peak_gib=16.0)], "cuda:0", *H200, *HOST, ["base"])
    assert not tight.oracle_whole_fits, "where only chunks fit, the plan says so"


def test_a_problem_that_cannot_fit_is_refused_with_what_it_needs_and_what_the_device_has():
    with pytest.raises(PlanError) as err:
        make_plan([probe(40.0)], "cuda:0", *H200, *HOST, ALL)
    text = str(err.value)
    assert "of GPU memory" in text and "139.0 GiB free" in text and "needs" in text


def test_a_cpu_job_is_planned_in_host_memory():
    plan = make_plan([probe(0.5)], "cpu", 0, 0, 24 * GiB, 16 * GiB, ALL)
    assert plan.needs_host_bytes > 0 and plan.needs_device_bytes == 0
    with pytest.raises(PlanError, match="of host memory"):
        make_plan([probe(8.0)], "cpu", 0, 0, 24 * GiB, 16 * GiB, ALL)


def test_extra_shapes_count_and_the_sandbox_limit_has_a_floor():
    one = make_plan([probe(1.0)], "cuda:0", *H200, *HOST, ALL)
    two = make_plan([probe(1.0), probe(1.0)], "cuda:0", *H200, *HOST, ALL)
    assert two.needs_device_bytes > one.needs_device_bytes
    small_host = make_plan([probe(0.1)], "cuda:0", *H200, 4 * GiB, 2 * GiB, ALL)
    assert small_host.sandbox_host_limit_bytes >= 4 * GiB
