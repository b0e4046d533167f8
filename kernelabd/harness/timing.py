"""Measurement: interleaved A/B blocks in two sandbox processes on the same device.

The sandboxes take the samples (CUDA events around a CUDA-graph replay, or around an eager call
with a device-wide synchronisation before the end event where a side cannot be captured; L2
flushed and persisting-L2 reset before every sample, input sets rotating; a host clock on CPU).
This module drives them, records the clock state around every block, re-runs blocks taken
while the GPU throttled, stops when the speedup's confidence interval is tight enough or the
budget is spent (``StoppingRule``), and finally cross-checks the reported times against our
own clock: a candidate that rewrites its timer in its own process cannot rewrite ours.
"""

from __future__ import annotations

import math
import secrets
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kernelabd.config import TimingConfig
from kernelabd.harness import accept
from kernelabd.harness.clocks import ClockSampler
from kernelabd.harness.sandbox import Sandbox, SandboxError

GRAPH_BELOW_MS = 0.010          # kernels faster than this are captured several times a replay
GRAPH_TARGET_MS = 0.050         # … to this much work per replay
MAX_PAIRS = 400
MAX_DISCARDS = 10
HOT_TARGET_S = 0.1              # trusted-clock cross-check: this long of back-to-back calls
HOT_ROUNDS = 2                  # … interleaved A, B, A, B; the fastest round per side is kept
HOT_FLOOR_S = 10.0              # … and may always take this long …
HOT_LIE_FACTOR = 20.0           # … or this many times what the side's own samples claimed
HOT_CONFIRMS = 2                # a mismatch is measured again this many times before it is a verdict
TRUSTED_FLOOR_MS = 0.2          # below this per call, host overhead hides device time
TRUSTED_RATIO = 0.5             # reported time may not be under half of what our clock saw
TRUSTED_SPEEDUP_SLACK = 1.5     # cold (flushed) and hot speedups differ, but not by this much


@dataclass
class Measurement:
    a_ms: float
    b_ms: float
    decision: accept.Decision
    blocks: list[dict[str, Any]] = field(default_factory=list)
    clock_samples: list[dict[str, Any]] = field(default_factory=list)
    discarded: int = 0
    mode: str = "eager"
    trusted_ms: dict[str, float] = field(default_factory=dict)
    fingerprints: dict[int, list[float]] = field(default_factory=dict)   # B's, by sample index
    seeds: dict[str, int] = field(default_factory=dict)


class TimerMismatch(Exception):
    """What the candidate reported is inconsistent with the time our own clock measured."""


def _median(xs: list[float]) -> float:
    return statistics.median(xs)


def check_trusted(a_ms: float, b_ms: float, trusted: dict[str, float],
                  absolute: bool = True) -> None:
    """Cross-check what the sandboxes reported against this process's own clock.

    Two tests, both only where the device, not host overhead, sets the pace: the candidate's
    reported time may not be far below what back-to-back calls took by our clock (``absolute``:
    on a GPU only — on a CPU the calls share the cores with everything else on the machine, so
    a busy moment can double our measurement; a candidate shrinking its own times still
    claims a gain there, which the second test sees), and the speedup it reports may not be
    far above the speedup our clock saw.
    """
    if min(trusted.values()) <= TRUSTED_FLOOR_MS:
        return
    if absolute and b_ms < TRUSTED_RATIO * trusted["B"]:
        raise TimerMismatch(f"the candidate reported {b_ms:.4f} ms per call, but our own clock "
                            f"measured {trusted['B']:.4f} ms per call back to back")
    reported, ours = a_ms / b_ms, trusted["A"] / trusted["B"]
    if reported > max(1.0, TRUSTED_SPEEDUP_SLACK * ours):   # only a claimed gain can be a lie
        raise TimerMismatch(f"reported speedup {reported:.3f}× but our own clock saw {ours:.3f}× "
                            "on back-to-back calls")


class StoppingRule:
    """When an A/B comparison has enough block pairs (nvbench's ``stopping_criterion``): once
    the speedup's confidence interval is within ``target_rel_noise`` (after at least
    ``accept.MIN_PAIRS`` and ``min_pairs`` pairs), once ``budget_s`` is spent with ``min_pairs``
    in hand, at three budgets whatever the count (a noisy or slow pair never runs away with the
    device), and at ``MAX_PAIRS``. Fed kept pairs only; the clock is injectable so that the rule
    is tested on simulated samples."""

    def __init__(self, cfg: TimingConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.clock = clock
        self.start = clock()
        self.a_ms: list[float] = []
        self.b_ms: list[float] = []
        self._decided: tuple[int, accept.Decision] | None = None

    def add(self, pair: tuple[float, float]) -> None:
        """One kept pair of block medians: (baseline, candidate)."""
        self.a_ms.append(pair[0])
        self.b_ms.append(pair[1])

    def decision(self) -> accept.Decision:
        """The acceptance rule on the pairs so far, computed once per pair count."""
        if self._decided is None or self._decided[0] != len(self.a_ms):
            self._decided = (len(self.a_ms), accept.decide(self.a_ms, self.b_ms, self.cfg.min_gain))
        return self._decided[1]

    def finished(self) -> bool:
        pairs = len(self.a_ms)
        if pairs >= MAX_PAIRS:
            return True
        if (pairs >= max(accept.MIN_PAIRS, self.cfg.min_pairs)
                and self.decision().rel_halfwidth <= self.cfg.target_rel_noise):
            return True
        elapsed, budget = self.clock() - self.start, self.cfg.budget_s
        return (elapsed > budget and pairs >= self.cfg.min_pairs) or elapsed > 3 * budget


class Comparison:
    """One A/B comparison: A is the baseline (reference or incumbent), B the candidate."""

    def __init__(self, a: Sandbox, b: Sandbox, cfg: TimingConfig, device: str,
                 sampler: ClockSampler | None, deadline: float,
                 progress: Callable[[str], None] | None = None) -> None:
        self.boxes = {"A": a, "B": b}
        self.cfg = cfg
        self.device = device
        self.sampler = sampler
        self.deadline = deadline
        self.progress = progress or (lambda _msg: None)
        self.blocks: list[dict[str, Any]] = []
        self.clock_samples: list[dict[str, Any]] = []
        self.fingerprints: dict[int, list[float]] = {}
        self.seeds = {"perturb_seed": secrets.randbits(62), "fp_seed": secrets.randbits(62)}
        self.reps = 1

    def _ask(self, side: str, header: dict[str, Any], what: str) -> dict[str, Any]:
        reply, _ = self.boxes[side].request(header, deadline=self.deadline, what=what)
        return reply

    def _choose_mode(self, est: dict[str, float]) -> str:
        """On a GPU both sides are timed as CUDA-graph replays where both can be captured.

        A replay keeps the host out of the timed region: eager calls carry the Python and
        launch overhead (tens of µs that wander with the host's state, measured on an H200 as
        block medians of one 0.13 ms kernel jumping between 0.20 and 0.33 ms). Tiny kernels are
        captured several times a replay. A side that cannot be captured (host synchronisation,
        an unjoined side stream) makes both sides eager, so that they are timed alike.
        """
        if self.device == "cpu":
            return "eager"
        fastest = min(est.values())
        reps = 1 if fastest >= GRAPH_BELOW_MS else math.ceil(GRAPH_TARGET_MS / max(fastest, 1e-4))
        try:
            self._ask("B", {"cmd": "graphs", "reps": reps}, "capturing a CUDA graph")
        except Exception:  # a candidate that cannot be captured is timed eagerly
            return "eager"
        try:
            self._ask("A", {"cmd": "graphs", "reps": reps}, "capturing a CUDA graph")
        except Exception:
            self._ask("B", {"cmd": "graphs", "reps": 0}, "dropping the CUDA graphs")
            return "eager"
        self.reps = reps
        return "graph"

    def _block(self, side: str, pair: int, n: int) -> tuple[float, bool]:
        before = self.sampler.sample() if self.sampler else None
        t0 = time.monotonic()
        reply = self._ask(side, {"cmd": "block", "n": n, "start": pair * n}, "timing")
        wall = time.monotonic() - t0
        after = self.sampler.sample() if self.sampler else None
        samples = [float(x) for x in reply["samples_ms"]]
        if len(samples) != n or not all(math.isfinite(x) and x > 0 for x in samples):
            raise TimerMismatch(f"{side} returned {len(samples)} invalid samples for {n} calls")
        if side == "B":
            prints = reply.get("fingerprints")
            if not isinstance(prints, list) or len(prints) != n:
                raise TimerMismatch("the candidate returned no fingerprints for its timed outputs")
            self.fingerprints.update({pair * n + k: fp for k, fp in enumerate(prints)})
        if sum(samples) / 1000 > wall * 1.05 + 0.002:
            raise TimerMismatch(f"{side} reported {sum(samples):.3f} ms of work in a block our "
                                f"clock saw take {wall * 1000:.3f} ms")
        throttled = bool(before and after and (before["throttled"] or after["throttled"]))
        clock = after or before
        if clock:
            self.clock_samples.append(clock)
        self.blocks.append({"side": side, "idx": len(self.blocks), "samples_ms": samples,
                            "median_ms": _median(samples), "clock": clock, "throttled": throttled,
                            "wall_ms": wall * 1000})
        return _median(samples), throttled

    def _trusted_ms(self, side: str, est_ms: float) -> float:
        """Per-call time of back-to-back calls (graph replays of ``reps`` calls each, in graph
        mode), measured by our clock around the request.

        The calls are sized from the time the side itself reported, so a side that reported far
        less than its calls take (work deferred past its timed calls) would make this run for
        minutes: past HOT_LIE_FACTOR times what it claimed, that is the lie, found by our clock.
        """
        k = int(min(2000, max(3, HOT_TARGET_S * 1000 / max(est_ms * self.reps, 1e-3))))
        claimed_s = k * self.reps * est_ms / 1000
        limit = min(self.deadline, time.monotonic() + max(HOT_FLOOR_S, HOT_LIE_FACTOR * claimed_s))
        t0 = time.monotonic()
        try:
            self.boxes[side].request({"cmd": "hot", "k": k}, deadline=limit, what="timing back-to-back calls")
        except SandboxError as exc:
            if exc.kind != "timeout" or limit >= self.deadline:
                raise
            raise TimerMismatch(f"{side} reported {est_ms:.4g} ms a call, but {k} back-to-back calls did not "
                                f"finish in {limit - t0:.1f} s by our clock") from None
        return (time.monotonic() - t0) * 1000 / (k * self.reps)

    def _trusted(self, est: dict[str, float], a_ms: float, b_ms: float) -> dict[str, float]:
        """Each side's back-to-back time, rounds interleaved and the fastest kept, cross-checked
        against what the sides reported.

        Interference from other work only ever adds time, and a burst of it during one side's
        rounds would otherwise skew the speedup our clock sees (honest candidates were rejected
        for it on a loaded CPU). So a mismatch is measured again before it is a verdict, the
        fastest round over all kept: more rounds strip interference, but a lie's real time
        cannot shrink, so a candidate that lies is caught on every try.
        """
        rounds: dict[str, list[float]] = {"A": [], "B": []}
        for attempt in range(1 + HOT_CONFIRMS):
            for _ in range(HOT_ROUNDS):
                for side in "AB":
                    rounds[side].append(self._trusted_ms(side, est[side]))
            trusted = {side: min(times) for side, times in rounds.items()}
            try:
                check_trusted(a_ms, b_ms, trusted, absolute=self.device != "cpu")
                return trusted
            except TimerMismatch:
                if attempt == HOT_CONFIRMS:
                    raise
        raise AssertionError("unreachable")

    def run(self) -> Measurement:
        est = {s: float(self._ask(s, {"cmd": "calibrate", **self.seeds}, "warming up")["est_ms"])
               for s in "AB"}
        mode = self._choose_mode(est)
        n = int(min(100, max(1, round(self.cfg.block_ms / max(max(est.values()), 1e-4)))))
        rule = StoppingRule(self.cfg)
        discarded = 0
        while True:
            kept = len(rule.a_ms)
            order = "AB" if kept % 2 == 0 else "BA"
            meds = {}
            throttled = False
            for side in order:
                meds[side], hot = self._block(side, kept + discarded, n)
                throttled = throttled or hot
            if throttled and discarded < MAX_DISCARDS:
                discarded += 1
                continue
            rule.add((meds["A"], meds["B"]))
            if rule.finished():
                break
            self.progress(f"timing: {len(rule.a_ms)} block pairs")
        decision = rule.decision()
        a_ms, b_ms = _median(rule.a_ms), _median(rule.b_ms)
        trusted = self._trusted(est, a_ms, b_ms)
        return Measurement(a_ms=a_ms, b_ms=b_ms, decision=decision, blocks=self.blocks,
                           clock_samples=self.clock_samples, discarded=discarded, mode=mode,
                           trusted_ms=trusted, fingerprints=self.fingerprints, seeds=self.seeds)
