"""The outcome of one check: what the gate decided, what the timer measured, and why.

This is the contract between the harness and everything above it (CLI ``--json``, the daemon's
records, the reports). Keys named by users' scripts — verdict, reason, rule, max_rel_error,
tolerance, reference_ms, candidate_ms, speedup, speedup_ci, faster_than_noise, device, clock —
never change meaning.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# Rules that mean "the inputs could not be evaluated" (exit 2), not "the candidate is wrong".
INPUT_RULES = frozenset({"bad_reference", "bad_candidate", "bad_arguments"})


@dataclass
class CheckResult:
    verdict: str                               # pass | fail | error
    reason: str | None = None                  # one line; None on pass
    rule: str | None = None                    # the gate rule that failed
    evidence: dict[str, Any] = field(default_factory=dict)
    max_rel_error: float | None = None         # worst normwise relative error over input sets
    tolerance: float | None = None
    reference_ms: float | None = None          # the baseline's time (the reference unless given)
    candidate_ms: float | None = None
    speedup: float | None = None               # baseline_ms / candidate_ms
    speedup_ci: list[float] | None = None      # bootstrap CI [lo, hi]
    faster_than_noise: bool = False
    aa_noise: float | None = None              # relative A/A noise the threshold used
    threshold: float | None = None             # speedup_ci[0] had to exceed this
    device: str = "cpu"
    clock: dict[str, Any] | None = None        # NVML clock state summary; None on CPU
    baseline: str = "reference"                # what A was: "reference" or a candidate's path
    input_sets: int = 0                        # gate input sets checked
    timed_sets: int = 0                        # fresh input sets used while timing
    blocks: list[dict[str, Any]] = field(default_factory=list)
    stages: dict[str, float] = field(default_factory=dict)   # wall seconds per stage
    wall_s: float | None = None

    @property
    def exit_code(self) -> int:
        if self.rule in INPUT_RULES:
            return 2
        return 0 if self.verdict == "pass" else 1

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def invalid(cls, rule: str, reason: str, device: str) -> CheckResult:
        return cls(verdict="error", rule=rule, reason=reason, device=device)
