"""Capture of a reference: what it computes (FLOPs), the least it must move (bytes), and on a
GPU what eager PyTorch launches to do it (kernel names, counts, durations).

These are the yardsticks a port is measured against: FLOPs and bytes give the speed-of-light
floor once the GPU's ceilings are known, and the launch records show what a fused template
saves (eager's separate kernels). The reference runs in this process, at the sizes its sidecar
sets for the device; callers are the worker, which is trusted with the reference.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from kernelabd.harness.problem import load_problem

CPU_NOTE = "launch records need CUDA (torch.profiler kernel events); none on CPU"


def load_reference(source: str, constants: dict[str, Any] | None = None,
                   ) -> tuple[ModuleType, torch.nn.Module, list[Any]]:
    """Execute a reference as a fresh module, override its size constants, and build its model
    (from a fixed seed, so repeated loads agree) and example inputs."""
    module = ModuleType("kernelab_reference")
    exec(compile(source, "<reference>", "exec"), module.__dict__)
    for name, value in (constants or {}).items():
        setattr(module, name, value)
    torch.manual_seed(0)
    model = module.Model(*module.get_init_inputs())
    return module, model, list(module.get_inputs())


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _tensors(v)]
    return []


def _nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def main_dtype(tensors: list[torch.Tensor]) -> str | None:
    """The dtype of the largest floating input: it decides which matrix rate bounds the job."""
    floating = [t for t in tensors if t.is_floating_point()]
    return str(max(floating, key=lambda t: t.numel()).dtype) if floating else None


def _launches(model: torch.nn.Module, inputs: list[Any]) -> list[dict[str, Any]]:
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
    sizes = {"inputs": _nbytes(_tensors(inputs)), "parameters": _nbytes(state),
             "outputs": _nbytes(_tensors(outputs))}
    return {"flops": int(counter.get_total_flops()), "min_bytes": sum(sizes.values()),
            "bytes": sizes, "dtype": main_dtype(_tensors(inputs))}


def capture_reference(reference_path: str | Path, device: str) -> dict[str, Any]:
    """FLOPs, minimum bytes moved and (CUDA only) launch records of one eager forward."""
    problem = load_problem(reference_path)
    constants = problem.sidecar.constants_for(device)
    _, model, inputs = load_reference(problem.source, constants)
    model = model.to(device)
    inputs = [t.to(device) if isinstance(t, torch.Tensor) else t for t in inputs]
    on_cuda = device.startswith("cuda")
    return {"device": device, "sizes": constants, **work_of(model, inputs),
            "launches": _launches(model, inputs) if on_cuda else [],
            "note": None if on_cuda else CPU_NOTE}
