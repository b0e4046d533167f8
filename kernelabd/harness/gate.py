"""The gate: trusted comparisons that decide whether a candidate is correct.

Each rule is one function returning ``None`` (passed) or a ``Failure`` with evidence. They run
in the trusted parent on tensors rebuilt from the wire, against a float64 oracle computed in a
different process, so nothing the candidate does in its own process can reach them.

Tolerances are calibrated per input set: the reference's own fp32 error against the oracle,
times ``tol_factor``, floored by what the output dtype can honestly deliver. A candidate that
computes in lower precision than the reference (TF32, bf16 inside an fp32 problem) lands far
outside; an honest reordering of floating-point sums lands inside.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

# Normwise and elementwise floors by output dtype: no honest kernel is held to better.
NORM_FLOOR = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}
ELEM_FLOOR = {torch.float64: 1e-10, torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 6e-2}
DEGENERATE_ABS = 1e-6          # a reference whose outputs are all below this is degenerate
DETERMINISM_SHARE = 0.1        # two identical runs may differ by at most this share of the tolerance
UNWRITTEN_SHARE = 0.01         # more than this share of poison bytes in an output: not written


@dataclass
class Failure:
    rule: str
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass
class Tolerance:
    norm: float
    elem: float


@dataclass
class SetOutcome:
    """Errors of one input set, kept for the verdict's evidence."""

    index: int
    norm_error: float
    elem_error: float
    tolerance: Tolerance


CHUNK = 1 << 25                # elements one comparison step holds in float64 (256 MiB)


def _pieces(*tensors: torch.Tensor) -> Iterator[tuple[int, list[torch.Tensor]]]:
    """Aligned flat chunks of same-sized tensors: comparisons over outputs of many gigabytes
    hold a chunk's float64 temporaries at a time, never a float64 copy of the whole."""
    flats = [t.reshape(-1) for t in tensors]
    n = flats[0].numel()
    for start in range(0, n, CHUNK):
        yield start, [f[start:start + CHUNK] for f in flats]


def _squared_norms(x: torch.Tensor, oracle: torch.Tensor) -> tuple[float, float]:
    """||x - oracle||² and ||oracle||², accumulated in float64 a chunk at a time."""
    d2 = o2 = torch.zeros((), dtype=torch.float64, device=oracle.device)
    for _, (xc, oc) in _pieces(x, oracle):
        o = oc.double()
        d2 = d2 + (xc.double() - o).square().sum()
        o2 = o2 + o.square().sum()
    return float(d2), float(o2)


def normwise_error(x: torch.Tensor, oracle: torch.Tensor) -> float:
    """||x - oracle|| / ||oracle||, holding a chunk's float64 temporaries at a time: a screening
    sandbox's sanity check of KernelBench's 63_conv (an 8 GiB output) asked for two 16 GiB
    float64 copies and, failing, left the job's candidates no memory for their arenas."""
    if oracle.numel() == 0:
        return 0.0
    d2, o2 = _squared_norms(x, oracle)
    return math.sqrt(d2) / max(math.sqrt(o2), 1e-30)


def rel_errors(x: torch.Tensor, oracle: torch.Tensor) -> tuple[float, float, int]:
    """Normwise relative error, worst elementwise error, and where that worst element is.

    The elementwise error is scaled by ``|oracle| + rms(oracle)`` so that tiny true values do
    not demand impossible relative accuracy, while a few wrong elements lost in a large norm
    still show.
    """
    if oracle.numel() == 0:
        return 0.0, 0.0, 0
    d2, o2 = _squared_norms(x, oracle)
    norm = math.sqrt(d2) / max(math.sqrt(o2), 1e-300)
    scale = max(math.sqrt(o2 / oracle.numel()), 1e-300)
    worst, at = -1.0, 0
    for start, (xc, oc) in _pieces(x, oracle):
        o = oc.double()
        elem = (xc.double() - o).abs_().div_(o.abs().add_(scale))
        j = int(torch.argmax(elem))
        value = float(elem[j])
        if value > worst or math.isnan(value):
            worst, at = value, start + j
            if math.isnan(value):
                break
    return norm, worst, at


def all_finite(t: torch.Tensor) -> bool:
    return not t.is_floating_point() or all(bool(torch.isfinite(c).all()) for _, (c,) in _pieces(t))


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN payloads and -0.0 included), unlike ``torch.equal``."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    raw_a = a.contiguous().reshape(-1).view(torch.uint8)
    raw_b = b.contiguous().reshape(-1).view(torch.uint8)
    return all(bool(torch.equal(x, y)) for _, (x, y) in _pieces(raw_a, raw_b))


def _close(a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float) -> bool:
    """``torch.allclose`` a chunk at a time."""
    return a.shape == b.shape and all(
        bool(((x.double() - y.double()).abs() <= atol + rtol * y.double().abs()).all())
        for _, (x, y) in _pieces(a, b))


def calibrate(ref: list[torch.Tensor], oracle: list[torch.Tensor]) -> dict[str, Any]:
    """The reference's own error against the oracle on one input set (computed where both live).

    Only these numbers, not the fp32 outputs, travel to the verdict: the calibration needs
    nothing more, and large GPU outputs stay where they were made.
    """
    errors = [rel_errors(r, o) for r, o in zip(ref, oracle, strict=True)]
    finite = all(all_finite(t) for t in ref + oracle)
    return {"norm": max(e[0] for e in errors), "elem": max(e[1] for e in errors),
            "finite": finite, "dtype": str(ref[0].dtype).removeprefix("torch.")}


def tolerance_for(calib: dict[str, Any], factor: float, fixed: float | None) -> Tolerance:
    """Tolerance for one input set: ``factor`` × the reference's error, floored by dtype."""
    dtype = getattr(torch, str(calib.get("dtype", "float32")), torch.float32)
    norm = fixed if fixed is not None else max(factor * float(calib["norm"]),
                                               NORM_FLOOR.get(dtype, 1e-5))
    elem = max(factor * float(calib["elem"]), ELEM_FLOOR.get(dtype, 1e-4), norm)
    return Tolerance(norm=norm, elem=elem)


def oracle_wire_dtype(out: torch.Tensor) -> torch.dtype:
    """The oracle travels in fp32 (rounding ~6e-8, far inside any fp32 tolerance) unless the
    output itself is fp64: that halves what a large GPU problem moves between processes."""
    return torch.float64 if out.dtype == torch.float64 else torch.float32


def check_reference(oracles: list[list[torch.Tensor]], base_sets: list[int]) -> str | None:
    """Why a reference is degenerate, or None: all near zero, or the same whatever the input."""
    if all(float(o.abs().max()) < DEGENERATE_ABS for outs in oracles for o in outs):
        return (f"reference outputs are near zero everywhere (|y| < {DEGENERATE_ABS:g}); any "
                "candidate returning zeros would pass")
    if len(base_sets) >= 2:
        a, b = oracles[base_sets[0]], oracles[base_sets[1]]
        if all(_close(x, y, rtol=1e-9, atol=1e-12) for x, y in zip(a, b, strict=True)):
            return "reference outputs are identical for different inputs; nothing to check"
    return None


def check_structure(ref: list[dict[str, Any]], cand: list[dict[str, Any]], index: int) -> Failure | None:
    """Same number of outputs, same shapes, dtypes and strides (size-1 dims aside)."""
    if len(ref) != len(cand):
        return Failure("shape", f"returned {len(cand)} output(s); the reference returns {len(ref)}",
                       {"input_set": index})
    for i, (r, c) in enumerate(zip(ref, cand, strict=True)):
        if r["shape"] != c["shape"]:
            return Failure("shape", f"output {i} has shape {c['shape']}, expected {r['shape']}",
                           {"input_set": index, "output": i})
        if r["dtype"] != c["dtype"]:
            return Failure("dtype", f"output {i} is {c['dtype']}, expected {r['dtype']}",
                           {"input_set": index, "output": i})
        strides = [(a, b) for a, b, n in zip(r["stride"], c["stride"], r["shape"], strict=True) if n > 1]
        if any(a != b for a, b in strides):
            return Failure("stride", f"output {i} has strides {c['stride']}, expected {r['stride']}",
                           {"input_set": index, "output": i})
    return None


def check_finite(outs: list[torch.Tensor], index: int) -> Failure | None:
    for i, t in enumerate(outs):
        if all_finite(t):
            continue
        bad_total, first = 0, None
        for start, (c,) in _pieces(t):
            bad = ~torch.isfinite(c)
            count = int(bad.sum())
            if count and first is None:
                first = start + int(torch.nonzero(bad)[0])
            bad_total += count
        return Failure("non_finite", f"output {i} has {bad_total} NaN/Inf value(s)",
                       {"input_set": index, "output": i, "index": unravel(first or 0, t.shape)})
    return None


def check_written(poisoned: list[float], outputs: list[dict[str, Any]], index: int) -> Failure | None:
    """Outputs still holding the poison written before the call were never written.

    In a float output the poison is an all-ones NaN that arithmetic does not produce, so one
    such element is enough; integer outputs may hold -1 honestly, so there a share counts.
    """
    for i, (share, desc) in enumerate(zip(poisoned, outputs, strict=False)):
        floating = desc.get("dtype") in ("float32", "float16", "bfloat16", "float64")
        if share > UNWRITTEN_SHARE or (floating and share > 0):
            return Failure("unwritten_output", f"{share:.2%} of output {i} still holds the poison "
                           "written before the call: the kernel did not write it",
                           {"input_set": index, "output": i, "poisoned_share": share})
    return None


def check_synchronised(unsynchronised: list[int], index: int) -> Failure | None:
    if unsynchronised:
        return Failure("unsynchronised_output", f"output(s) {unsynchronised} were still being "
                       "written after forward returned: work on another stream is not ordered "
                       "before the caller's stream", {"input_set": index, "outputs": unsynchronised})
    return None


def check_inputs_untouched(mutated: list[int], index: int) -> Failure | None:
    if mutated:
        return Failure("mutated_input", f"forward changed input(s) {mutated}",
                       {"input_set": index, "inputs": mutated})
    return None


def check_target_launched(launches: int, target: str, index: int) -> Failure | None:
    if launches <= 0:
        return Failure("no_target_kernel", f"no {target} kernel was launched: a candidate that "
                       "only calls PyTorch is not a port", {"input_set": index})
    return None


def check_no_torch_compute(ops: dict[str, int], index: int) -> Failure | None:
    if ops:
        names = ", ".join(f"{k}×{v}" for k, v in sorted(ops.items()))
        return Failure("torch_compute", f"forward computes with PyTorch ops outside its kernels: "
                       f"{names}", {"input_set": index, "ops": ops})
    return None


def check_numerics(cand: list[torch.Tensor], oracle: list[torch.Tensor], tol: Tolerance,
                   index: int) -> tuple[Failure | None, SetOutcome]:
    worst = SetOutcome(index, 0.0, 0.0, tol)
    for i, (c, o) in enumerate(zip(cand, oracle, strict=True)):
        norm, elem, flat = rel_errors(c, o)
        worst.norm_error = max(worst.norm_error, norm)
        worst.elem_error = max(worst.elem_error, elem)
        if norm > tol.norm or elem > tol.elem:
            at = unravel(flat, o.shape)
            which = "normwise" if norm > tol.norm else "elementwise"
            return Failure("mismatch", f"output {i} differs from the float64 oracle on input set "
                           f"{index}: {which} error {max(norm, elem) if which == 'elementwise' else norm:.3g}"
                           f" > {tol.elem if which == 'elementwise' else tol.norm:.3g}",
                           {"input_set": index, "output": i, "max_rel_error": norm,
                            "max_elem_error": elem, "tolerance": tol.norm, "elem_tolerance": tol.elem,
                            "index": at, "got": float(c.reshape(-1)[flat]),
                            "expected": float(o.reshape(-1)[flat])}), worst
    return None, worst


def check_fingerprints(got: list[float], expected: list[dict[str, Any]], tol: Tolerance,
                       sample: int) -> Failure | None:
    """A timed sample's output fingerprints against the oracle's (see ``perturb``).

    An honest output error ``d`` with ``||d|| <= tol·||o||`` projects onto Gaussian weights as
    N(0, ||d||²); a stale, deferred or unwritten output is off by orders of magnitude more.
    """
    from kernelabd.harness.child.perturb import FINGERPRINT_SIGMAS

    if len(got) != len(expected):
        return Failure("timed_mismatch", f"while timed, sample {sample} returned {len(got)} output(s)",
                       {"sample": sample})
    for i, (fp, exp) in enumerate(zip(got, expected, strict=True)):
        if not exp.get("finite", True):
            continue
        bound = FINGERPRINT_SIGMAS * tol.norm * exp["norm"]
        if not abs(fp - exp["fp"]) <= bound:
            return Failure("timed_mismatch", f"while timed, output {i} of sample {sample} differs "
                           f"from the float64 oracle (fingerprint off by {abs(fp - exp['fp']):.3g}, "
                           f"honest bound {bound:.3g}): stale, deferred or wrong work",
                           {"sample": sample, "output": i, "fingerprint": fp, "expected": exp["fp"],
                            "bound": bound})
    return None


def check_deterministic(first: list[torch.Tensor], again: list[torch.Tensor], tol: Tolerance) -> Failure | None:
    for i, (a, b) in enumerate(zip(first, again, strict=True)):
        if a.shape != b.shape:
            return Failure("nondeterministic", f"output {i} changed shape between identical runs")
        norm, _, flat = rel_errors(b, a)
        if not (norm <= DETERMINISM_SHARE * tol.norm) or not all_finite(b):
            return Failure("nondeterministic", f"output {i} differs between two identical runs "
                           f"(normwise {norm:.3g})", {"output": i, "index": unravel(flat, a.shape)})
    return None


def unravel(flat: int, shape: torch.Size | list[int]) -> list[int]:
    idx = []
    for dim in reversed(list(shape)):
        idx.append(flat % dim if dim else 0)
        flat //= max(dim, 1)
    return list(reversed(idx))
