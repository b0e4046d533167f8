"""sum / mean / max / min / logsumexp over one dim, a run of neighbouring dims (``mean(x, (2,
3))``, a global pool) or all of them, of an input or of an elementwise prologue
(``mean((a - b) ** 2)``, computed as the slices are loaded), in one pass at any shape.

The input is viewed as ``(outer, R, inner)``, as the row kernels view it (``rowwise``): a
*column* is one reduced slice, an outer row when ``inner == 1`` (``R`` contiguous elements),
else an ``(outer, inner)`` position (neighbouring columns contiguous). A program owns
``BLOCK_C`` neighbouring columns — several whole rows when rows are narrow, a coalesced run of
an ``inner`` block otherwise — and walks ``R`` in ``BLOCK_R`` steps with ``STAGES`` steps' loads
in flight, accumulating elementwise into a ``BLOCK_R × BLOCK_C`` tile that is reduced once at
the end (no cross-thread reduction in the loop). No transposing copy, any ``R``.

When the columns are too few to fill the SMs (a sum over a long leading dim, a reduction to a
handful of values), ``R`` is split across programs (``SPLIT``), as many as the SMs hold at once:
each writes a partial per column and a second kernel combines the partials in a fixed order, so
the result does not depend on timing. A reduction over all dims is one column of every element,
split so. (Two programs an SM, the split before, left KernelBench L1 #37's sum of squares at
2.2 TB/s on an H100, 0.71× the rate of torch.compile's split reduction.)
"""

from __future__ import annotations

from dataclasses import dataclass

from kernelabd.propose.templates import common, rowwise

OTHER = {"sum": "0.0", "mean": "0.0", "max": "-float('inf')", "min": "float('inf')", "logsumexp": "-float('inf')"}
LSE_STEP = ["m_new = tl.maximum(acc, x)",
            "keep = tl.where(m_new == -float('inf'), 0.0, tl.exp(acc - m_new))",
            "acc_s = acc_s * keep + tl.where(m_new == -float('inf'), 0.0, tl.exp(x - m_new))",
            "acc = m_new"]
"""An online logsumexp per accumulator element: the running maximum ``acc`` and the sum of
``exp(x − acc)`` rescaled whenever the maximum grows (an all-``-inf`` run stays zero, not NaN)."""
STEP = {"sum": ["acc = acc + x"], "mean": ["acc = acc + x"], "max": ["acc = tl.maximum(acc, x)"],
        "min": ["acc = tl.minimum(acc, x)"], "logsumexp": LSE_STEP}
FINISH = {"sum": ["res = tl.sum(acc, axis=0)"], "mean": ["res = tl.sum(acc, axis=0)"],
          "max": ["res = tl.max(acc, axis=0)"], "min": ["res = tl.min(acc, axis=0)"],
          "logsumexp": ["top = tl.max(acc, axis=0)",
                        "part = tl.where(acc == -float('inf'), 0.0, tl.exp(acc - top[None, :]))",
                        "res = top + tl.log(tl.sum(acc_s * part, axis=0))"]}
SCALE = {"sum": "", "mean": " / R", "max": "", "min": "", "logsumexp": ""}

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
    kind: str          # sum | mean | max | min | logsumexp
    arg: str           # forward argument reduced (with a prologue: the tensor whose device and dtype the result takes)
    dim: int | None    # None: every dim
    keepdim: bool
    inner: bool        # inner > 1 at the traced size (strided columns; the launch decides again)
    prologue: common.Chain | None = None   # elementwise ops whose result is reduced
    span: int = 1      # neighbouring dims reduced, from ``dim`` on


def _load(op: Reduction) -> list[str]:
    """The step's values into ``x``: a load of the input, or its prologue's operands loaded at the
    element's flat index and its ops, the reduction's identity where ``mask`` is off."""
    if op.prologue is None:
        return [f"x = tl.load(x_ptr + base + r.to(tl.int64) * s_r, mask=mask, other={OTHER[op.kind]})",
                "x = x.to(tl.float32)"]
    chain = op.prologue
    return ["idx = base + r.to(tl.int64) * s_r", *chain.loads("idx", "mask"), *chain.lines,
            f"x = tl.where(mask, {chain.result}, {OTHER[op.kind]})"]


def kernel(op: Reduction) -> str:
    lines = [
        "blk = tl.program_id(0)",
        "col_blocks = tl.cdiv(cols, BLOCK_C)",
        "c = (blk % col_blocks) * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]",
        "base = (blk // col_blocks).to(tl.int64) * s_slab + c.to(tl.int64) * s_col",
        "r_lo = tl.program_id(1) * r_split",
        "r_hi = tl.minimum(R, r_lo + r_split)",
        f"acc = tl.full((BLOCK_R, BLOCK_C), {OTHER[op.kind]}, tl.float32)",
        "acc_s = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)",
        "for r0 in tl.range(r_lo, r_hi, BLOCK_R, num_stages=STAGES):",
        "    r = r0 + tl.arange(0, BLOCK_R)[:, None]",
        "    mask = (r < r_hi) & (c < cols)",
        *(f"    {line}" for line in _load(op)),
        *(f"    {line}" for line in STEP[op.kind]),
        *FINISH[op.kind],
        "cc = (blk % col_blocks) * BLOCK_C + tl.arange(0, BLOCK_C)",
        "out_offs = (blk // col_blocks).to(tl.int64) * cols + cc",
        "if SPLIT > 1:",
        "    tl.store(ws_ptr + tl.program_id(1).to(tl.int64) * slabs * cols + out_offs, res, mask=cc < cols)",
        "else:",
        f"    tl.store(out_ptr + out_offs, res{SCALE[op.kind]}, mask=cc < cols)",
    ]
    pad = " " * (len(op.kind) + 12)
    x_ptr, operands = ("", op.prologue.kernel_args()) if op.prologue else ("x_ptr, ", "")
    return (f"\n\n@triton.jit\ndef {op.kind}_kernel(out_ptr, ws_ptr, {x_ptr}slabs, cols, R, s_slab, s_col, s_r,\n"
            f"{pad}r_split{operands}, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, STAGES: tl.constexpr,\n"
            f"{pad}SPLIT: tl.constexpr):\n" + "".join(f"    {line}\n" for line in lines))


RESIDENT_WARPS = 64
"""Warps an SM holds at once (2048 threads on sm_80 and sm_90)."""
SPLIT_BELOW = 8
"""``R`` is split when the columns alone fill less than this fraction (1/8) of the SMs'
resident programs: at 4 warps a program, fewer than two programs an SM."""

COMBINE_TILE = 1024
"""Partials a program of the split combine kernel holds at once: ``BLOCK`` outputs by
``S_BLOCK`` splits, so that a reduction to one value reads its partials in a few wide loads
rather than one after another."""


def combine_kernel(op: Reduction) -> str:
    """The partials of a split reduction, combined as the main kernel combines elements (the
    same step into an ``S_BLOCK × BLOCK`` tile, reduced once at the end: a logsumexp's partials
    are logsumexps of its pieces, combined by one more online logsumexp), in a fixed order."""
    lines = ["o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)[None, :]",
             f"acc = tl.full((S_BLOCK, BLOCK), {OTHER[op.kind]}, tl.float32)",
             "acc_s = tl.zeros((S_BLOCK, BLOCK), dtype=tl.float32)",
             "for s0 in range(0, SPLIT, S_BLOCK):",
             "    s = s0 + tl.arange(0, S_BLOCK)[:, None]",
             f"    x = tl.load(ws_ptr + s * n + o, mask=(s < SPLIT) & (o < n), other={OTHER[op.kind]})",
             *(f"    {line}" for line in STEP[op.kind]),
             *FINISH[op.kind],
             "o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)",
             f"tl.store(out_ptr + o, res{SCALE[op.kind]}, mask=o < n)"]
    return ("\n\n@triton.jit\ndef combine_kernel(out_ptr, ws_ptr, n, R, SPLIT: tl.constexpr, BLOCK: tl.constexpr,\n"
            "                   S_BLOCK: tl.constexpr):\n" + "".join(f"    {line}\n" for line in lines))


def forward(op: Reduction, signature: str) -> str:
    if op.prologue is None:
        setup, x, operands = f"    x = {op.arg}.contiguous()\n    shape = x.shape\n", "x, ", ""
    else:   # the kernel computes the elements from the operands; only their shape is needed here
        tensors = ", ".join(f"{t}.shape" for t in op.prologue.tensors)
        setup, x, operands = f"    shape = torch.broadcast_shapes({tensors})\n", "", op.prologue.call_args("shape")
    if op.dim is None:
        span = "    first, end = 0, len(shape)\n"
        kept = "(1,) * len(shape)" if op.keepdim else "()"
    else:
        span = f"    first = {op.dim} % len(shape)\n    end = first + {op.span}\n"
        kept = f"shape[:first] + (1,) * {op.span} + shape[end:]" if op.keepdim else "shape[:first] + shape[end:]"
    return f'''
def forward(self, {signature}):
{setup}{span}    out = torch.empty({kept}, device={op.arg}.device, dtype={op.arg}.dtype)
    slabs, cols, R, *strides = _geometry(torch.empty(shape, device="meta"), first, end)
    if strides[2] == 1:      # rows: a tile is whole rows, as many as TILE holds
        block_r = min(triton.next_power_of_2(R), TILE)
        block_c = max(1, min(triton.next_power_of_2(cols), TILE // block_r))
    else:
        block_c = min(triton.next_power_of_2(cols), BLOCK_INNER)
        block_r = max(1, min(triton.next_power_of_2(R), TILE // block_c))
    blocks = slabs * triton.cdiv(cols, block_c)
    split = _split(blocks, triton.cdiv(R, block_r), _sms({op.arg}) * {RESIDENT_WARPS} // num_warps)
    r_split = triton.cdiv(triton.cdiv(R, split), block_r) * block_r
    split = triton.cdiv(R, r_split)
    ws = torch.empty((split, slabs * cols), device={op.arg}.device, dtype=torch.float32) if split > 1 else out
    {op.kind}_kernel[(blocks, split)](out, ws, {x}slabs, cols, R, *strides, r_split{operands}, BLOCK_R=block_r,
                          BLOCK_C=block_c, STAGES=STAGES, SPLIT=split, num_warps=num_warps)
    if split > 1:
        n = slabs * cols
        block = min(triton.next_power_of_2(n), {COMBINE_TILE})
        combine_kernel[(triton.cdiv(n, block),)](out, ws, n, R, SPLIT=split, BLOCK=block,
                                                 S_BLOCK=min(triton.next_power_of_2(split), {COMBINE_TILE} // block))
    return out
'''


SPLIT_HELPER = f'''

def _split(blocks: int, steps: int, resident: int) -> int:
    """Programs each column's ``R`` is split over: ``SPLIT`` when set; else, when the columns
    alone give the GPU's SMs fewer than a few programs each, enough to fill every SM with as many
    as it holds at once (``resident`` programs), keeping at least 8 steps a program: a
    streaming reduction needs every warp an SM can hold to keep enough loads in flight."""
    if SPLIT:
        return max(1, min(SPLIT, steps))
    if blocks * {SPLIT_BELOW} >= resident:
        return 1
    return max(1, min(triton.cdiv(resident, blocks), steps // 8))
'''


def render(op: Reduction, signature: str, imports: list[str], init: str,
           ops: tuple[str, ...] = ()) -> tuple[str, str]:
    """(candidate source, one-line edit description); ``ops`` names the prologue's ops."""
    over = "every dim" if op.dim is None else f"dim {op.dim}" if op.span == 1 else \
        f"dims {op.dim}-{op.dim + op.span - 1}"
    source = (common.header(f"Template: {op.kind} over {over} in one pass, fp32 accumulation "
                            f"({'strided columns' if op.inner else 'rows'}; R split across programs "
                            "when the outputs are few).", imports)
              + common.tunables(TUNE_VALUES, SEED) + f"STARTS = {SM90_STARTS['any']!r}\n"
              + common.SMS_HELPER + (common.OPERAND_HELPER if op.prologue else "") + rowwise.GEOMETRY_HELPER
              + SPLIT_HELPER + kernel(op) + combine_kernel(op) + common.model_class(init, forward(op, signature)))
    of = f" of an elementwise prologue ({', '.join(ops)})" if op.prologue else ""
    return source, f"template: {op.kind} over {over}{of} (one kernel)"
