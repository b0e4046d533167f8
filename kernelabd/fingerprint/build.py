"""Compile a candidate file for a named architecture without a GPU, and fingerprint its kernels.

The candidate's module is imported and, when its reference is known, its ``ModelNew`` is run
once on CPU tensors at the reference's GPU sizes (``[sizes.cuda]``) with every launch replaced
by a compile: Triton kernels compile for a stand-in driver's target, CUDA C++ programs with
NVRTC through the loader's own options. Nothing runs on a device and the outputs are garbage.
This runs the file's code in this process, as ``python FILE`` would: a developer's tool for
their own files, not a gate for untrusted code (the daemon fingerprints in its sandboxes).
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

from kernelabd.cudalang.loader import CompileError, CudaProgram, program_options
from kernelabd.fingerprint import KernelPrint
from kernelabd.fingerprint.sass import fingerprints, ptxas_report
from kernelabd.harness.problem import one_line

ARCH = re.compile(r"sm_(\d+)a?")


class FingerprintError(RuntimeError):
    """The file cannot be fingerprinted; the message is one line naming the file and why."""


def capability(arch: str) -> int:
    """``sm_90`` → 90; anything else is a usage error."""
    match = ARCH.fullmatch(arch)
    if match is None:
        raise FingerprintError(f"--arch {arch!r}: expected sm_NN, e.g. sm_90")
    return int(match.group(1))


def reference_for(candidate: Path) -> Path | None:
    """``NAME.new.py``'s reference is ``NAME.py`` beside it."""
    if candidate.name.endswith(".new.py"):
        ref = candidate.with_name(candidate.name[:-len(".new.py")] + ".py")
        return ref if ref.is_file() else None
    return None


def import_file(path: Path) -> ModuleType:
    """Import ``path`` under a fresh module name (Triton reads a kernel's source from its file)."""
    name = f"kernelab_fp_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise FingerprintError(f"{path}: cannot import")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def reference_at_gpu_sizes(reference: Path) -> tuple[ModuleType, list[Any]]:
    """The reference module with its ``[sizes.cuda]`` constants set, and its inputs there."""
    from kernelabd.harness.problem import load_problem

    constants = load_problem(reference).sidecar.constants_for("cuda")
    module = import_file(reference)
    for key, value in constants.items():
        setattr(module, key, value)
    return module, list(module.get_inputs())


def compile_cuda(program: Any, arch: str) -> tuple[bytes, str, str]:
    """(cubin, PTX, compiler log with ptxas's report) of one CUDA program for ``arch``; NVRTC
    needs no GPU.

    The options are the loader's own (``program_options``), so this is the code the candidate
    runs; ``ptxas -v`` only adds its report to the log. A source NVRTC rejects raises the
    loader's ``CompileError`` with the log."""
    from cuda.bindings import nvrtc

    options = [*program_options(arch, program.defines).as_bytes("nvrtc"), b"--ptxas-options=-v"]
    _, prog = nvrtc.nvrtcCreateProgram(program.source.encode(), b"candidate.cu", 0, [], [])
    try:
        (status,) = nvrtc.nvrtcCompileProgram(prog, len(options), options)
        log = _nvrtc_output(prog, "ProgramLog").decode(errors="replace").rstrip("\0 ")
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CompileError(log)
        return _nvrtc_output(prog, "CUBIN"), _nvrtc_output(prog, "PTX").decode().rstrip("\0"), log
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _nvrtc_output(prog: Any, kind: str) -> bytes:
    from cuda.bindings import nvrtc

    _, size = getattr(nvrtc, f"nvrtcGet{kind}Size")(prog)   # CUBIN, PTX or ProgramLog
    buf = b" " * size
    getattr(nvrtc, f"nvrtcGet{kind}")(prog, buf)
    return buf


def cuda_programs(module: ModuleType) -> list[Any]:
    """The module's CUDA programs: top-level objects of the loader's shape (``source``,
    ``defines``, ``launch``), whichever copy of the loader the file carries."""
    return [v for v in vars(module).values()
            if type(v).__name__ == CudaProgram.__name__ and isinstance(getattr(v, "source", None), str)
            and isinstance(getattr(v, "defines", None), dict) and callable(getattr(v, "launch", None))]


@contextmanager
def recorded_launches(module: ModuleType) -> Iterator[dict[str, dict[str, Any]]]:
    """While active, a launch through any of the module's CUDA programs records its grid,
    block and dynamic shared memory instead of running."""
    found: dict[str, dict[str, Any]] = {}
    classes = {type(p) for p in cuda_programs(module)}
    saved = {cls: cls.launch for cls in classes}

    def record(self: Any, name: str, grid: Any, block: Any, *args: Any, shared_bytes: int = 0) -> None:
        found[name] = {"grid": list(grid), "block": list(block), "dynamic_shared_bytes": shared_bytes}

    for cls in classes:
        cls.launch = record
    try:
        yield found
    finally:
        for cls, launch in saved.items():
            cls.launch = launch


class TritonCompileOnly:
    """While active, a Triton launch compiles for the stand-in driver's target and returns
    without running; the compiled kernels and their grids are kept in launch order."""

    def __init__(self) -> None:
        from triton.runtime.jit import JITFunction

        self.kernels: list[tuple[Any, Any]] = []
        self._cls = JITFunction
        self._run = JITFunction.run

    def __enter__(self) -> TritonCompileOnly:
        original, kernels = self._run, self.kernels

        def compile_only(fn: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
            kernel = original(fn, *args, grid=grid, warmup=True, **kwargs)
            kernels.append((kernel, grid))
            return kernel

        self._cls.run = compile_only
        return self

    def __exit__(self, *exc: object) -> None:
        self._cls.run = self._run


def use_target(arch: str) -> None:
    """Make Triton compile for ``arch`` with no GPU present."""
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    from kernelabd.propose.inductor.codegen import use_stand_in_driver

    use_stand_in_driver()
    driver.active.get_current_target = lambda: GPUTarget("cuda", capability(arch), 32)


def _grid(grid: Any) -> list[int] | None:
    if isinstance(grid, tuple | list) and all(isinstance(g, int) for g in grid):
        return list(grid)
    return None


def triton_prints(compiled: list[tuple[Any, Any]], arch: str) -> list[KernelPrint]:
    """Fingerprints of the Triton kernels one forward compiled (a kernel launched twice with
    the same specialisation counts once)."""
    found: dict[str, KernelPrint] = {}
    for kernel, grid in compiled:
        meta = kernel.metadata
        launch = {meta.name: {"grid": _grid(grid), "block": [32 * meta.num_warps, 1, 1],
                              "num_warps": meta.num_warps, "num_stages": meta.num_stages,
                              "dynamic_shared_bytes": meta.shared}}
        ptx = kernel.asm["ptx"]
        for k in fingerprints(kernel.asm["cubin"], ptx, ptxas_report(ptx), arch, launch,
                              {meta.name: meta.shared}):
            found.setdefault(f"{k.name}:{kernel.hash}", k)
    return list(found.values())


def cuda_prints(module: ModuleType, launches: dict[str, dict[str, Any]], arch: str) -> list[KernelPrint]:
    """Fingerprints of every kernel of the module's CUDA programs."""
    kernels = []
    for program in cuda_programs(module):
        cubin, ptx, log = compile_cuda(program, arch)
        dynamic = {n: int(v.get("dynamic_shared_bytes", 0)) for n, v in launches.items()}
        kernels += fingerprints(cubin, ptx, log, arch, launches, dynamic)
    return kernels


def fingerprint_file(path: Path, arch: str = "sm_90", reference: Path | None = None) -> list[KernelPrint]:
    """The kernels ``path`` compiles for ``arch``: every CUDA program it defines, and every
    Triton kernel its forward launches at the reference's GPU sizes."""
    import torch

    capability(arch)
    if not path.is_file():
        raise FingerprintError(f"{path}: no such file")
    os.environ.pop("TRITON_INTERPRET", None)   # compile for the GPU, never interpret
    reference = reference or reference_for(path)
    use_target(arch)
    try:
        module = import_file(path)
    except Exception as exc:
        raise FingerprintError(f"{path}: importing it failed: {one_line(exc)}") from exc
    launches: dict[str, dict[str, Any]] = {}
    compiled: list[tuple[Any, Any]] = []
    if reference is not None and hasattr(module, "ModelNew"):
        try:
            ref, inputs = reference_at_gpu_sizes(reference)
        except Exception as exc:
            raise FingerprintError(f"{reference}: building it failed: {one_line(exc)}") from exc
        try:
            model = module.ModelNew(*ref.get_init_inputs())
            with torch.no_grad(), recorded_launches(module) as launches, TritonCompileOnly() as triton_run:
                model(*inputs)
        except Exception as exc:   # a Triton kernel that does not compile, a forward that raises
            raise FingerprintError(f"{path}: compiling its forward failed: {one_line(exc)}") from exc
        compiled = triton_run.kernels
    elif not cuda_programs(module):
        raise FingerprintError(f"{path}: its Triton kernels compile when forward runs, which needs "
                               "the reference (NAME.py beside NAME.new.py, or --reference)")
    kernels = cuda_prints(module, launches, arch) + triton_prints(compiled, arch)
    if not kernels:
        raise FingerprintError(f"{path}: compiled no kernel (no CUDA program, no Triton launch)")
    return kernels
