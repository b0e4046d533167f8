"""2-D convolution as an implicit GEMM with a fused epilogue.

The convolution is a matrix product that is never materialised: ``M = N·OH·OW`` output pixels,
``N = C_out`` output channels, ``K = C_in·KH·KW``. Each program owns a ``BLOCK_M × BLOCK_N``
tile of that product; its K loop gathers the input values a tile needs straight from the NCHW
input (``(n, oh, ow)`` from the row, ``(ci, kh, kw)`` from the column; the zero padding and the
borders are load masks, so no padded copy or im2col buffer exists), loads the matching weight
tile, and accumulates in fp32 through ``_dot``. The conv bias and the elementwise epilogue run
on the accumulator before the only store, into ``out[n, co, oh, ow]``.

Epilogue operands that broadcast only along the output channels (a ``(C_out, 1, 1)`` bias, the
shape KernelBench's conv problems use) are read as one vector per column tile at
``co · stride``: the flat-index scheme of ``_operand`` would need them expanded into a full copy
first, since they are not a trailing block of the NCHW output. Every other operand goes through
``_operand`` with the output's flat NCHW index.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kernelabd.propose.templates import common

TUNE_VALUES = {"BLOCK_M": [32, 64, 128], "BLOCK_N": [16, 32, 64, 128], "BLOCK_K": [16, 32, 64],
               "num_warps": [4, 8], "num_stages": [2, 3, 4], "CHANNELS_LAST": [0, 1]}
TUNE_START = {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 8, "num_stages": 3,
              "CHANNELS_LAST": 1}
"""8 warps, so that the tile does not spill; ``CHANNELS_LAST``: input and weight are copied
channels-last first, so that a K run is ``C_in`` contiguous floats rather than a gather across
planes (figures: bench/port/README.md, "Template seeds")."""
SM90_STARTS: dict[str, list[dict[str, int]]] = {
    "any": [TUNE_START, {**TUNE_START, "BLOCK_K": 64}, {**TUNE_START, "BLOCK_N": 128, "num_stages": 2}],
}
"""Known-good starting configurations on sm_90, the seed first (the tuner's accepted step on the
H200, BLOCK_M 128, is in it), then the neighbours its port tried next. Each dict sets every
tunable."""
RESOURCES = {"smem": [["BLOCK_M", "BLOCK_K"], ["BLOCK_K", "BLOCK_N"]], "acc": [["BLOCK_M", "BLOCK_N"]],
             "regs": [["BLOCK_M", "BLOCK_K"]]}
"""Per stage, a gathered input tile and a weight tile, as in the matmul template; the gathered
tile's addresses and masks are computed per element and held in registers (``regs``)."""

GEOMETRY_HELPER = '''

def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


def _geometry(x: torch.Tensor, w: torch.Tensor, stride, padding, dilation) -> tuple[int, ...]:
    """The kernel's size arguments (NB, C, H, W, C_out, OH, OW, KH, KW, stride, top/left padding
    and dilation per axis), as ``F.conv2d`` computes them: "same" pads the extra row/column at
    the bottom/right, which the kernel's border masks give for free."""
    (sh, sw), (dh, dw) = _pair(stride), _pair(dilation)
    nb, c, h, wd = x.shape
    n, _, kh, kw = w.shape
    if padding == "same":
        ph, pw, oh, ow = dh * (kh - 1) // 2, dw * (kw - 1) // 2, h, wd
    else:
        ph, pw = (0, 0) if padding == "valid" else _pair(padding)
        oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
        ow = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    return nb, c, h, wd, n, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw
'''


@dataclass
class Conv:
    """``conv2d(x, weight, bias, stride, padding, dilation)`` (groups 1, zero padding) plus an
    epilogue. ``stride``/``padding``/``dilation`` are forward-side expressions (the module's own
    attributes, so a constructor argument follows the instance); ``channel`` holds, per epilogue
    tensor, whether it broadcasts only along the output channels (read per column)."""

    x: str
    weight: str
    bias: str | None
    stride: str
    padding: str
    dilation: str
    epilogue: common.Chain      # ``acc`` is the convolution (with its bias); ``result`` is stored
    precision: str              # "ieee", "tf32" or "tf32x3"
    channel: list[bool] = field(default_factory=list)


def _kernel_args(op: Conv) -> str:
    args = [f"t{i}_ptr, t{i}_s" if ch else f"t{i}_ptr, t{i}_n" for i, ch in enumerate(op.channel)]
    args += [f"s{i}" for i in range(len(op.epilogue.scalars))]
    return "".join(f", {a}" for a in args)


def _loads(op: Conv) -> str:
    lines = []
    for i, ch in enumerate(op.channel):
        if ch:      # one value per output channel: a (1, BLOCK_N) row broadcast over the pixels
            lines.append(f"t{i} = tl.load(t{i}_ptr + rn[None, :] * t{i}_s, mask=rn[None, :] < N, "
                         f"other=0.0).to(tl.float32)")
        else:
            lines.append(f"t{i} = tl.load(t{i}_ptr + out_idx % t{i}_n, mask=cmask, other=0.0)"
                         f".to(tl.float32)")
    return "".join(f"    {line}\n" for line in lines)


def _call_args(op: Conv) -> str:
    args = [f"{t}, {t}.stride(-3)" if ch else f"*_operand({t}, _y.shape)"
            for t, ch in zip(op.epilogue.tensors, op.channel, strict=True)]
    args += [f"float({s})" for s in op.epilogue.scalars]
    return "".join(f", {a}" for a in args)


def kernel(op: Conv) -> str:
    lines = "".join(f"    {line}\n" for line in op.epilogue.lines)
    return f'''

@triton.jit
def conv2d_kernel(x_ptr, w_ptr, b_ptr, y_ptr, sxn, sxc, sxh, sxw, swo, swc, swh, sww, sbn,
                  NB, C, H, W, N, OH, OW, KH, KW, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w{_kernel_args(op)},
                  HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, CHANNELS_INNER: tl.constexpr):
    # GEMM view: rows are output pixels (n, oh, ow), columns output channels, K is (ci, kh, kw),
    # or (kh, kw, ci) when the operands are channels-last (a K run is then contiguous memory)
    M = NB * OH * OW
    K = C * KH * KW
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    ow = rm % OW
    oh = (rm // OW) % OH
    nb = rm // (OW * OH)
    ih0 = oh * stride_h - pad_h
    iw0 = ow * stride_w - pad_w
    row_ok = rm < M
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        kk = k * BLOCK_K + rk
        if CHANNELS_INNER:
            ci = kk % C
            kw = (kk // C) % KW
            kh = kk // (C * KW)
        else:
            kw = kk % KW
            kh = (kk // KW) % KH
            ci = kk // (KW * KH)
        ih = ih0[:, None] + kh[None, :] * dil_h
        iw = iw0[:, None] + kw[None, :] * dil_w
        # padding and borders are masked loads of zero: no padded copy of the input
        amask = (row_ok[:, None] & (kk[None, :] < K) & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W))
        a = tl.load(x_ptr + nb[:, None] * sxn + ci[None, :] * sxc + ih * sxh + iw * sxw,
                    mask=amask, other=0.0)
        b = tl.load(w_ptr + rn[None, :] * swo + ci[:, None] * swc + kh[:, None] * swh + kw[:, None] * sww,
                    mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += _dot(a, b, "{op.precision}")
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn[None, :] * sbn, mask=rn[None, :] < N, other=0.0).to(tl.float32)
    cmask = row_ok[:, None] & (rn[None, :] < N)
    # NCHW: out[n, co, oh, ow] at (n * N + co) * OH * OW + oh * OW + ow
    out_idx = (nb[:, None] * N + rn[None, :]) * (OH * OW) + (oh * OW + ow)[:, None]
{_loads(op)}{lines}    tl.store(y_ptr + out_idx, {op.epilogue.result or "acc"}, mask=cmask)
'''


def forward(op: Conv, signature: str) -> str:
    """The launch; its locals are underscored so that no forward argument (a residual called
    ``y``, say) is shadowed before the epilogue operands are passed."""
    bias = op.bias or "_y"      # any tensor; never read without HAS_BIAS
    return f'''
def forward(self, {signature}):
    _x, _w = {op.x}, {op.weight}
    if CHANNELS_LAST:
        _x = _x.contiguous(memory_format=torch.channels_last)
        _w = _w.contiguous(memory_format=torch.channels_last)
    _g = _geometry(_x, _w, {op.stride}, {op.padding}, {op.dilation})
    _y = torch.empty((_g[0], _g[4], _g[5], _g[6]), device=_x.device, dtype=_x.dtype)
    _grid = (triton.cdiv(_g[0] * _g[5] * _g[6], BLOCK_M), triton.cdiv(_g[4], BLOCK_N))
    conv2d_kernel[_grid](_x, _w, {bias}, _y, *_x.stride(), *_w.stride(), {bias}.stride(0),
                         *_g{_call_args(op)},
                         HAS_BIAS={op.bias is not None}, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                         BLOCK_K=BLOCK_K, CHANNELS_INNER=bool(CHANNELS_LAST), num_warps=num_warps,
                         num_stages=num_stages)
    return _y
'''


def render(op: Conv, signature: str, imports: list[str], init: str, what: str) -> tuple[str, str]:
    helper = common.OPERAND_HELPER if not all(op.channel) else ""
    source = (common.header(f"Template: conv2d as an implicit GEMM ({what}) with the epilogue fused "
                            f"before the store; {op.precision} dots.", imports)
              + common.tunables(TUNE_VALUES, TUNE_START, common.resources(RESOURCES, op.precision))
              + f"STARTS = {SM90_STARTS['any']!r}\n" + GEOMETRY_HELPER + helper
              + common.DOT_HELPER + kernel(op) + common.model_class(init, forward(op, signature)))
    return source, f"template: conv2d ({what}) as implicit GEMM with fused epilogue"
