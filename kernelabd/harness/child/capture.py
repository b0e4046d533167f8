"""Capture of a reference, inside its sandbox: what it computes (FLOPs), the least it must move
(bytes), and on a GPU what eager PyTorch launches to do it (kernel names, counts, durations).

These are the yardsticks a port is measured against: FLOPs and bytes give the speed-of-light
floor once the GPU's ceilings are known, and the launch records show what a fused template
saves. It runs on the reference sandbox's own model and one of its timing sets, under the
gate's deadline like every other piece of reference code.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

CPU_NOTE = "launch records need CUDA (torch.profiler kernel events); none on CPU"


def tensors_in(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for v in value for t in tensors_in(v)]
    return []


def nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def main_dtype(tensors: list[torch.Tensor]) -> str | None:
    """The dtype of the largest floating input: it decides which matrix rate bounds the job."""
    floating = [t for t in tensors if t.is_floating_point()]
    return str(max(floating, key=lambda t: t.numel()).dtype) if floating else None


def launches(model: torch.nn.Module, inputs: list[Any]) -> list[dict[str, Any]]:
    """CUDA kernels one eager forward launches, by name: count and total device time."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        model(*inputs)                     # warm-up: lazy init and cuBLAS handles stay out
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            model(*inputs)
            torch.cuda.synchronize()
    records = []
    for evt in prof.key_averages():
        device_us = getattr(evt, "device_time_total", None) or getattr(evt, "cuda_time_total", 0)
        if evt.device_type == torch.autograd.DeviceType.CUDA or device_us:
            records.append({"name": evt.key, "count": int(evt.count),
                            "device_us": round(float(device_us), 3)})
    return sorted(records, key=lambda r: -r["device_us"])


def work_of(model: torch.nn.Module, inputs: list[Any]) -> dict[str, Any]:
    """FLOPs of one forward (matrix products, convolutions, attention: what the flop counter
    counts), the least bytes it must move (inputs, parameters and buffers, outputs), and the
    dtype that picks the matrix rate."""
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        outputs = model(*inputs)
    state = list(model.parameters()) + list(model.buffers())
    sizes = {"inputs": nbytes(tensors_in(inputs)), "parameters": nbytes(state),
             "outputs": nbytes(tensors_in(outputs))}
    return {"flops": int(counter.get_total_flops()), "min_bytes": sum(sizes.values()),
            "bytes": sizes, "dtype": main_dtype(tensors_in(inputs))}


def capture(model: torch.nn.Module, inputs: list[Any], device: str, sizes: dict[str, Any]) -> dict[str, Any]:
    """FLOPs, minimum bytes moved and (CUDA only) launch records of one eager forward."""
    on_cuda = device.startswith("cuda")
    return {"device": device, "sizes": sizes, **work_of(model, inputs),
            "launches": launches(model, inputs) if on_cuda else [],
            "note": None if on_cuda else CPU_NOTE}
