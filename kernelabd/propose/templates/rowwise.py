"""Softmax, log-softmax, LayerNorm and RMSNorm: one program reads a whole slice into registers,
reduces it and writes the result, so each element crosses memory once each way (eager runs
these as several kernels, or one kernel with an extra pass).

The input is viewed as ``(outer, R, inner)`` with the normalised/reduced extent ``R`` in the
middle, so any ``dim`` works without a transposing copy: a program owns one ``outer`` index and
``BLOCK_I`` neighbouring ``inner`` columns (coalesced when ``inner > 1``; a plain row when
``inner == 1``).
"""

from __future__ import annotations

from dataclasses import dataclass

from kernelabd.propose.templates import common

BODIES: dict[str, list[str]] = {
    "softmax": [
        "x = tl.where(mask, x, -float('inf'))",
        "e = tl.exp(x - tl.max(x, axis=0)[None, :])",
        "y = e / tl.sum(e, axis=0)[None, :]",
    ],
    "log_softmax": [
        "x = tl.where(mask, x, -float('inf'))",
        "z = x - tl.max(x, axis=0)[None, :]",
        "y = z - tl.log(tl.sum(tl.exp(z), axis=0))[None, :]",
    ],
    "layer_norm": [
        "d = tl.where(mask, x - (tl.sum(x, axis=0) / R)[None, :], 0.0)",
        "y = d / tl.sqrt(tl.sum(d * d, axis=0) / R + eps)[None, :]",
    ],
    "rms_norm": [
        "y = x / tl.sqrt(tl.sum(x * x, axis=0) / R + eps)[None, :]",
    ],
}
TILES = [1024, 2048, 4096, 8192]
PER_THREAD = [4, 8, 16, 32]
"""Slice elements each thread holds: the warps follow from the slice's size at run time, so a
16384-wide softmax row gets 32 warps instead of spilling from 4; 64 elements always spilled, so
the tuner is not offered them (figures: bench/port/README.md, "Template seeds")."""
MAX_WARPS = 32
"""Triton's limit (1024 threads); each thread then has at most 64 registers."""
REGISTER_WARPS = 8
"""More than 16 elements a thread only up to this many warps, whose registers hold 32 fp32
elements and their statistics; wider slices fall back to 16 elements a thread, so the seed's 32
serves 4096-wide rows and 16384-wide ones alike (figures: bench/port/README.md, "Template
seeds")."""
PER_SM = [0, 1, 2, 4, 8, 16]
STAGES = [1, 2, 3]
EVICT = [0, 1]
"""A program walks slices ``outer`` apart (``PER_SM`` programs an SM; 0: a program a slice, as
Inductor launches its reductions) with ``STAGES`` slices' loads in flight (Triton's software
pipelining), as Triton's fused-softmax tutorial does; ``EVICT = 1`` marks the input, read once,
first out of L2. What pays depends on the slice, so all are tunable (figures:
bench/port/README.md, "Template seeds")."""
SEED = {"TILE": 4096, "PER_THREAD": 32, "PER_SM": 16, "STAGES": 1, "EVICT": 0}
TITLES = {"softmax": "softmax", "log_softmax": "log-softmax", "layer_norm": "LayerNorm",
          "rms_norm": "RMSNorm"}


@dataclass
class Rowwise:
    """One recognised row operation and how the forward reaches its operands."""

    kind: str                   # a key of BODIES
    arg: str                    # forward argument normalised
    first_dim: str              # expression: first dim of R
    end_dim: str                # expression: one past the last dim of R
    eps: str | None = None      # expression for eps (norms)
    weight: str | None = None   # expression for the scale
    bias: str | None = None     # expression for the shift
    inner: bool = False         # inner > 1 at the traced size: BLOCK_I matters, tune TILE


def kernel(op: Rowwise) -> str:
    args = "out_ptr, x_ptr, outer, R, inner"
    args += ", w_ptr" if op.weight else ""
    args += ", b_ptr" if op.bias else ""
    args += ", eps" if op.eps else ""
    head = [
        "r = tl.arange(0, BLOCK_R)[:, None]",
        "i = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)[None, :]",
        "mask = (r < R) & (i < inner)",
    ]
    if op.weight:
        head.append("w = tl.load(w_ptr + r, mask=r < R, other=0.0).to(tl.float32)")
    if op.bias:
        head.append("b = tl.load(b_ptr + r, mask=r < R, other=0.0).to(tl.float32)")
    loop = [
        "offs = tl.cast(o, tl.int64) * R * inner + r * inner + i",
        "if EVICT_FIRST:",
        "    x = tl.load(x_ptr + offs, mask=mask, other=0.0, eviction_policy='evict_first').to(tl.float32)",
        "else:",
        "    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)",
        *BODIES[op.kind],
        *(["y = y * w"] if op.weight else []),
        *(["y = y + b"] if op.bias else []),
        "tl.store(out_ptr + offs, y, mask=mask)",
    ]
    body = "\n".join(f"    {line}" for line in head)
    body += "\n    for o in tl.range(tl.program_id(0), outer, tl.num_programs(0), num_stages=STAGES):\n"
    body += "\n".join(f"        {line}" for line in loop)
    return (f"\n\n@triton.jit\ndef {op.kind}_kernel({args}, BLOCK_R: tl.constexpr, "
            f"BLOCK_I: tl.constexpr, STAGES: tl.constexpr, EVICT_FIRST: tl.constexpr):\n{body}\n")


def forward(op: Rowwise, signature: str, name: str = "forward", per_thread: str = "PER_THREAD",
            per_sm: str = "PER_SM", stages: str = "STAGES", evict: str = "EVICT") -> str:
    """The method launching the kernel; a composed template names it and its tunables."""
    extra = "".join(f", {e}" for e in (op.weight, op.bias, op.eps) if e)
    return f'''
def {name}(self, {signature}):
    x = {op.arg}.contiguous()
    first, end = {op.first_dim}, {op.end_dim}
    outer, R, inner = (math.prod(x.shape[:first]), math.prod(x.shape[first:end]),
                       math.prod(x.shape[end:]))
    out = torch.empty_like(x)
    block_r = triton.next_power_of_2(R)
    block_i = max(1, min(triton.next_power_of_2(inner), TILE // block_r))
    per_thread = {per_thread} if block_r * block_i <= 32 * {REGISTER_WARPS} * {per_thread} else min({per_thread}, 16)
    warps = min({MAX_WARPS}, triton.next_power_of_2(triton.cdiv(block_r * block_i, 32 * per_thread)))
    columns = triton.cdiv(inner, block_i)
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else outer
    programs = triton.cdiv({per_sm} * sms, columns) if {per_sm} else outer
    grid = (max(1, min(outer, programs)), columns)
    {op.kind}_kernel[grid](out, x, outer, R, inner{extra}, BLOCK_R=block_r, BLOCK_I=block_i,
                           STAGES={stages}, EVICT_FIRST={evict} == 1, num_warps=warps)
    return out
'''


def render(op: Rowwise, signature: str, imports: list[str], init: str) -> tuple[str, str]:
    """(candidate source, one-line edit description)."""
    title = TITLES[op.kind]
    values = {"TILE": TILES, "PER_THREAD": PER_THREAD, "STAGES": STAGES, "PER_SM": PER_SM, "EVICT": EVICT}
    if not op.inner:
        values.pop("TILE")
    source = (common.header(f"Template: {title} over one extent in a single pass (whole slice in "
                            "registers, fp32 statistics), persistent programs.", imports)
              + common.tunables(values, SEED)
              + ("" if op.inner else "TILE = 4096\n")
              + kernel(op) + common.model_class(init, forward(op, signature)))
    return source, f"template: {title} (fused, one pass)"
