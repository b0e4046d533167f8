"""Depthwise-like convolutions (1-, 2- and 3-D) as a direct convolution with a fused epilogue.

A grouped convolution whose groups have one input channel (depthwise, with any channel
multiplier) or one output channel is no matrix product worth a dot: the implicit GEMM of
``conv.py`` would spend a tile of sixteen or more columns on one. It is memory-bound instead:
each output is a few taps of one plane. So each program owns ``BLOCK`` consecutive output pixels
of one output plane ``(n, co)``: for each of its group's input channels and each tap (the
kernel sizes are compile-time constants, so the taps unroll) it loads the shifted input pixels
(padding and borders as load masks, stride and dilation in the index) and one weight, and
accumulates in fp32. The conv bias and the elementwise epilogue run before the only store,
which, like the loads at stride 1, is contiguous along the plane.

Operands that broadcast only along the output channels are one scalar per program (its plane's
channel); every other operand goes through ``_operand`` with the output's flat index.
"""

from __future__ import annotations

from kernelabd.propose.templates import common
from kernelabd.propose.templates.conv import (
    AXES,
    GEOMETRY_HELPER,
    Conv,
    call_args,
    indent,
    kernel_args,
    tap_loops,
    unflatten,
)

TUNE_VALUES = {"BLOCK": [256, 512, 1024, 2048, 4096], "num_warps": [2, 4, 8]}
SM90_STARTS: dict[str, list[dict[str, int]]] = {
    "any": [{"BLOCK": 512, "num_warps": 4}, {"BLOCK": 1024, "num_warps": 8}, {"BLOCK": 1024, "num_warps": 4}],
}
"""The seed first: four pixels a thread, since the unrolled taps keep each one's load in
flight (for sm_90, KernelBench L1 #85's 3 × 7 taps: 123 registers at BLOCK 512, 254 at 1024
with 4 warps, i.e. two programs an SM); then the same a thread over twice the block, and eight
a thread."""


def _params(axes: tuple[str, ...]) -> str:
    """The kernel's size parameters in ``_geometry``'s order, the kernel sizes compile-time
    constants (so the taps unroll)."""
    names = ["{A}", "O{A}", "K{A}: tl.constexpr", "stride_{a}", "pad_{a}", "dil_{a}"]
    return ", ".join(name.format(a=a, A=a.upper()) for name in names for a in axes)


def _loads(op: Conv) -> str:
    lines = [f"t{i} = tl.load(t{i}_ptr + co * t{i}_s).to(tl.float32)" if ch else
             f"t{i} = tl.load(t{i}_ptr + {common.operand_index(i, 'out_idx')}, mask=pix_ok, other=0.0).to(tl.float32)"
             for i, ch in enumerate(op.channel)]
    return indent(lines, 4)


def _taps(axes: tuple[str, ...]) -> str:
    """One unrolled loop a spatial axis, outermost first, each narrowing the mask of the
    pixels whose shifted input is inside the input; the innermost loads and accumulates."""
    lines, mask, depth = tap_loops(axes, "pix_ok", 2)
    pad = "    " * depth
    x_off = " + ".join(f"in_{a} * sx{a}" for a in axes)
    w_off = " + ".join(f"k{a} * sw{a}" for a in axes)
    lines += [f"{pad}xv = tl.load(x_c + {x_off}, mask={mask}, other=0.0)",
              f"{pad}acc += xv.to(tl.float32) * tl.load(w_c + {w_off}).to(tl.float32)"]
    return indent(lines, 0)


def kernel(op: Conv) -> str:
    axes = AXES[op.dims]
    inner = list(reversed(axes))
    out_sizes = [f"O{a.upper()}" for a in inner]
    pixels = " * ".join(out_sizes)
    rows = unflatten("pix", [f"o{a}" for a in inner], out_sizes, last=True)
    starts = [f"in_{a}0 = o{a} * stride_{a} - pad_{a}" for a in axes]
    strides = ", ".join(f"sx{a}" for a in axes)
    wstrides = ", ".join(f"sw{a}" for a in axes)
    body = indent(op.epilogue.lines, 4)
    return f"""

@triton.jit
def depthwise{op.dims}d_kernel(x_ptr, w_ptr, b_ptr, y_ptr, sxn, sxc, {strides}, swo, swc, {wstrides}, sbn,
                     NB, C, N, G, {_params(axes)}{kernel_args(op)},
                     HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    # one output plane (n, co) a program row, BLOCK of its pixels a program; the plane's group g
    # has C input channels and N output channels
    plane = tl.program_id(0)
    nb = plane // (G * N)
    co = plane % (G * N)
    g = co // N
    pix = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    pix_ok = pix < {pixels}
{indent(rows + starts, 4)}    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for ci in range(0, C):
        x_c = x_ptr + nb * sxn + (g * C + ci) * sxc
        w_c = w_ptr + co * swo + ci * swc
{_taps(axes)}    if HAS_BIAS:
        acc += tl.load(b_ptr + co * sbn).to(tl.float32)
    out_idx = plane * ({pixels}) + pix
{_loads(op)}{body}    tl.store(y_ptr + out_idx, {op.epilogue.result or "acc"}, mask=pix_ok)
"""


def forward(op: Conv, signature: str) -> str:
    """The launch; its locals are underscored so that no forward argument is shadowed before the
    epilogue operands are passed. Output planes run along the grid's first axis (up to 2³¹ of
    them), a plane's pixel blocks along its second."""
    bias = op.bias or "_y"      # any tensor; never read without HAS_BIAS
    return f"""
def forward(self, {signature}):
    _x, _w = {op.x}, {op.weight}
    _g = _geometry(_x, _w, {op.stride}, {op.padding}, {op.dilation}, {op.groups})
    _pix = _g[4 + {op.dims}:4 + {2 * op.dims}]
    _y = torch.empty((_g[0], _g[2] * _g[3], *_pix), device=_x.device, dtype=_x.dtype)
    _grid = (_g[0] * _g[2] * _g[3], triton.cdiv(math.prod(_pix), BLOCK))
    depthwise{op.dims}d_kernel[_grid](_x, _w, {bias}, _y, *_x.stride(), *_w.stride(), {bias}.stride(0),
                         *_g{call_args(op)},
                         HAS_BIAS={op.bias is not None}, BLOCK=BLOCK, num_warps=num_warps)
    return _y
"""


def render(op: Conv, signature: str, imports: list[str], init: str, what: str) -> tuple[str, str]:
    helper = common.OPERAND_HELPER if not all(op.channel) else ""
    source = (common.header(f"Template: depthwise-like {op.name} as a direct convolution ({what}) with "
                            "the epilogue fused before the store; fp32 accumulation.", imports)
              + common.tunables(TUNE_VALUES, SM90_STARTS["any"][0])
              + f"STARTS = {SM90_STARTS['any']!r}\n" + GEOMETRY_HELPER + helper
              + kernel(op) + common.model_class(init, forward(op, signature)))
    return source, f"template: depthwise-like {op.name} ({what}) as direct convolution with fused epilogue"
