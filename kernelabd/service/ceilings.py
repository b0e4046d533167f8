"""Speed-of-light ceilings of a device, measured once, and the floor they put under a job.

A port's "% of speed of light" is only honest against what this device actually reaches, not
against a datasheet: so the ceilings are *measured* — the best of a few large copies (bytes read
plus bytes written per second) and the best of a few large matrix products per precision —
with the same clock the harness times with (CUDA events on a GPU, ``perf_counter`` on a CPU).
They are measured once per device per home and reused by every later job there, ``kernelab
port`` included, under a key naming the device (its UUID), the driver and the clock settings:
a new driver, another GPU or other clocks measure them again. Only kernels are launched; no
device setting is changed.

The floor of a job is ``max(flops / matrix rate, min_bytes / copy bandwidth)``: FLOPs come from
``torch.utils.flop_counter`` (which counts matrix products, convolutions and attention — the
work the matrix units do), bytes from the capture's inputs, parameters and outputs.

torch is imported inside the measuring functions only: ``kernelab doctor`` describes stored
ceilings and must answer without loading it.
"""

from __future__ import annotations

import contextlib
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from kernelabd.harness import nvml
from kernelabd.harness.problem import one_line

if TYPE_CHECKING:
    import torch

REPS = 8
"""Timed repetitions per measurement; the best is kept (a ceiling is what the device *can* do)."""

CUDA_SIZES = {"copy_bytes": 1 << 30, "matmul_n": 8192}
CPU_SIZES = {"copy_bytes": 1 << 24, "matmul_n": 256}
"""Large enough to reach steady state on an H100/H200-class GPU (1 GiB copies, 8192³ products);
on a CPU small enough to cost well under a second."""


def device_timer(device: torch.device) -> Callable[[Callable[[], Any]], float]:
    """A function timing one call in milliseconds on ``device``'s own clock."""
    import torch

    if device.type == "cuda":
        def cuda_ms(fn: Callable[[], Any]) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return float(start.elapsed_time(end))
        return cuda_ms

    def cpu_ms(fn: Callable[[], Any]) -> float:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    return cpu_ms


def _best_ms(timer: Callable[[Callable[[], Any]], float], fn: Callable[[], Any]) -> float:
    fn()                                             # warm-up: allocation, library handles
    return min(timer(fn) for _ in range(REPS))


def copy_bandwidth(device: torch.device, nbytes: int) -> float:
    """GB/s of a device-to-device copy, counting the read and the write."""
    import torch

    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    ms = _best_ms(device_timer(device), lambda: dst.copy_(src))
    return 2 * src.numel() * 4 / (ms * 1e-3) / 1e9


def matmul_rate(device: torch.device, n: int, dtype: torch.dtype, tf32: bool = False) -> float:
    """TFLOP/s of an ``n``³ product in ``dtype`` (fp32 with or without TF32)."""
    import torch

    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        ms = _best_ms(device_timer(device), lambda: torch.mm(a, b))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    return 2 * n ** 3 / (ms * 1e-3) / 1e12


def device_name(device: torch.device) -> str:
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    from kernelabd.service.devices import cpu_device

    return cpu_device().name


def measure(device: str) -> dict[str, Any]:
    """The ceilings of ``device`` (``cpu``, ``cuda`` or ``cuda:N``), as stored in ``devices``."""
    import torch

    dev = torch.device(device)
    sizes = CUDA_SIZES if dev.type == "cuda" else CPU_SIZES
    n = sizes["matmul_n"]
    values = {"copy_gbps": copy_bandwidth(dev, sizes["copy_bytes"]),
              "fp32_tflops": matmul_rate(dev, n, torch.float32),
              "bf16_tflops": matmul_rate(dev, n, torch.bfloat16),
              "fp16_tflops": matmul_rate(dev, n, torch.float16)}
    if dev.type == "cuda":
        values["tf32_tflops"] = matmul_rate(dev, n, torch.float32, tf32=True)
        torch.cuda.synchronize(dev)
    return {**{k: round(v, 3) for k, v in values.items()}, "device_name": device_name(dev),
            "sizes": sizes, "reps": REPS, "torch": torch.__version__, "measured_at": time.time()}


FP32_BY_TF32_PASSES = 3
"""An fp32-accurate product on TF32 tensor cores takes three of their products (3xTF32: each
operand split into a TF32 head and tail, the tail × tail term dropped), as kernelab's own
templates do; where that beats the FMA units, it sets the fp32 floor."""


def matrix_rate(ceilings: dict[str, Any], dtype: str | None, tf32: bool) -> float | None:
    """The TFLOP/s that applies to a job whose main floating dtype is ``dtype``: for fp32
    without TF32, the faster of the FMA units and 3xTF32 (on an H200, 421 / 3 = 140 against 51
    TFLOP/s measured; kernelab's 3xTF32 GEMMs ran at 77-87 TFLOP/s, past the FMA units' rate)."""
    key = {"torch.bfloat16": "bf16_tflops", "torch.float16": "fp16_tflops"}.get(dtype or "")
    if key is None and tf32 and "tf32_tflops" in ceilings:
        key = "tf32_tflops"
    if key is None:
        rates = [float(ceilings.get("fp32_tflops") or 0),
                 float(ceilings.get("tf32_tflops") or 0) / FP32_BY_TF32_PASSES]
        return max(rates) or None
    rate = ceilings.get(key)
    return float(rate) if rate else None


def floor_ms(capture: dict[str, Any], ceilings: dict[str, Any], tf32: bool = False,
             ) -> dict[str, Any] | None:
    """The speed-of-light time of a captured reference: the larger of its compute time at
    the matrix rate and its minimum traffic at copy bandwidth; None without the figures."""
    bandwidth = ceilings.get("copy_gbps")
    min_bytes = capture.get("min_bytes")
    if not bandwidth or min_bytes is None:
        return None
    memory_ms = float(min_bytes) / (float(bandwidth) * 1e9) * 1e3
    flops = float(capture.get("flops") or 0)
    rate = matrix_rate(ceilings, capture.get("dtype"), tf32)
    compute_ms = flops / (rate * 1e12) * 1e3 if flops and rate else 0.0
    bound = "compute" if compute_ms > memory_ms else "memory"
    return {"ms": max(memory_ms, compute_ms), "memory_ms": memory_ms, "compute_ms": compute_ms,
            "bound": bound}


def describe(ceilings: dict[str, Any]) -> str:
    """One line for people: the device, its copy bandwidth and its matrix rates."""
    rates = ", ".join(f"{key.removesuffix('_tflops')} {ceilings[key]:.4g}" for key in
                      ("bf16_tflops", "fp16_tflops", "tf32_tflops", "fp32_tflops") if ceilings.get(key))
    return (f"{ceilings.get('device_name', '?')}: copy {float(ceilings.get('copy_gbps') or 0):.4g} GB/s; "
            f"TFLOP/s {rates or '?'}")


@dataclass(frozen=True)
class Identity:
    """What a device's ceilings depend on, as the ``ceilings`` table's key, and its name."""

    key: str
    name: str


def identity(device: str, lock_clocks: str = "off") -> Identity:
    """The key ceilings measured on ``device`` are kept under: the device (a GPU's UUID; the
    host and its CPU model), the driver (NVML's version; torch's, whose libraries run the
    measuring kernels) and the clock settings (the GPU's application clocks, ``lock_clocks``)."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        from kernelabd.service.devices import cpu_device

        name = cpu_device().name
        return Identity(f"cpu {platform.node()} {name}|torch {torch.__version__}|lock_clocks {lock_clocks}", name)
    props = torch.cuda.get_device_properties(dev)
    uuid = f"GPU-{props.uuid}"
    driver, clocks = _nvml_state(uuid)
    return Identity(f"{uuid}|driver {driver}, torch {torch.__version__}|{clocks}, lock_clocks {lock_clocks}",
                    props.name)


def _nvml_state(uuid: str) -> tuple[str, str]:
    """The driver version and the GPU's application clocks through NVML ("unknown" without)."""
    driver, clocks = "unknown", "clocks unknown"
    with contextlib.suppress(Exception):   # no NVML binding or driver: the key says so
        pynvml = nvml.init()
        driver = nvml.text(pynvml.nvmlSystemGetDriverVersion())
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        sm = pynvml.nvmlDeviceGetApplicationsClock(handle, pynvml.NVML_CLOCK_SM)
        mem = pynvml.nvmlDeviceGetApplicationsClock(handle, pynvml.NVML_CLOCK_MEM)
        clocks = f"application clocks {sm}/{mem} MHz"
    return driver, clocks


class CeilingsRecorder(Protocol):
    """The recorder calls ceilings are kept through (``service.recorder``)."""

    def ceilings(self, key: str) -> dict[str, Any] | None: ...
    def keep_ceilings(self, job_id: int, key: str, ceilings: dict[str, Any]) -> None: ...
    def event(self, kind: str, message: str, level: str = "info", job_id: int | None = None) -> None: ...


def for_job(rec: CeilingsRecorder, job_id: int, device: str, lock_clocks: str,
            progress: Callable[[str], None]) -> dict[str, Any] | None:
    """The ceilings of the device a job runs on: kept ones when this home measured them under
    the same key, else measured now and kept; None when they cannot be measured (out of memory
    on a busy GPU: no floor, not a failure)."""
    try:
        ident = identity(device, lock_clocks)
        found = rec.ceilings(ident.key)
        if found is not None:
            return found
        progress("measuring this device's ceilings (once per device, driver and clocks)")
        found = measure(device)
    except Exception as exc:
        rec.event("ceilings.failed", one_line(exc), level="warning",
                  job_id=job_id)
        return None
    rec.keep_ceilings(job_id, ident.key, found)
    rec.event("ceilings.measured", f"{describe(found)} ({ident.key})", job_id=job_id)
    return found
