"""The trusted-clock cross-check: a claimed time or gain our own clock contradicts is refused."""

from __future__ import annotations

import pytest

from kernelabd.config import TimingConfig
from kernelabd.harness.timing import HOT_CONFIRMS, HOT_ROUNDS, Comparison, TimerMismatch, check_trusted


def test_consistent_report_passes() -> None:
    check_trusted(1.0, 0.8, {"A": 0.95, "B": 0.78})


def test_time_far_below_our_clock_is_refused() -> None:
    with pytest.raises(TimerMismatch, match="our own clock measured"):
        check_trusted(1.0, 0.4, {"A": 1.0, "B": 1.0})


def test_on_a_cpu_a_busy_machine_slowing_both_sides_is_not_a_lie() -> None:
    """Our back-to-back calls ran while other work held the cores: both sides look twice as
    slow as they reported, which is no evidence against the candidate; a gain our clock did
    not see still is."""
    check_trusted(70.0, 34.0, {"A": 150.0, "B": 74.0}, absolute=False)
    with pytest.raises(TimerMismatch, match="reported speedup"):
        check_trusted(70.0, 20.0, {"A": 150.0, "B": 148.0}, absolute=False)


def test_gain_our_clock_did_not_see_is_refused() -> None:
    # 60 % of the real time reported: a 1.67x "gain" where our clock saw none
    with pytest.raises(TimerMismatch, match=r"reported speedup 1\.667"):
        check_trusted(1.0, 0.6, {"A": 1.0, "B": 1.0})


def test_slower_candidate_is_never_refused_for_disagreeing() -> None:
    check_trusted(0.2, 300.0, {"A": 0.5, "B": 290.0})


def test_host_bound_timings_are_not_compared() -> None:
    check_trusted(1.0, 0.3, {"A": 0.05, "B": 0.05})



class ScriptedClock(Comparison):
    """The cross-check's rounds with our clock's readings scripted (ms a call, in the order the
    rounds ask for them): the confirmation rule is the subject here; the sandboxes' side of it
    is covered by the adversarial candidates that lie about their time."""

    def __init__(self, a: list[float], b: list[float]) -> None:
        super().__init__(None, None, TimingConfig(), "cpu", None, float("inf"))  # type: ignore[arg-type]
        self.readings = {"A": iter(a), "B": iter(b)}
        self.asked = 0

    def _trusted_ms(self, side: str, est_ms: float) -> float:
        self.asked += 1
        return next(self.readings[side])


def test_a_busy_moment_during_the_candidates_rounds_is_measured_again_not_a_verdict() -> None:
    """Other work slowed B's first rounds, so our clock saw no gain where the A/B saw 2x; the
    rounds measured again see the gain, and the honest candidate is not refused."""
    clock = ScriptedClock(a=[2.0, 2.0, 2.0, 2.0], b=[2.0, 2.1, 1.0, 1.05])
    assert clock._trusted({"A": 2.0, "B": 1.0}, 2.0, 1.0) == {"A": 2.0, "B": 1.0}
    assert clock.asked == 2 * (2 * HOT_ROUNDS), "one confirmation: both sides' rounds again"


def test_a_gain_our_clock_never_sees_is_refused_after_every_confirmation() -> None:
    """A candidate whose calls really take what the baseline's take cannot make more rounds
    find a gain: it is refused once the confirmations are spent, not before."""
    rounds = (1 + HOT_CONFIRMS) * HOT_ROUNDS
    clock = ScriptedClock(a=[1.0] * rounds, b=[1.0] * rounds)
    with pytest.raises(TimerMismatch, match=r"reported speedup 1\.667"):
        clock._trusted({"A": 1.0, "B": 0.6}, 1.0, 0.6)
    assert clock.asked == 2 * rounds
