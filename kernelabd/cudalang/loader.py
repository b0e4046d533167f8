"""The CUDA C++ loader a candidate carries: compile with NVRTC, cache on disk, launch on torch's
current stream.

This module imports only the standard library, torch and cuda-python, because its text is
emitted verbatim into every CUDA candidate (``emit``): a ``best.py`` must run for a user who has
torch and cuda-python and not kernelab. kernelab's own fingerprinting compiles through the
same ``program_options``, so a fingerprint describes the code a candidate runs.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
from pathlib import Path
from typing import Any

import torch

CACHE_ENV = "KERNELAB_CUDA_CACHE"


class CompileError(RuntimeError):
    """NVRTC rejected the source; ``log`` is the compiler's whole output."""

    kernelab_rule = "compile"    # the gate reports this as a failure of rule ``compile``

    def __init__(self, log: str) -> None:
        super().__init__(f"NVRTC could not compile the CUDA source:\n{log.strip()}")
        self.log = log


def program_options(arch: str, defines: dict[str, Any]) -> Any:
    """NVRTC options for ``arch`` (``sm_90``): line info for profilers, C++17, and each
    tunable as a macro of the same name, so that a tuner's edit reaches the kernel."""
    from cuda.core import ProgramOptions

    macros = [(k, str(v)) for k, v in sorted(defines.items())]
    return ProgramOptions(arch=arch, lineinfo=True, std="c++17", define_macro=macros or None)


def cache_dir() -> Path:
    """Compiled code lives under ``$KERNELAB_CUDA_CACHE``, else the user's cache directory."""
    base = os.environ.get(CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kernelab", "cuda")
    return Path(base)


def cache_key(source: str, options: Any, arch: str) -> str:
    """Source, options, architecture, NVRTC and driver: any change compiles afresh."""
    from cuda.bindings import driver, nvrtc

    _, major, minor = nvrtc.nvrtcVersion()
    try:
        _, drv = driver.cuDriverGetVersion()
    except Exception:  # no driver on this machine (compiling only): nothing can load it here
        drv = "none"
    text = "\0".join([source, repr(options.as_bytes("nvrtc")), arch, f"{major}.{minor}", str(drv)])
    return hashlib.sha256(text.encode()).hexdigest()


def compile_cubin(source: str, arch: str, defines: dict[str, Any]) -> bytes:
    """``source`` compiled for ``arch``, from the disk cache when it was compiled before."""
    from cuda.core import Program

    options = program_options(arch, defines)
    path = cache_dir() / f"{cache_key(source, options, arch)}.cubin"
    if path.is_file():
        return path.read_bytes()
    try:
        cubin = bytes(Program(source, "c++", options=options).compile("cubin").code)
    except Exception as exc:
        if type(exc).__name__ != "NVRTCError":
            raise
        raise CompileError(str(exc).partition("compilation log:")[2] or str(exc)) from None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_bytes(cubin)
        partial.replace(path)
    except OSError:   # a read-only cache only costs the next process a compile
        pass
    return cubin


def kernel_args(args: tuple[Any, ...]) -> list[Any]:
    """Tensors pass their device address (a 64-bit value), Python ints a 32-bit int, floats a
    32-bit float; ctypes values pass as they are (``ctypes.c_int64`` for a 64-bit stride)."""
    out: list[Any] = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(ctypes.c_uint64(a.data_ptr()))
        elif isinstance(a, bool):
            out.append(ctypes.c_bool(a))
        elif isinstance(a, int):
            out.append(ctypes.c_int32(a))
        elif isinstance(a, float):
            out.append(ctypes.c_float(a))
        else:
            out.append(a)
    return out


class CudaProgram:
    """One CUDA C++ source and its macro values, compiled once per device architecture."""

    def __init__(self, source: str, defines: dict[str, Any] | None = None) -> None:
        self.source = source
        self.defines = dict(defines or {})
        self._kernels: dict[tuple[int, str], Any] = {}

    def kernel(self, name: str, device: torch.device) -> Any:
        """The ``extern "C"`` kernel ``name``, loaded in the device's (torch's) context."""
        from cuda.core import Device, ObjectCode

        index = device.index if device.index is not None else torch.cuda.current_device()
        found = self._kernels.get((index, name))
        if found is None:
            Device(index).set_current()
            major, minor = torch.cuda.get_device_capability(index)
            cubin = compile_cubin(self.source, f"sm_{major}{minor}", self.defines)
            found = ObjectCode.from_cubin(cubin).get_kernel(name)
            self._kernels[(index, name)] = found
        return found

    def launch(self, name: str, grid: tuple[int, ...], block: tuple[int, ...], *args: Any,
               shared_bytes: int = 0) -> None:
        """Launch ``name`` on torch's current stream, so it is ordered with torch's work and
        captured by CUDA graphs like any torch kernel."""
        from cuda.core import LaunchConfig, launch

        device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cuda"))
        if device.type != "cuda":
            raise RuntimeError(f"CUDA kernel {name} needs CUDA tensors, got a {device.type} tensor")
        kernel = self.kernel(name, device)
        config = LaunchConfig(grid=grid, block=block, shmem_size=shared_bytes)
        launch(torch.cuda.current_stream(device), config, kernel, *kernel_args(args))
