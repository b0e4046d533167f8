"""Max and average pooling over 1-3 spatial axes (``nn.MaxPool{1,2,3}d``, ``nn.AvgPool{1,2,3}d``
and their ``F.`` forms), as a direct window reduction.

Like the direct convolution (``depthwise``), each program owns ``BLOCK`` consecutive output
pixels of one plane ``(n, c)``; the window's taps are compile-time constants and unroll, each a
masked load of the shifted input pixels (padding and borders as masks: ``-inf`` for a maximum,
zero for a sum), accumulated in fp32. An average divides by the window's size, or with
``count_include_pad=False`` by its taps inside the input. The geometry is the module's, read at
trace time (kernel sizes must be constants to unroll). A maximum's ``ceil_mode`` only adds a
last window that overhangs the input (its outside taps are masked like padding); an average's,
``return_indices`` and a ``divisor_override`` are not ported (the matcher declines them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kernelabd.propose.templates import common
from kernelabd.propose.templates.conv import AXES, indent, unflatten

TUNE_VALUES = {"BLOCK": [128, 256, 512, 1024, 2048], "num_warps": [1, 2, 4, 8]}
SM90_STARTS: dict[str, list[dict[str, int]]] = {
    "any": [{"BLOCK": 512, "num_warps": 4}, {"BLOCK": 256, "num_warps": 2}, {"BLOCK": 1024, "num_warps": 8}],
}
"""Four output pixels a thread at the seed, as the direct convolution's; not yet measured on a
GPU. Each dict sets every tunable."""


@dataclass(frozen=True)
class Pool:
    kind: str                      # max | avg
    x: str                         # the pooled tensor's forward expression
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    count_include_pad: bool = True
    ceil_mode: bool = False

    @property
    def dims(self) -> int:
        return len(self.kernel)


def kernel(op: Pool) -> str:
    axes = AXES[op.dims]
    inner = list(reversed(axes))
    out_sizes = [f"O{a.upper()}" for a in inner]
    rows = unflatten("pix", [f"o{a}" for a in inner], out_sizes, last=True)
    lines, mask, depth = [], "pix_ok", 1
    for a, k, s, p, d in zip(axes, op.kernel, op.stride, op.padding, op.dilation, strict=True):
        pad = "    " * depth
        lines += [f"{pad}for k{a} in tl.static_range({k}):",
                  f"{pad}    in_{a} = o{a} * {s} - {p} + k{a} * {d}",
                  f"{pad}    m_{a} = {mask} & (in_{a} >= 0) & (in_{a} < {a.upper()})"]
        mask, depth = f"m_{a}", depth + 1
    pad = "    " * depth
    offset = " + ".join(f"in_{a} * sx{a}" for a in axes)
    if op.kind == "max":
        lines += [f"{pad}v = tl.load(x_c + {offset}, mask={mask}, other=-float('inf')).to(tl.float32)",
                  f"{pad}acc = tl.maximum(acc, v)"]
        start, finish = "tl.full((BLOCK,), -float('inf'), tl.float32)", "acc"
    else:
        lines += [f"{pad}acc += tl.load(x_c + {offset}, mask={mask}, other=0.0).to(tl.float32)",
                  f"{pad}cnt += {mask}.to(tl.float32)"]
        start = "tl.zeros((BLOCK,), dtype=tl.float32)"
        finish = f"acc / {float(math.prod(op.kernel))!r}" if op.count_include_pad else "acc / tl.maximum(cnt, 1.0)"
    sizes = ", ".join(f"{a.upper()}, O{a.upper()}, sx{a}" for a in axes)
    return f"""

@triton.jit
def {op.kind}_pool{op.dims}d_kernel(x_ptr, y_ptr, {sizes}, BLOCK: tl.constexpr):
    plane = tl.program_id(0)
    pix = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    pix_ok = pix < {" * ".join(out_sizes)}
{indent(rows, 4)}    x_c = x_ptr + plane.to(tl.int64) * ({" * ".join(a.upper() for a in axes)})
    acc = {start}
    cnt = tl.zeros((BLOCK,), dtype=tl.float32)
{indent(lines, 0)}    out = plane.to(tl.int64) * ({" * ".join(out_sizes)}) + pix
    tl.store(y_ptr + out, {finish}, mask=pix_ok)
"""


def forward(op: Pool, signature: str) -> str:
    """The launch, with the output sizes PyTorch's pooling computes."""
    n = op.dims
    sizes = ", ".join(f"_pooled(_in[{i}], {k}, {s}, {p}, {d}, {op.ceil_mode})"
                      for i, (k, s, p, d) in enumerate(zip(op.kernel, op.stride, op.padding, op.dilation, strict=True)))
    args = ", ".join(f"_in[{i}], _out[{i}], _st[{i}]" for i in range(n))
    return f"""
def forward(self, {signature}):
    _x = {op.x}.contiguous()
    _in = _x.shape[-{n}:]
    _out = ({sizes},)
    _st = _x.stride()[-{n}:]
    _planes = _x.numel() // max(1, math.prod(_in))
    _y = torch.empty((*_x.shape[:-{n}], *_out), device=_x.device, dtype=_x.dtype)
    _grid = (_planes, triton.cdiv(math.prod(_out), BLOCK))
    {op.kind}_pool{n}d_kernel[_grid](_x, _y, {args}, BLOCK=BLOCK, num_warps=num_warps)
    return _y
"""


POOLED = '''

def _pooled(size: int, kernel: int, stride: int, padding: int, dilation: int, ceil: bool) -> int:
    """An output side as PyTorch's pooling sizes it: with ``ceil``, a last window that starts
    inside the input (or its left padding) and overhangs its end."""
    span = size + 2 * padding - dilation * (kernel - 1) - 1
    out = (-(-span // stride) if ceil else span // stride) + 1
    return out - 1 if ceil and (out - 1) * stride >= size + padding else out
'''


def render(op: Pool, signature: str, imports: list[str], init: str) -> tuple[str, str]:
    window = "×".join(map(str, op.kernel))
    what = f"{op.kind} pool {op.dims}-D, window {window}, stride {'×'.join(map(str, op.stride))}" \
        + (", ceil mode" if op.ceil_mode else "")
    source = (common.header(f"Template: {what}, a direct window reduction in fp32.", imports)
              + common.tunables(TUNE_VALUES, SM90_STARTS["any"][0]) + f"STARTS = {SM90_STARTS['any']!r}\n"
              + POOLED + kernel(op) + common.model_class(init, forward(op, signature)))
    return source, f"template: {what} (direct, one kernel)"
