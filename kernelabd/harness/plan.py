"""The memory plan: what a problem needs on the device and the host, decided before it runs.

The reference sandbox first runs the reference once per shape (``probe``) and reports the bytes
of its inputs, parameters and outputs and the peak memory of one fp32 forward. From those this
module decides how many gate and timing input sets the job keeps, whether the float64 oracle is
computed whole or in chunks along the batch, and whether the problem fits at all. A problem that
cannot fit is refused here, with its reason, instead of by an out-of-memory kill later.

The model counts what lives at once on the device: the reference sandbox's models, its float64
copy (kept to re-check timed outputs) and its input sets with their oracles; the candidate's and
the incumbent's sandboxes (weights, timing sets with their work and perturbation buffers,
outputs, a workspace as large as the reference's); and, while the oracle is made, the float64
forward's own peak. Estimates err high: a refusal names what it needed, so a user can shrink the
problem, and a plan that fits leaves a margin for what this model does not see.
"""

from __future__ import annotations

import contextlib
import itertools
from dataclasses import asdict, dataclass, field
from typing import Any

GiB = 1 << 30
DEVICE_MARGIN = 0.85          # share of the device's free memory a plan may use
HOST_MARGIN = 0.7             # share of the host's available memory the sandboxes may use together
SANDBOXES = 4                 # reference, candidate, incumbent, and one starting up or a peer
SANDBOX_HOST_FLOOR = 4 * GiB  # torch + CUDA + Triton in one process, before any data
MAX_ORACLE_CHUNKS = 64
# Largest share of the plan's budget a float64 forward's transient should take where the batch
# allows chunks: KernelBench's 63_conv fit "whole" by the model and its 18 GiB re-check found
# 3.7 GiB free; the model cannot see every allocator's slack, so the transient is kept small.
ORACLE_SHARE = 1 / 16

# Input sets of the main shape, most important first: two base draws are the least the gate
# keeps (the degeneracy check compares them); the variants are dropped first when memory is short.
FULL_GATE = ("base", "base", "scaled", "heavy")
TIMING_SETS = (2, 1)


def meminfo(key: str) -> int:
    """A ``/proc/meminfo`` figure in bytes (``MemTotal``, ``MemAvailable``), 0 where it cannot be
    read."""
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


class PlanError(ValueError):
    """The problem cannot fit this device or host; the message says what it needs."""


@dataclass
class ShapeProbe:
    """One shape's sizes, from the reference sandbox's probe forward."""

    inputs_bytes: int
    params_bytes: int
    outputs_bytes: int
    oracle_bytes: int              # the oracle as stored: fp32 (fp64 outputs stay fp64)
    peak_bytes: int                # what one fp32 forward allocates: its outputs and temporaries
    f64_factor: float = 2.0        # float64 bytes over the inputs' own (2 for fp32, 4 for bf16)
    batch: int | None = None       # size of dim 0 shared by the tensor inputs and outputs

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ShapeProbe:
        keys = cls.__dataclass_fields__
        return cls(**{k: data[k] for k in keys if k in data})

    def f64_peak(self, chunks: int = 1) -> int:
        """A float64 forward's transient: its inputs in float64 and its own allocations."""
        return int(self.f64_factor * (self.inputs_bytes + max(self.peak_bytes, self.outputs_bytes)) / chunks)


@dataclass
class Plan:
    """What the job keeps, and what it was sized against (recorded with the job)."""

    device: str
    device_total_bytes: int
    device_free_bytes: int
    host_total_bytes: int
    bytes: dict[str, int]
    gate_sets: int
    timing_sets: int
    variants: list[str]
    dropped: list[str] = field(default_factory=list)
    oracle: str = "whole"
    oracle_chunks: int = 1
    oracle_whole_fits: bool = True  # chunks chosen for margin: the whole oracle if not separable
    needs_device_bytes: int = 0
    needs_host_bytes: int = 0
    sandbox_host_limit_bytes: int = 0
    screening: bool = True          # the tuner's screening sandbox fits beside the rest
    fits: bool = True
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def needs(shapes: list[ShapeProbe], n_gate: int, n_timing: int, chunks: int, screening: bool = True) -> int:
    """Bytes in use at the job's busiest moment: a candidate gated or timed while the incumbent
    (or, before there is one, the reference as the baseline) holds its timing buffers and the
    reference re-checks a timed sample.

    Reference sandbox: its models and their float64 copy, the stored gate sets (inputs and
    oracle) and timing inputs; as the baseline, a work buffer and a captured graph per timing
    set (dropped after each comparison). Candidate: its weights and, while gated, a fresh copy
    of a set's inputs, its own allocations and the arena its outputs travel in (which is also
    the synchronisation rule's snapshot); while timed, its timing inputs, work buffers and
    graphs. Incumbent: weights, timing inputs, work buffers and graphs. The re-check: perturbed
    inputs and a float64 forward, in the plan's batch chunks. Screening (a GPU job's tuner):
    its sandbox's own inputs, the reference's output and a variant's allocations, when the
    job screens (``screening``).
    """
    main, extra = shapes[0], shapes[1:]
    i, o, pk = main.inputs_bytes, main.outputs_bytes, max(main.peak_bytes, main.outputs_bytes)
    params = sum(s.params_bytes for s in shapes)
    stored = (params * (1 + main.f64_factor) + n_gate * (i + main.oracle_bytes)
              + sum(s.inputs_bytes + s.oracle_bytes for s in extra) + n_timing * i)
    timing_buffers = n_timing * (2 * i + pk)
    candidate = main.params_bytes + max(i + pk + o, timing_buffers)
    incumbent = main.params_bytes + timing_buffers
    recheck = max(i, main.oracle_bytes) + main.f64_peak(chunks)   # a timing set's oracle: transient
    build = max(s.f64_peak() for s in extra) if extra else 0
    screener = main.params_bytes + i + o + pk if screening else 0
    return int(stored + candidate + incumbent + screener + max(recheck, build))


def chunk_counts(main: ShapeProbe) -> list[int]:
    """1, then the batch's divisors up to MAX_ORACLE_CHUNKS (chunking needs a batch)."""
    if main.batch is None or main.batch < 2:
        return [1]
    return [1, *(c for c in range(2, min(main.batch, MAX_ORACLE_CHUNKS) + 1) if main.batch % c == 0)]


def oracle_chunks(main: ShapeProbe, fits: list[int], budget: int) -> int:
    """Of the chunk counts that fit (ascending), the fewest whose float64 transient is at most
    ``ORACLE_SHARE`` of the budget, else the most there are."""
    return next((c for c in fits if main.f64_peak(c) <= ORACLE_SHARE * budget), fits[-1])


def _fmt(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


def make_plan(shapes: list[dict[str, Any]], device: str, device_total: int, device_free: int,
              host_total: int, host_available: int, variants: list[str]) -> Plan:
    """Choose the largest set of input sets that fits, most important first, with the oracle's
    chunks that keep its float64 transient small (``oracle_chunks``), and the tuner's
    screening sandbox where it fits too: what the gate checks comes before how fast the search
    is, so a tight problem screens nothing (it tunes one change per candidate) before it gives
    up a gate set. Raise ``PlanError`` with the need and the capacity when even the least does
    not fit. On a GPU the data lives in device memory; on a CPU in the host's."""
    probes = [ShapeProbe.from_json(s) for s in shapes]
    main = probes[0]
    wanted = [v for v in FULL_GATE if v in variants or v == "base"]
    on_gpu = device != "cpu"
    budget = int(DEVICE_MARGIN * device_free) if on_gpu else int(HOST_MARGIN * host_available)
    sizes = {"inputs": main.inputs_bytes, "outputs": main.outputs_bytes,
             "parameters": sum(p.params_bytes for p in probes), "oracle": main.oracle_bytes,
             "reference_peak": main.peak_bytes}
    limit = max(SANDBOX_HOST_FLOOR, int(HOST_MARGIN * max(host_total, host_available) / SANDBOXES))
    least, counts = None, chunk_counts(main)
    for keep in range(len(wanted), 1, -1):          # the gate's sets before the timing's
        for screening, n_timing in itertools.product((True, False), TIMING_SETS):
            need = {c: needs(probes, keep, n_timing, c, screening) for c in counts}
            least = min(need.values()) if least is None else min(least, *need.values())
            fits = [c for c in counts if need[c] <= budget]
            if not fits:
                continue
            chunks = oracle_chunks(main, fits, budget)
            return Plan(device=device, device_total_bytes=device_total, device_free_bytes=device_free,
                        host_total_bytes=host_total, bytes=sizes, gate_sets=keep, timing_sets=n_timing,
                        variants=wanted[:keep], dropped=wanted[keep:],
                        oracle="chunked" if chunks > 1 else "whole", oracle_chunks=chunks,
                        oracle_whole_fits=fits[0] == 1,
                        needs_device_bytes=need[chunks] if on_gpu else 0,
                        needs_host_bytes=0 if on_gpu else need[chunks],
                        sandbox_host_limit_bytes=limit, screening=screening)
    where = "GPU memory" if on_gpu else "host memory"
    has = device_free if on_gpu else host_available
    raise PlanError(f"needs {_fmt(least or 0)} of {where} for the least the gate keeps (two input sets "
                    f"of {_fmt(main.inputs_bytes)} with their oracles, one timing set, the candidate's "
                    f"and the incumbent's sandboxes); the {'device' if on_gpu else 'host'} has "
                    f"{_fmt(has)} free ({_fmt(budget)} usable)")
