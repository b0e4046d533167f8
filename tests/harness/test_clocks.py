"""Clock locking is released on every exit path; throttled samples are recognised.

No GPU's settings may be changed where these tests run (CI has no GPU, and the shared H200s
must never be locked), so NVML is replaced by a recorder with NVML's call signatures. What is
under test is kernelab's bookkeeping: that every lock is paired with a reset.
"""

from __future__ import annotations

import os
import signal

import pytest

from kernelabd.harness.clocks import ClockError, ClockSampler, locked_clocks, reason_names, summarise


class RecordingNvml:
    """NVML's API surface that clocks.py uses, recording what would be changed."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 0, 2, 0

    class NVMLError(Exception):
        pass

    def __init__(self, reasons: int = 0, refuse_lock: bool = False) -> None:
        self.calls: list[tuple] = []
        self.reasons = reasons
        self.refuse_lock = refuse_lock

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        if not uuid.startswith("GPU-"):
            raise self.NVMLError("bad uuid")
        return uuid

    def nvmlDeviceGetMaxClockInfo(self, h, kind):
        return 1980

    def nvmlDeviceGetDefaultApplicationsClock(self, h, kind):
        return 1590

    def nvmlDeviceSetGpuLockedClocks(self, h, lo, hi):
        if self.refuse_lock:
            raise self.NVMLError("Insufficient Permissions")
        self.calls.append(("lock", lo, hi))

    def nvmlDeviceResetGpuLockedClocks(self, h):
        self.calls.append(("reset",))

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self.reasons

    def nvmlDeviceGetClockInfo(self, h, kind):
        return 1980 if kind == self.NVML_CLOCK_SM else 3201

    def nvmlDeviceGetTemperature(self, h, kind):
        return 51

    def nvmlDeviceGetPowerUsage(self, h):
        return 450_000


def sampler(nvml: RecordingNvml) -> ClockSampler:
    return ClockSampler("0c2e4d1a-uuid", nvml=nvml)


@pytest.mark.parametrize("mode,mhz", [("max", 1980), ("base", 1590), ("1500", 1500)])
def test_lock_is_released_on_normal_exit(mode: str, mhz: int) -> None:
    nvml = RecordingNvml()
    with locked_clocks(sampler(nvml), mode) as locked:
        assert locked == mhz
        assert nvml.calls == [("lock", mhz, mhz)]
    assert nvml.calls[-1] == ("reset",)


def test_lock_is_released_when_timing_raises() -> None:
    nvml = RecordingNvml()
    with pytest.raises(RuntimeError), locked_clocks(sampler(nvml), "max"):
        raise RuntimeError("candidate crashed")
    assert nvml.calls == [("lock", 1980, 1980), ("reset",)]


def test_sigterm_while_locked_releases_and_exits() -> None:
    nvml = RecordingNvml()
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as exc, locked_clocks(sampler(nvml), "max"):
        os.kill(os.getpid(), signal.SIGTERM)
    assert exc.value.code == 128 + signal.SIGTERM
    assert nvml.calls == [("lock", 1980, 1980), ("reset",)]
    assert signal.getsignal(signal.SIGTERM) == before


def test_off_changes_nothing() -> None:
    nvml = RecordingNvml()
    with locked_clocks(sampler(nvml), "off") as locked:
        assert locked is None
    assert nvml.calls == []


def test_refused_lock_is_a_clear_error_and_nothing_to_release() -> None:
    nvml = RecordingNvml(refuse_lock=True)
    with pytest.raises(ClockError, match="cannot lock clocks at 1980 MHz"), \
            locked_clocks(sampler(nvml), "max"):
        pass
    assert nvml.calls == []


def test_thermal_slowdown_marks_a_sample_throttled() -> None:
    assert sampler(RecordingNvml(reasons=0x40)).sample()["throttled"]
    assert not sampler(RecordingNvml(reasons=0x1 | 0x4)).sample()["throttled"]
    assert reason_names(0x40 | 0x8) == ["hw_slowdown", "hw_thermal"]


def test_summary_of_blocks() -> None:
    s = sampler(RecordingNvml()).sample()
    out = summarise([s, dict(s, sm_clock_mhz=1755)], None, 2)
    assert out["sm_clock_min_mhz"] == 1755 and out["sm_clock_max_mhz"] == 1980
    assert out["throttled_blocks_discarded"] == 2
