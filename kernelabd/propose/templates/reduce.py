"""sum / mean / max over one dim, in one pass over the input at any shape.

The input is viewed as ``(outer, R, inner)``, as the row kernels view it (``rowwise``): a
*column* is one reduced slice, an outer row when ``inner == 1`` (``R`` contiguous elements),
else an ``(outer, inner)`` position (neighbouring columns contiguous). A program owns
``BLOCK_C`` neighbouring columns — several whole rows when rows are narrow, a coalesced run of
an ``inner`` block otherwise — and walks ``R`` in ``BLOCK_R`` steps with ``STAGES`` steps' loads
in flight, accumulating elementwise into a ``BLOCK_R × BLOCK_C`` tile that is reduced once at
the end (no cross-thread reduction in the loop). No transposing copy, any ``R``.

When the columns are too few to give every SM a program (a sum over a long leading dim, a
reduction to a handful of values), ``R`` is split across programs (``SPLIT``): each writes a
partial per column and a second kernel combines the partials in a fixed order, so the result
does not depend on timing.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernelabd.propose.templates import common, rowwise

OTHER = {"sum": "0.0", "mean": "0.0", "max": "-float('inf')"}
STEP = {"sum": "acc = acc + x", "mean": "acc = acc + x", "max": "acc = tl.maximum(acc, x)"}
FINISH = {"sum": "tl.sum(acc, axis=0)", "mean": "tl.sum(acc, axis=0)", "max": "tl.max(acc, axis=0)"}
SCALE = {"sum": "", "mean": " / R", "max": ""}

TUNE_VALUES = {"TILE": [512, 1024, 2048, 4096, 8192], "BLOCK_INNER": [16, 32, 64, 128, 256],
               "num_warps": [1, 2, 4, 8], "STAGES": [1, 2, 3], "SPLIT": [0, 1, 2, 4, 8, 16, 32]}
"""``TILE``: elements a program loads a step; ``BLOCK_INNER``: the widest run of contiguous
columns a tile takes when ``inner > 1``; ``SPLIT``: programs a column's ``R`` is split over
(0: chosen at run time, 1: none)."""
SEED = {"TILE": 2048, "BLOCK_INNER": 64, "num_warps": 4, "STAGES": 1, "SPLIT": 0}
SM90_STARTS: dict[str, list[dict[str, int]]] = {
    "any": [SEED, {**SEED, "STAGES": 2}, {**SEED, "TILE": 4096, "num_warps": 8},
            {**SEED, "BLOCK_INNER": 128, "TILE": 4096}],
}
"""Known-good starting configurations on sm_90 (accumulation is fp32 whatever the dtype), best
first; the first is the seed: the sum seed ran the port benchmark's sum at 84 % of the copy rate,
where 1024- or 4096-element tiles, 2 or 8 warps and 32- to 256-column blocks were all slower
(bench/port/README.md). Each dict sets every tunable."""


@dataclass
class Reduction:
    kind: str          # sum | mean | max
    arg: str           # forward argument reduced
    dim: int
    keepdim: bool
    inner: bool        # inner > 1 at the traced size (strided columns; the launch decides again)


def kernel(op: Reduction) -> str:
    lines = [
        "blk = tl.program_id(0)",
        "col_blocks = tl.cdiv(cols, BLOCK_C)",
        "c = (blk % col_blocks) * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]",
        "base = (blk // col_blocks).to(tl.int64) * s_slab + c.to(tl.int64) * s_col",
        "r_lo = tl.program_id(1) * r_split",
        "r_hi = tl.minimum(R, r_lo + r_split)",
        f"acc = tl.full((BLOCK_R, BLOCK_C), {OTHER[op.kind]}, tl.float32)",
        "for r0 in tl.range(r_lo, r_hi, BLOCK_R, num_stages=STAGES):",
        "    r = r0 + tl.arange(0, BLOCK_R)[:, None]",
        "    mask = (r < r_hi) & (c < cols)",
        f"    x = tl.load(x_ptr + base + r.to(tl.int64) * s_r, mask=mask, other={OTHER[op.kind]})",
        "    x = x.to(tl.float32)",
        f"    {STEP[op.kind]}",
        f"res = {FINISH[op.kind]}",
        "cc = (blk % col_blocks) * BLOCK_C + tl.arange(0, BLOCK_C)",
        "out_offs = (blk // col_blocks).to(tl.int64) * cols + cc",
        "if SPLIT > 1:",
        "    tl.store(ws_ptr + tl.program_id(1).to(tl.int64) * slabs * cols + out_offs, res, mask=cc < cols)",
        "else:",
        f"    tl.store(out_ptr + out_offs, res{SCALE[op.kind]}, mask=cc < cols)",
    ]
    pad = " " * (len(op.kind) + 12)
    return (f"\n\n@triton.jit\ndef {op.kind}_kernel(out_ptr, ws_ptr, x_ptr, slabs, cols, R, s_slab, s_col, s_r,\n"
            f"{pad}r_split, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, STAGES: tl.constexpr,\n"
            f"{pad}SPLIT: tl.constexpr):\n" + "".join(f"    {line}\n" for line in lines))


COMBINE_BLOCK = 1024
"""Outputs a program of the split combine kernel finishes."""


def combine_kernel(op: Reduction) -> str:
    """The partials of a split reduction, combined split by split in a fixed order."""
    step = "acc = tl.maximum(acc, p)" if op.kind == "max" else "acc = acc + p"
    lines = ["o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)",
             "mask = o < n",
             f"acc = tl.full((BLOCK,), {OTHER[op.kind]}, tl.float32)",
             "for s in range(SPLIT):",
             "    p = tl.load(ws_ptr + s * n + o, mask=mask, other=0.0)",
             f"    {step}",
             f"tl.store(out_ptr + o, acc{SCALE[op.kind]}, mask=mask)"]
    return ("\n\n@triton.jit\ndef combine_kernel(out_ptr, ws_ptr, n, R, SPLIT: tl.constexpr, BLOCK: tl.constexpr):\n"
            + "".join(f"    {line}\n" for line in lines))


def forward(op: Reduction, signature: str) -> str:
    kept = "(1,) + " if op.keepdim else ""
    return f'''
def forward(self, {signature}):
    x = {op.arg}.contiguous()
    dim = {op.dim} % x.dim()
    out = torch.empty(x.shape[:dim] + {kept}x.shape[dim + 1:], device=x.device, dtype=x.dtype)
    slabs, cols, R, *strides = _geometry(x, dim, dim + 1)
    if strides[2] == 1:      # rows: a tile is whole rows, as many as TILE holds
        block_r = min(triton.next_power_of_2(R), TILE)
        block_c = max(1, min(triton.next_power_of_2(cols), TILE // block_r))
    else:
        block_c = min(triton.next_power_of_2(cols), BLOCK_INNER)
        block_r = max(1, min(triton.next_power_of_2(R), TILE // block_c))
    blocks = slabs * triton.cdiv(cols, block_c)
    split = _split(blocks, triton.cdiv(R, block_r), _sms(x))
    r_split = triton.cdiv(triton.cdiv(R, split), block_r) * block_r
    split = triton.cdiv(R, r_split)
    ws = torch.empty((split, slabs * cols), device=x.device, dtype=torch.float32) if split > 1 else out
    {op.kind}_kernel[(blocks, split)](out, ws, x, slabs, cols, R, *strides, r_split, BLOCK_R=block_r,
                          BLOCK_C=block_c, STAGES=STAGES, SPLIT=split, num_warps=num_warps)
    if split > 1:
        n = slabs * cols
        combine_kernel[(triton.cdiv(n, {COMBINE_BLOCK}),)](out, ws, n, R, SPLIT=split, BLOCK={COMBINE_BLOCK})
    return out
'''


SPLIT_HELPER = '''

def _split(blocks: int, steps: int, sms: int) -> int:
    """Programs each column's ``R`` is split over: ``SPLIT`` when set, else enough to give every
    SM two programs when the columns alone do not, keeping at least 8 steps a program."""
    if SPLIT:
        return max(1, min(SPLIT, steps))
    if blocks >= 2 * sms:
        return 1
    return max(1, min(triton.cdiv(2 * sms, blocks), steps // 8))
'''


def render(op: Reduction, signature: str, imports: list[str], init: str) -> tuple[str, str]:
    source = (common.header(f"Template: {op.kind} over dim {op.dim} in one pass, fp32 accumulation "
                            f"({'strided columns' if op.inner else 'rows'}; R split across programs "
                            "when the outputs are few).", imports)
              + common.tunables(TUNE_VALUES, SEED) + f"STARTS = {SM90_STARTS['any']!r}\n"
              + common.SMS_HELPER + rowwise.GEOMETRY_HELPER + SPLIT_HELPER + kernel(op) + combine_kernel(op)
              + common.model_class(init, forward(op, signature)))
    return source, f"template: {op.kind} over dim {op.dim} (one kernel)"
