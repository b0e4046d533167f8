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

from dataclasses import asdict, dataclass, field
from typing import Any

GiB = 1 << 30
DEVICE_MARGIN = 0.85          # share of the device's free memory a plan may use
HOST_MARGIN = 0.7             # share of the host's available memory the sandboxes may use together
SANDBOXES = 4                 # reference, candidate, incumbent, and one starting up or a peer
SANDBOX_HOST_FLOOR = 4 * GiB  # torch + CUDA + Triton in one process, before any data
NOISE_WINDOW = 1 << 22        # extra perturbation elements a timed input keeps (perturb.window)
MAX_ORACLE_CHUNKS = 64

# Input sets of the main shape, most important first: two base draws are the least the gate
# keeps (the degeneracy check compares them); the variants are dropped first when memory is short.
FULL_GATE = ("base", "base", "scaled", "heavy")
TIMING_SETS = (2, 1)


class PlanError(ValueError):
    """The problem cannot fit this device or host; the message says what it needs."""


@dataclass
class ShapeProbe:
    """One shape's sizes, from the reference sandbox's probe forward."""

    inputs_bytes: int
    params_bytes: int
    outputs_bytes: int
    oracle_bytes: int              # the oracle as stored: fp32 (fp64 outputs stay fp64)
    peak_bytes: int                # one fp32 forward's transient peak above its inputs
    f64_factor: float = 2.0        # float64 bytes over the inputs' own (2 for fp32, 4 for bf16)
    batch: int | None = None       # size of dim 0 shared by the tensor inputs and outputs

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ShapeProbe:
        keys = cls.__dataclass_fields__
        return cls(**{k: data[k] for k in keys if k in data})

    def set_bytes(self, gate: bool) -> int:
        """What one stored input set costs: its inputs, and its oracle if it is a gate set."""
        return self.inputs_bytes + (self.oracle_bytes if gate else 0)

    def timed_set_bytes(self) -> int:
        """A timed set in a timing sandbox: pristine, work and perturbation factors."""
        return 2 * self.inputs_bytes + self.inputs_bytes + _noise_extra(self)

    def f64_peak(self, chunks: int = 1) -> int:
        """The float64 forward's transient: its inputs and its working memory, per chunk."""
        per = self.f64_factor * (self.inputs_bytes + self.peak_bytes) / chunks
        return int(per)


def _noise_extra(probe: ShapeProbe) -> int:
    elem = 4 if probe.inputs_bytes else 0
    return min(probe.inputs_bytes, NOISE_WINDOW * elem)


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
    needs_device_bytes: int = 0
    needs_host_bytes: int = 0
    sandbox_host_limit_bytes: int = 0
    fits: bool = True
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _device_needs(shapes: list[ShapeProbe], n_gate: int, n_timing: int, chunks: int) -> tuple[int, int]:
    """(steady bytes, peak bytes while the oracle is made) on the device."""
    main, extra = shapes[0], shapes[1:]
    params = sum(s.params_bytes for s in shapes)
    reference = (params * (1 + main.f64_factor) + n_gate * main.set_bytes(True)
                 + sum(s.set_bytes(True) for s in extra)
                 + n_timing * (main.set_bytes(False) + main.timed_set_bytes()) + 2 * main.outputs_bytes)
    timing_box = (main.params_bytes + n_timing * main.timed_set_bytes() + 2 * main.outputs_bytes
                  + main.peak_bytes)
    gating = main.inputs_bytes + 3 * main.outputs_bytes + main.peak_bytes   # a set, its outputs, poison
    steady = int(reference + 2 * timing_box + gating)
    transient = max(s.f64_peak(chunks if s is main else 1) for s in shapes)
    return steady, steady + transient


def _host_needs(shapes: list[ShapeProbe], n_gate: int, n_timing: int) -> int:
    """On a CPU job the same data lives in host memory; on a GPU job the host holds little."""
    steady, peak = _device_needs(shapes, n_gate, n_timing, 1)
    return max(steady, peak)


def choose_chunks(main: ShapeProbe, budget: int, steady: int) -> int | None:
    """The fewest batch chunks whose float64 forward fits beside ``steady``, or None."""
    if main.batch is None or main.batch < 2:
        return None
    for chunks in range(2, min(main.batch, MAX_ORACLE_CHUNKS) + 1):
        if main.batch % chunks == 0 and steady + main.f64_peak(chunks) <= budget:
            return chunks
    return None


def _fmt(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


def make_plan(shapes: list[dict[str, Any]], device: str, device_total: int, device_free: int,
              host_total: int, host_available: int, variants: list[str]) -> Plan:
    """Choose the largest set of input sets that fits, most important first; raise
    ``PlanError`` with the need and the capacity when even the least does not."""
    probes = [ShapeProbe.from_json(s) for s in shapes]
    main = probes[0]
    wanted = [v for v in FULL_GATE if v in variants or v == "base"]
    on_gpu = device != "cpu"
    budget = int(DEVICE_MARGIN * device_free) if on_gpu else int(HOST_MARGIN * host_available)
    sizes = {"inputs": main.inputs_bytes, "outputs": main.outputs_bytes,
             "parameters": sum(p.params_bytes for p in probes), "oracle": main.oracle_bytes,
             "reference_peak": main.peak_bytes}
    limit = max(SANDBOX_HOST_FLOOR, int(HOST_MARGIN * host_available / SANDBOXES))
    last_need = 0
    for keep in range(len(wanted), 1, -1):          # the gate's sets before the timing's
        for n_timing in TIMING_SETS:
            steady, peak = _device_needs(probes, keep, n_timing, 1)
            if not on_gpu:
                steady = peak = _host_needs(probes, keep, n_timing)
            chunks = 1
            if peak > budget and on_gpu:
                found = choose_chunks(main, budget, steady)
                if found is None:
                    last_need = peak
                    continue
                chunks, peak = found, steady + main.f64_peak(found)
            if peak <= budget:
                return Plan(device=device, device_total_bytes=device_total, device_free_bytes=device_free,
                            host_total_bytes=host_total, bytes=sizes, gate_sets=keep, timing_sets=n_timing,
                            variants=wanted[:keep], dropped=wanted[keep:],
                            oracle="chunked" if chunks > 1 else "whole", oracle_chunks=chunks,
                            needs_device_bytes=peak if on_gpu else 0, needs_host_bytes=0 if on_gpu else peak,
                            sandbox_host_limit_bytes=limit)
            last_need = peak
    where = "GPU memory" if on_gpu else "host memory"
    has = device_free if on_gpu else host_available
    raise PlanError(f"needs {_fmt(last_need)} of {where} for the least the gate keeps (two input sets "
                    f"of {_fmt(main.inputs_bytes)} with float64 oracles, one timing set, the candidate's "
                    f"and the incumbent's sandboxes); the {'device' if on_gpu else 'host'} has "
                    f"{_fmt(has)} free ({_fmt(budget)} usable)")
