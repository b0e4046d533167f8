"""The trusted-clock cross-check: a claimed time or gain our own clock contradicts is refused."""

from __future__ import annotations

import pytest

from kernelabd.harness.timing import TimerMismatch, check_trusted


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
