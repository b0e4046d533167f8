"""sum / mean / max over one dim: one program per output tile, looping over the reduced extent.

The input is viewed as ``(outer, R, inner)``. A program owns one ``outer`` index and
``BLOCK_I`` neighbouring ``inner`` columns and walks ``R`` in ``BLOCK_R`` chunks, so a
reduction over the last dim (``inner == 1``) reads rows and one over a middle dim reads
contiguous column blocks — no transposing copy either way, and any ``R`` fits.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernelabd.propose.templates import common

INIT = {"sum": "tl.zeros([BLOCK_I], dtype=tl.float32)", "mean": "tl.zeros([BLOCK_I], dtype=tl.float32)",
        "max": "tl.full([BLOCK_I], -float('inf'), tl.float32)"}
OTHER = {"sum": "0.0", "mean": "0.0", "max": "-float('inf')"}
STEP = {"sum": "acc += tl.sum(x, axis=0)", "mean": "acc += tl.sum(x, axis=0)",
        "max": "acc = tl.maximum(acc, tl.max(x, axis=0))"}


@dataclass
class Reduction:
    kind: str          # sum | mean | max
    arg: str           # forward argument reduced
    dim: int
    keepdim: bool
    inner: bool        # inner > 1 at the traced size: BLOCK_INNER matters


def kernel(op: Reduction) -> str:
    lines = [
        "i = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)",
        "base = tl.program_id(0).to(tl.int64) * R * inner",
        f"acc = {INIT[op.kind]}",
        "for r0 in range(0, R, BLOCK_R):",
        "    r = r0 + tl.arange(0, BLOCK_R)[:, None]",
        "    mask = (r < R) & (i[None, :] < inner)",
        f"    x = tl.load(x_ptr + base + r * inner + i[None, :], mask=mask, other={OTHER[op.kind]})"
        ".to(tl.float32)",
        f"    {STEP[op.kind]}",
    ]
    if op.kind == "mean":
        lines.append("acc = acc / R")
    lines.append("tl.store(out_ptr + tl.program_id(0).to(tl.int64) * inner + i, acc, "
                 "mask=i < inner)")
    body = "\n".join(f"    {line}" for line in lines)
    return (f"\n\n@triton.jit\ndef {op.kind}_kernel(out_ptr, x_ptr, R, inner, "
            f"BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr):\n{body}\n")


def forward(op: Reduction, signature: str) -> str:
    kept = "(1,) + " if op.keepdim else ""
    return f'''
def forward(self, {signature}):
    x = {op.arg}.contiguous()
    dim = {op.dim} % x.dim()
    outer, R, inner = math.prod(x.shape[:dim]), x.shape[dim], math.prod(x.shape[dim + 1:])
    out = torch.empty(x.shape[:dim] + {kept}x.shape[dim + 1:], device=x.device, dtype=x.dtype)
    block_i = min(triton.next_power_of_2(inner), BLOCK_INNER)
    block_r = max(1, min(triton.next_power_of_2(R), TILE // block_i))
    grid = (outer, triton.cdiv(inner, block_i))
    {op.kind}_kernel[grid](out, x, R, inner, BLOCK_R=block_r, BLOCK_I=block_i,
                           num_warps=num_warps)
    return out
'''


def render(op: Reduction, signature: str, imports: list[str], init: str) -> tuple[str, str]:
    values = {"TILE": [512, 1024, 2048, 4096, 8192], "BLOCK_INNER": [16, 32, 64, 128, 256],
              "num_warps": [1, 2, 4, 8]}
    fixed = ""
    if not op.inner:
        values.pop("BLOCK_INNER")
        fixed = "BLOCK_INNER = 1\n"
    source = (common.header(f"Template: {op.kind} over dim {op.dim} in one kernel, fp32 "
                            "accumulation.", imports)
              + common.tunables(values, {"TILE": 2048, "BLOCK_INNER": 64, "num_warps": 4})
              + fixed + kernel(op) + common.model_class(init, forward(op, signature)))
    return source, f"template: {op.kind} over dim {op.dim} (one kernel)"
