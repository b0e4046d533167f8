"""GPU clock state through NVML: what the clocks were while we timed, and opt-in locking.

Sampling happens in trusted code around every measurement block, so a block run while the GPU
was throttling (thermal, power brake, hardware slowdown) is recognised and re-run instead of
quietly making one side look slower. Locking is for an owner's own box only: it changes the
GPU's settings, needs root, and is always released — on return, on exceptions, at exit and on
SIGTERM.
"""

from __future__ import annotations

import atexit
import contextlib
import signal
from collections.abc import Iterator
from typing import Any

from kernelabd.harness import nvml

REASONS = {
    0x1: "gpu_idle", 0x2: "applications_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake",
    0x100: "display_clock",
}
# Reasons that mean "this block ran slower than the same code would a moment later".
THROTTLING = frozenset({"hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake"})


class ClockError(RuntimeError):
    """NVML is unavailable, or clocks cannot be locked as asked."""


def _nvml() -> Any:
    try:
        return nvml.init()
    except nvml.NvmlUnavailable as exc:
        raise ClockError(f"NVML unavailable: {exc}") from exc


def reason_names(mask: int) -> list[str]:
    return [name for bit, name in REASONS.items() if mask & bit]


class ClockSampler:
    """Reads one GPU's clocks, temperature and power; found by the UUID the sandbox reports."""

    def __init__(self, uuid: str, nvml: Any = None) -> None:
        self.nvml = nvml or _nvml()
        ident = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
        try:
            self.handle = self.nvml.nvmlDeviceGetHandleByUUID(ident)
        except self.nvml.NVMLError as exc:
            raise ClockError(f"NVML does not know GPU {ident}: {exc}") from exc

    def sample(self) -> dict[str, Any]:
        n, h = self.nvml, self.handle
        getter = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            n.nvmlDeviceGetCurrentClocksThrottleReasons
        reasons = reason_names(int(getter(h)))
        return {
            "sm_clock_mhz": n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),
            "mem_clock_mhz": n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM),
            "clock_reasons": reasons,
            "temperature_c": n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU),
            "power_w": n.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "throttled": bool(THROTTLING.intersection(reasons)),
        }


def lock_target_mhz(nvml: Any, handle: Any, mode: str) -> int:
    """The SM clock ``mode`` (base, max or a number of MHz) asks for on this GPU."""
    if mode.isdigit():
        return int(mode)
    if mode == "max":
        return int(nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM))
    if mode == "base":
        return int(nvml.nvmlDeviceGetDefaultApplicationsClock(handle, nvml.NVML_CLOCK_SM))
    raise ClockError(f"lock_clocks must be off, base, max or MHz, not {mode!r}")


@contextlib.contextmanager
def locked_clocks(sampler: ClockSampler, mode: str) -> Iterator[int | None]:
    """Lock the SM clock for the duration; ``off`` does nothing. Released on every exit path."""
    if mode == "off":
        yield None
        return
    nvml, handle = sampler.nvml, sampler.handle
    mhz = lock_target_mhz(nvml, handle, mode)
    try:
        nvml.nvmlDeviceSetGpuLockedClocks(handle, mhz, mhz)
    except nvml.NVMLError as exc:
        raise ClockError(f"cannot lock clocks at {mhz} MHz (root on a box you own?): {exc}") from exc

    def release() -> None:
        with contextlib.suppress(Exception):
            nvml.nvmlDeviceResetGpuLockedClocks(handle)

    atexit.register(release)
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        yield mhz
    finally:
        release()
        atexit.unregister(release)
        signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    """Turn SIGTERM into SystemExit so that ``finally`` blocks (clock release) run."""
    raise SystemExit(128 + signum)


def summarise(samples: list[dict[str, Any]], locked: int | None, discarded: int) -> dict[str, Any]:
    """The clock state of a whole measurement, for the verdict and the report."""
    if not samples:
        return {"locked_mhz": locked, "throttled_blocks_discarded": discarded}
    sm = sorted(s["sm_clock_mhz"] for s in samples)
    reasons = sorted({r for s in samples for r in s["clock_reasons"]})
    return {
        "sm_clock_mhz": sm[len(sm) // 2], "sm_clock_min_mhz": sm[0], "sm_clock_max_mhz": sm[-1],
        "mem_clock_mhz": samples[-1]["mem_clock_mhz"],
        "temperature_max_c": max(s["temperature_c"] for s in samples),
        "power_max_w": max(s["power_w"] for s in samples),
        "clock_reasons": reasons, "locked_mhz": locked,
        "throttled_blocks_discarded": discarded,
    }
