"""Whether a compiled kernel fits a Hopper-class SM (H100/H200, sm_90): what ptxas made of it
(registers, stack, shared memory) against the limits past which it runs badly or not at all.

Screening drops a configuration that does not fit before timing it, and ``bench/port/sm90.py``
reports the same verdicts for the port seeds; both read ptxas's figures from the cubin Triton
built (``cuobjdump --dump-resource-usage``), which needs no GPU.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REGISTERS_PER_SM = 65536
MAX_REGISTERS = 255
SMEM_PER_PROGRAM = 232_448
"""Shared memory one program may use on Hopper (sm_90: 227 KiB); more fails to launch."""
LOCAL_BYTES_LIMIT = 64
"""Stack a thread may use before it counts against a kernel: a few values parked outside the
hot loop are harmless (the fp32 matmul's 8 B under Triton 3.9; the 3xTF32 128×128×64 seed's
16 B at 255 registers, which ran 15 % faster on the H200 than the 128×128×32 tile that spills
nothing), a whole array in local memory is not (Triton 3.8 put 3976 B of a 256-element softmax
row there at 32 registers; 128×128×32 3xTF32 at 4 warps spilled 616–968 B)."""


@dataclass(frozen=True)
class Usage:
    """ptxas's account of one compiled kernel."""

    registers: int
    stack_bytes: int        # per thread, in local memory: spills, or values parked outside
                            # the hot loop with registers to spare (the fp32 matmul's 8 B)
    smem_bytes: int         # dynamic shared memory per program
    num_warps: int

    @property
    def register_cap(self) -> int:
        """Registers a thread may use at this many warps: ptxas spills beyond it."""
        return min(MAX_REGISTERS, REGISTERS_PER_SM // (32 * self.num_warps) // 8 * 8)

    @property
    def spills(self) -> bool:
        return self.stack_bytes >= LOCAL_BYTES_LIMIT

    @property
    def too_big(self) -> bool:
        """More shared memory or registers than one SM has: it cannot launch."""
        return self.smem_bytes > SMEM_PER_PROGRAM or self.registers * 32 * self.num_warps > REGISTERS_PER_SM

    @property
    def problems(self) -> list[str]:
        """Why this kernel would run badly or not at all on an H100/H200; [] when it fits."""
        found = []
        if self.spills:
            found.append(f"spills under register pressure ({self.stack_bytes} B stack a thread)"
                         if self.registers >= self.register_cap else
                         f"keeps {self.stack_bytes} B a thread in local memory")
        if self.smem_bytes > SMEM_PER_PROGRAM:
            found.append(f"shared memory {self.smem_bytes} B > {SMEM_PER_PROGRAM} B")
        if self.registers * 32 * self.num_warps > REGISTERS_PER_SM:
            found.append(f"{self.registers} registers × {32 * self.num_warps} threads > one SM's")
        return found


def resource_usage(cubin: bytes) -> dict[str, int]:
    """REG/STACK/SHARED/LOCAL of the one function in ``cubin``, as cuobjdump prints them."""
    from kernelabd.fingerprint import sass

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        (usage,) = sass.resource_usage(Path(f.name)).values()
    if "REG" not in usage:
        raise RuntimeError("cuobjdump printed no resource usage")
    return usage


def usage_of(kernel: Any) -> Usage:
    """The usage of one kernel Triton compiled (its cubin and metadata)."""
    found = resource_usage(kernel.asm["cubin"])
    return Usage(found["REG"], found.get("STACK", 0) + found.get("LOCAL", 0), kernel.metadata.shared,
                 kernel.metadata.num_warps)
