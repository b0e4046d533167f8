"""Devices the daemon schedules on: GPUs found through NVML, else the CPU.

NVML is initialised once, by the daemon, and sampled at ``gpu_sample_s``: TUIs read the samples
from the database instead of each paying NVML's start-up cost. Workers are pinned by GPU UUID in
``CUDA_VISIBLE_DEVICES``, because NVML and CUDA may number the same GPUs differently.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from typing import Any

from kernelabd.harness import nvml as nvml_lib


class DeviceError(RuntimeError):
    """The requested device kind is not available here."""


@dataclass(frozen=True)
class Device:
    id: str                       # cpu | cuda:N (N = NVML index); NODE/… on a Ray cluster
    name: str
    uuid: str | None = None
    memory_total_mb: float | None = None
    index: int | None = None
    node: str | None = None       # the host (locally) or Ray node name it is attached to

    @property
    def check_device(self) -> str:
        """The device name the harness uses inside a worker pinned to this device."""
        return "cpu" if self.index is None else "cuda"

    def worker_env(self) -> dict[str, str]:
        if self.index is None:
            return {"CUDA_VISIBLE_DEVICES": "", "TRITON_INTERPRET": "1"}
        return {"CUDA_VISIBLE_DEVICES": self.uuid or str(self.index)}


def cpu_device() -> Device:
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return Device(id="cpu", name=name)



def nvml_devices(nvml: Any, only: list[int]) -> list[Device]:
    found = []
    for index in range(nvml.nvmlDeviceGetCount()):
        if only and index not in only:
            continue
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        found.append(Device(id=f"cuda:{index}", name=nvml_lib.text(nvml.nvmlDeviceGetName(handle)),
                            uuid=nvml_lib.text(nvml.nvmlDeviceGetUUID(handle)),
                            memory_total_mb=memory.total / 2**20, index=index))
    return found


def discover(requested: str | None, gpus: list[int]) -> tuple[list[Device], Any | None]:
    """The devices to run workers on, and the NVML module to sample them with (or None).

    ``requested``: ``cpu`` forces the CPU worker, ``cuda`` demands GPUs, None takes GPUs when
    there are any and the CPU otherwise.
    """
    if requested == "cpu":
        return [cpu_device()], None
    nvml = nvml_lib.init_or_none()
    found = nvml_devices(nvml, gpus) if nvml is not None else []
    if found:
        return found, nvml
    if requested == "cuda":
        raise DeviceError("--device cuda: no GPU found through NVML"
                          + (f" among gpus = {gpus}" if gpus else ""))
    return [cpu_device()], None


def _call(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:  # one unsupported query (NVMLError_NotSupported) must not stop sampling
        return None


def reasons(nvml: Any, mask: int | None) -> str | None:
    """Names of the active clock-event reasons (``GpuIdle``, ``SwThermalSlowdown`` …)."""
    if mask is None:
        return None
    names = [n[len("nvmlClocksEventReason"):] for n in dir(nvml)
             if n.startswith("nvmlClocksEventReason") and n != "nvmlClocksEventReasonNone"
             and n != "nvmlClocksEventReasonAll" and isinstance(getattr(nvml, n), int)
             and getattr(nvml, n) & mask]
    return ",".join(sorted(set(names)))


def sample(nvml: Any, device: Device, now: float) -> dict[str, Any]:
    """One row of ``gpu_samples`` for ``device``; a query the GPU does not support is NULL."""
    h = nvml.nvmlDeviceGetHandleByIndex(device.index)
    util = _call(nvml.nvmlDeviceGetUtilizationRates, h)
    memory = _call(nvml.nvmlDeviceGetMemoryInfo, h)
    power = _call(nvml.nvmlDeviceGetPowerUsage, h)
    event_fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    return {
        "device_id": device.id, "ts": now,
        "util_pct": util.gpu if util is not None else None,
        "sm_clock_mhz": _call(nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM),
        "mem_clock_mhz": _call(nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_MEM),
        "temperature_c": _call(nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU),
        "power_w": power / 1000 if power is not None else None,
        "mem_used_mb": memory.used / 2**20 if memory is not None else None,
        "mem_total_mb": memory.total / 2**20 if memory is not None else None,
        "clock_reasons": reasons(nvml, _call(event_fn, h)),
    }
