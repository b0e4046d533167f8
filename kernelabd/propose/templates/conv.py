"""Convolutions (1-, 2- and 3-D, grouped, transposed) as an implicit GEMM with a fused epilogue.

The convolution is a matrix product that is never materialised: ``M = N·OH·OW`` output pixels,
``N = C_out`` output channels, ``K = C_in·KH·KW``. Each program owns a ``BLOCK_M × BLOCK_N``
tile of that product; its K loop gathers the input values a tile needs straight from the NCHW
input (``(n, oh, ow)`` from the row, ``(ci, kh, kw)`` from the column; the zero padding and the
borders are load masks, so no padded copy or im2col buffer exists), loads the matching weight
tile, and accumulates in fp32 through ``_dot``. The conv bias and the elementwise epilogue run
on the accumulator before the only store, into ``out[n, co, oh, ow]``.

Epilogue operands that broadcast only along the output channels (a ``(C_out, 1, 1)`` bias, the
shape KernelBench's conv problems use) are read as one vector per column tile at
``co · stride``, one load a column rather than ``_operand``'s flat index (``k // d % n``) on every
element. Every other operand goes through ``_operand`` with the output's flat NCHW index.

The same kernel is written for 1, 2 or 3 spatial axes. A grouped convolution runs one group a
program column (``program_id(2)``): its K is the group's input channels and taps. A transposed
convolution is decomposed by phase: output ``o`` reads input ``i = (o + p − k·d) / s`` only for
the taps ``k`` that make that exact, and those depend on ``o mod s`` alone (the taps with
``k·d ≡ o + p (mod s)``: a first one ``k0``, then every ``s / gcd(s, d)``-th). So each program
owns output pixels of one phase (``o ≡ ph`` on every axis), its K runs over that phase's taps
only, and ``i`` is ``t + base − j·jump`` for the pixel's ``o = ph + t·s`` and the phase's
``j``-th tap, with no division or stride mask per element. At stride 2 on two axes that is a
quarter of the dots of a gather over every tap.

Over few input channels a group (``FEW_CHANNELS``), and only there, the same kernel has a
second K loop (``DIRECT``, a compile-time switch the tuner flips): the direct convolution, an
outer product of a tap's shifted input pixels and its weights accumulated in fp32 FMAs, the
taps unrolled. The tile, the epilogue and the store are the implicit GEMM's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kernelabd.propose.templates import common

TUNE_VALUES = {"BLOCK_M": [32, 64, 128], "BLOCK_N": [16, 32, 64, 128], "BLOCK_K": [16, 32, 64],
               "num_warps": [4, 8], "num_stages": [2, 3, 4], "CHANNELS_LAST": [0, 1], "DIRECT": [0, 1]}
TUNE_START = {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 8, "num_stages": 3,
              "CHANNELS_LAST": 1, "DIRECT": 0}
"""8 warps, so that the tile does not spill; ``CHANNELS_LAST``: input and weight are copied
channels-last first, so that a K run is ``C_in`` contiguous floats rather than a gather across
planes (figures: bench/port/README.md, "Template seeds"); ``DIRECT``: the K loop as a direct
convolution (``_direct``), declared over few input channels only (``tune_values``)."""
DIRECT_START = {**TUNE_START, "DIRECT": 1, "CHANNELS_LAST": 0, "num_warps": 4}
"""The direct loop over the operands as given, whose pixel loads run along the input rows, at 4
warps: at 8 the 27 unrolled taps of a padded 3×3×3 convolution spilled for sm_90 (Triton 3.6:
255 registers and 116 B of stack; 96 registers and none at 4)."""
SM90_STARTS: dict[str, list[dict[str, int]]] = {
    "any": [TUNE_START, {**TUNE_START, "BLOCK_M": 64, "num_warps": 4, "num_stages": 4},
            {**TUNE_START, "BLOCK_K": 64}, {**TUNE_START, "BLOCK_N": 128, "num_stages": 2}],
    "few": [{**TUNE_START, "BLOCK_K": 16}, DIRECT_START, {**DIRECT_START, "BLOCK_M": 64},
            {**TUNE_START, "BLOCK_K": 16, "BLOCK_M": 64, "num_warps": 4, "num_stages": 4}],
}
"""Known-good starting configurations on sm_90, the seed first (the tuner's accepted step on the
H200, BLOCK_M 128, is in it), then the screened step that three 1-minute H200 ports accepted
first (conv2d, a strided ConvTranspose2d of bench/port and KernelBench L2 #2: 1.08-1.39× the
seed; bench/port/results/2026-12-04-h200-s16-conv), then the neighbours tried next. Over few
input channels (``few``): the seed, then the direct loop (``_direct``) and its neighbours, which
the tuner screens first. Each dict sets every tunable."""


def tune_values(op: Conv) -> dict[str, list[int]]:
    """The tunables a convolution declares: the direct loop only over few input channels
    (``_few``), where a dot's K step is a few taps; elsewhere it would cost the tuner a
    screening slot on a loop of ``C_in`` steps, and a transposed convolution has none."""
    return {k: v for k, v in TUNE_VALUES.items() if k != "DIRECT" or _few(op)}


def starts(op: Conv) -> list[dict[str, int]]:
    """``SM90_STARTS`` for ``op``, over the tunables it declares."""
    names = tune_values(op)
    return [{k: v for k, v in start.items() if k in names} for start in SM90_STARTS["few" if _few(op) else "any"]]


def seed(op: Conv) -> dict[str, int]:
    """The seed for ``op``: a 3-D convolution computes three coordinates and masks for every
    gathered element, and at ``BLOCK_K`` 32 spilled for sm_90 (KernelBench L1 #54 under Triton
    3.8: 255 registers, 64 B of stack; #72, transposed, under 3.6 with the gather over every tap
    that the phase decomposition replaced: 255 and 80 B); at 16 both fit (200 and 217
    registers, no stack). A 1×1 convolution reads its input channels-first: its K run is one
    channel per pixel, already coalesced along the pixels, and the channels-last copies cost
    more than the kernel gains (KernelBench L1 #87 on an H100: 6.30 ms channels-first against
    28.6 ms with the copies, cuDNN 9.18 ms; bench/port/results/2026-12-07-h100-s23). With few
    input channels (``FEW_CHANNELS``) a K step of 16 is two or more whole taps, and the kernel
    ran 1.78× faster than at 32 (KernelBench L2 #92's 3×3 over 8 channels on an H100: 1499 µs
    against 2668; bench/port/results/2026-12-07-h100-s25)."""
    start = {**TUNE_START, "BLOCK_K": 16} if op.dims == 3 or _few(op) else TUNE_START
    start = {**start, "CHANNELS_LAST": 0} if op.taps == 1 else start
    return {k: v for k, v in start.items() if k in tune_values(op)}


def _few(op: Conv) -> bool:
    """Whether ``op`` (not transposed) has few input channels a group (``FEW_CHANNELS``) and
    more than one tap: a K step of 16 is then two or more whole taps, and the tuner tries the
    direct loop first."""
    return 0 < op.group_in <= FEW_CHANNELS and op.taps > 1


FEW_CHANNELS = 8
"""Input channels a group at or below which the seed's K step is 16 (``seed``) and the tuner
starts with the direct loop (``SM90_STARTS["few"]``)."""

PAD_CHANNELS = 4
"""Channels-last copies pad a group's input channels to a multiple of this (zeros in input and
weight, so the sum is unchanged): with ``C`` a compile-time constant and the strides derived
from it, a tap's channels are then one 16-byte aligned vector. Compiled for sm_90, the gather's
copies went from 4 bytes to 16 for KernelBench L1 #54 (3 channels, padded) and L2 #92 (8, which
needed only the constant). Grouped and transposed convolutions are not padded."""

RESOURCES = {"smem": [["BLOCK_M", "BLOCK_K"], ["BLOCK_K", "BLOCK_N"]], "acc": [["BLOCK_M", "BLOCK_N"]],
             "regs": [["BLOCK_M", "BLOCK_K"]]}
"""Per stage, a gathered input tile and a weight tile, as in the matmul template; the gathered
tile's addresses and masks are computed per element and held in registers (``regs``)."""

AXES = {1: ("w",), 2: ("h", "w"), 3: ("d", "h", "w")}
"""Spatial axes by count, outermost first: a 1-D input is ``(N, C, W)``, a 3-D one
``(N, C, D, H, W)``."""

GEOMETRY_HELPER = """

def _tuple(v, n: int) -> tuple[int, ...]:
    return (int(v),) * n if isinstance(v, int) else tuple(int(e) for e in v)


def _geometry(x: torch.Tensor, w: torch.Tensor, stride, padding, dilation, groups: int,
              output_padding=None) -> tuple[int, ...]:
    \"\"\"The kernel's size arguments as ``F.conv*d`` (``output_padding`` given:
    ``F.conv_transpose*d``) computes them: batch, in- and out-channels a group, groups, then per
    spatial axis the input and output sizes, kernel sizes, strides, paddings and dilations (and
    for a transposed one the tap steps ``s / gcd(s, d)`` of its phases).
    "same" pads the extra element at the end of an axis, which the kernel's border masks give
    for free.\"\"\"
    n = x.dim() - 2
    s, d, ks, ins = _tuple(stride, n), _tuple(dilation, n), tuple(w.shape[2:]), tuple(x.shape[2:])
    if output_padding is not None:
        p, op = _tuple(padding, n), _tuple(output_padding, n)
        outs = tuple((i - 1) * st - 2 * pa + di * (k - 1) + o + 1
                     for i, st, pa, di, k, o in zip(ins, s, p, d, ks, op))
        c, cout = w.shape[0] // groups, w.shape[1]
        steps = tuple(st // math.gcd(st, di) for st, di in zip(s, d))
        return (x.shape[0], c, cout, groups, *ins, *outs, *ks, *s, *p, *d, *steps)
    else:
        if padding == "same":
            p, outs = tuple(di * (k - 1) // 2 for di, k in zip(d, ks)), ins
        else:
            p = (0,) * n if padding == "valid" else _tuple(padding, n)
            outs = tuple((i + 2 * pa - di * (k - 1) - 1) // st + 1 for i, st, pa, di, k in zip(ins, s, p, d, ks))
        c, cout = w.shape[1], w.shape[0] // groups
    return (x.shape[0], c, cout, groups, *ins, *outs, *ks, *s, *p, *d)


def _channels_last(t: torch.Tensor, dim: int, pad: int = 1) -> torch.Tensor:
    \"\"\"``t`` with dim ``dim`` innermost in memory (channels-last, for any rank), that dim
    zero-padded to a multiple of ``pad``: a tap's channels are then whole 16-byte vectors.\"\"\"
    order = [i for i in range(t.dim()) if i != dim] + [dim]
    moved, back = t.permute(order), sorted(range(t.dim()), key=order.__getitem__)
    if moved.shape[-1] % pad == 0:
        return moved.contiguous().permute(back)
    padded = moved.new_zeros((*moved.shape[:-1], moved.shape[-1] - moved.shape[-1] % pad + pad))
    padded[..., :moved.shape[-1]].copy_(moved)
    return padded.permute(back)
"""


INSIDE_HELPER = """

def _inside(g: tuple[int, ...], n: int) -> bool:
    \"\"\"Whether every tap of every output pixel reads inside the input (``g`` as
    ``_geometry`` returns it for a convolution): no padding, and the last pixel's last tap
    within each axis. The kernel then needs no border masks.\"\"\"
    ins, outs, ks, strides, pads, dils = (g[4 + j * n:4 + (j + 1) * n] for j in range(6))
    return all(p == 0 and (o - 1) * s + (k - 1) * d < i
               for i, o, k, s, p, d in zip(ins, outs, ks, strides, pads, dils))
"""

ROWS_HELPER = f"""

def _rows(nb: int, p: int, block_m: int) -> tuple[int, int, bool]:
    \"\"\"The grid's row programs, ``RUN`` and ``PER_IMAGE`` for ``nb`` images of ``p`` output
    pixels. A tile's pixels are contiguous in the output, and the store runs along them, only
    where Triton can prove it: ``RUN`` (the power of two dividing ``p``) says so of a flat row
    index; an odd ``p`` has none, so there each program takes one image's pixels instead
    (``PER_IMAGE``), unless that idles more than {common.IDLE_SHARE} of a row for each useful one.\"\"\"
    run, tiles = math.gcd(p, block_m), triton.cdiv(p, block_m)
    per_image = run == 1 and tiles * block_m <= (1 + {common.IDLE_SHARE}) * p
    return (nb * tiles if per_image else triton.cdiv(nb * p, block_m)), run, per_image
"""


@dataclass
class Conv:
    """A convolution (``dims`` spatial axes; ``transposed``: ``conv_transpose*d``, whose
    ``output_padding`` is then set) with zero padding, plus an epilogue. ``stride``,
    ``padding``, ``dilation``, ``groups`` and ``output_padding`` are forward-side expressions
    (the module's own attributes, so a constructor argument follows the instance); ``channel``
    holds, per epilogue tensor, whether it broadcasts only along the output channels (read per
    column)."""

    x: str
    weight: str
    bias: str | None
    stride: str
    padding: str
    dilation: str
    epilogue: common.Chain      # ``acc`` is the convolution (with its bias); ``result`` is stored
    precision: str              # "ieee", "tf32" or "tf32x3"
    channel: list[bool] = field(default_factory=list)
    dims: int = 2
    groups: str = "1"
    transposed: bool = False
    output_padding: str | None = None
    taps: int = 0               # kernel elements per input channel (KH·KW...), 0 when unknown
    group_in: int = 0           # a (non-transposed) convolution's input channels a group, 0 when unknown

    @property
    def name(self) -> str:
        return f"conv{'_transpose' if self.transposed else ''}{self.dims}d"


def kernel_args(op: Conv) -> str:
    """The epilogue operands' kernel parameters (shared with ``depthwise``): an operand read
    per output channel passes its channel stride, any other its length for ``_operand``'s
    flat index."""
    args = [f"t{i}_ptr, t{i}_s" if ch else common.operand_params(i) for i, ch in enumerate(op.channel)]
    args += [f"s{i}" for i in range(len(op.epilogue.scalars))]
    return "".join(f", {a}" for a in args)


def _loads(op: Conv) -> str:
    lines = []
    for i, ch in enumerate(op.channel):
        if ch:      # one value per output channel: a (1, BLOCK_N) row broadcast over the pixels
            lines.append(f"t{i} = tl.load(t{i}_ptr + co[None, :] * t{i}_s, mask=rn[None, :] < N, "
                         f"other=0.0).to(tl.float32)")
        else:
            lines.append(f"t{i} = tl.load(t{i}_ptr + {common.operand_index(i, 'out_idx')}, mask=cmask, other=0.0)"
                         f".to(tl.float32)")
    return "".join(f"    {line}\n" for line in lines)


def call_args(op: Conv) -> str:
    """The launch's arguments for ``kernel_args``' parameters (shared with ``depthwise``)."""
    args = [f"{t}, {t}.stride({-(op.dims + 1)})" if ch else f"*_operand({t}, _y.shape)"
            for t, ch in zip(op.epilogue.tensors, op.channel, strict=True)]
    args += [f"float({s})" for s in op.epilogue.scalars]
    return "".join(f", {a}" for a in args)


def _params(axes: tuple[str, ...], transposed: bool) -> str:
    """The kernel's size parameters, in ``_geometry``'s order (a transposed convolution's tap
    steps last); a convolution's kernel sizes are compile-time constants, so that its direct
    loop unrolls the taps."""
    names = ["{A}", "O{A}", "K{A}" if transposed else "K{A}: tl.constexpr", "stride_{a}", "pad_{a}", "dil_{a}"]
    names += ["step_{a}"] if transposed else []
    return ", ".join(name.format(a=a, A=a.upper()) for name in names for a in axes)


def unflatten(index: str, names: list[str], sizes: list[str], last: bool) -> list[str]:
    """``index`` split into ``names``, innermost first (``sizes`` theirs); the outermost takes
    the rest without a modulo when ``last``."""
    lines, below = [], []
    for i, (name, size) in enumerate(zip(names, sizes, strict=True)):
        div = f"({index} // ({' * '.join(below)}))" if below else index
        outermost = last and i == len(names) - 1
        lines.append(f"{name} = {div}" if outermost else f"{name} = {div} % {size}")
        below.append(size)
    return lines


def _address(op: Conv, axes: tuple[str, ...]) -> tuple[str, str]:
    """The input offset a (row, k) pair reads, as a row part computed once per program and a
    column part computed once per K step (``o·s − p + k·d`` is ``(o·s − p) + k·d`` on every
    axis; a transposed one's ``t + base − j·jump`` likewise), so that an element's address is
    one add instead of a product and sum over every axis."""
    if op.transposed:
        row = " + ".join(f"(t{a} + base_{a}) * sx{a}" for a in axes)
        col = "".join(f" - j{a} * (jump_{a} * sx{a})" for a in axes)
    else:
        row = " + ".join(f"in_{a}0 * sx{a}" for a in axes)
        col = "".join(f" + k{a} * (dil_{a} * sx{a})" for a in axes)
    return f"x_row = nb * sxn + {row}", f"x_col = (g * C + ci) * sxc{col}"


def _borders(op: Conv, axes: tuple[str, ...]) -> list[str]:
    """Per axis, the mask of input coordinates inside the input: padding, borders and (for a
    transposed convolution) a phase's missing taps are load masks, so no padded or dilated copy
    exists. An unpadded convolution whose last tap stays inside needs none (``BORDERS``)."""
    lines = []
    for a in axes:
        if op.transposed:
            lines += [f"k{a} = k0_{a} + j{a} * step_{a}",
                      f"in_{a} = t{a}[:, None] + base_{a} - j{a}[None, :] * jump_{a}",
                      f"amask = amask & (k{a}[None, :] < K{a.upper()}) & (in_{a} >= 0) & (in_{a} < {a.upper()})"]
        else:
            lines += [f"in_{a} = in_{a}0[:, None] + k{a}[None, :] * dil_{a}",
                      f"amask = amask & (in_{a} >= 0) & (in_{a} < {a.upper()})"]
    return lines if op.transposed else ["if BORDERS:", *(f"    {line}" for line in lines)]


def _phase(axes: tuple[str, ...]) -> list[str]:
    """A transposed convolution's program prologue: its phase ``ph`` (``o ≡ ph (mod s)`` on
    every axis, innermost axis fastest), its rows' ``t`` (``o = ph + t·s``), and per axis the
    phase's first tap ``k0`` (``K`` where the phase has none: every tap is then masked), its
    ``T`` taps, and ``base``, ``jump`` such that the ``j``-th tap reads ``i = t + base − j·jump``.
    The phase varies fastest across programs: a tile's pixels are ``s`` apart, so the programs
    that fill the rest of its output sectors (and read the same input) are its neighbours in
    launch order, and the sectors are whole in L2 before they are written back."""
    inner = list(reversed(axes))
    lines = [f"Q{a.upper()} = tl.cdiv(O{a.upper()}, stride_{a})" for a in axes]
    lines += [f"MQ = NB * {' * '.join(f'Q{a.upper()}' for a in inner)}",
              f"phases = {' * '.join(f'stride_{a}' for a in inner)}",
              "phase = tl.program_id(0) % phases",
              "rm = (tl.program_id(0) // phases) * BLOCK_M + tl.arange(0, BLOCK_M)"]
    lines += unflatten("phase", [f"ph_{a}" for a in inner], [f"stride_{a}" for a in inner], last=True)
    lines += unflatten("rm", [f"t{a}" for a in inner] + ["nb"], [f"Q{a.upper()}" for a in inner] + ["NB"], last=True)
    lines += [f"o{a} = ph_{a} + t{a} * stride_{a}" for a in axes]
    lines.append("row_ok = (rm < MQ) & " + " & ".join(f"(o{a} < O{a.upper()})" for a in axes))
    for a in axes:
        lines += [f"k0_{a} = K{a.upper()}", f"for c in range(0, step_{a}):",
                  f"    k0_{a} = tl.where((k0_{a} == K{a.upper()}) "
                  f"& ((ph_{a} + pad_{a} - c * dil_{a}) % stride_{a} == 0), c, k0_{a})",
                  f"base_{a} = (ph_{a} + pad_{a} - k0_{a} * dil_{a}) // stride_{a}",
                  f"jump_{a} = dil_{a} * step_{a} // stride_{a}",
                  f"T{a.upper()} = tl.cdiv(K{a.upper()}, step_{a})"]
    return lines


def _dense_strides(axes: tuple[str, ...]) -> list[str]:
    """A channels-last input's strides, derived from the sizes rather than passed: the forward's
    copy is dense, and derived from the constant ``C`` they tell the compiler that every tap's
    channels start 16-byte aligned (a passed stride of 8 or 12 says nothing; Triton specialises
    only strides divisible by 16)."""
    lines, below = ["if CHANNELS_INNER:", "    sxc = 1"], "G * C"
    for a in reversed(axes):
        lines.append(f"    sx{a} = {below}")
        below = f"{a.upper()} * sx{a}"
    return [*lines, f"    sxn = {below}"]


def tap_loops(axes: tuple[str, ...], mask: str, depth: int, switch: str | None = None) -> tuple[list[str], str, int]:
    """One unrolled loop a spatial axis (shared with ``depthwise``), outermost first, at
    ``depth`` indents, each narrowing ``mask`` to the pixels whose shifted input ``in_{a}`` is
    inside the input (only where the constexpr ``switch`` holds, when one is given): the lines,
    the innermost mask's name and the innermost body's depth."""
    lines = []
    for a in axes:
        pad, inside = "    " * depth, f"{mask} & (in_{a} >= 0) & (in_{a} < {a.upper()})"
        lines += [f"{pad}for k{a} in tl.static_range(K{a.upper()}):", f"{pad}    in_{a} = in_{a}0 + k{a} * dil_{a}"]
        narrow = [f"m_{a} = {inside}"] if switch is None else [
            f"if {switch}:", f"    m_{a} = {inside}", "else:", f"    m_{a} = {mask}"]
        lines += [f"{pad}    {line}" for line in narrow]
        mask, depth = f"m_{a}", depth + 1
    return lines, mask, depth


def _direct(axes: tuple[str, ...]) -> list[str]:
    """The K loop as a direct convolution (``DIRECT``): for each input channel and each tap (the
    kernel sizes are compile-time constants, so the taps unroll), the tile's shifted input
    pixels times the tap's weights of the tile's output channels, an outer product accumulated
    in fp32 FMAs. With few input channels a dot's K step is a few taps, and the implicit GEMM
    still lost to cuDNN's FFMA kernels in its convolution kernel alone (KernelBench L2 #23,
    #73, #83, #92 on an H200: bench/port/results/2026-12-07-h200-s26); here an input pixel is
    loaded once for all of the tile's output channels (for sm_90 Triton hands it to the
    threads of the other channels through shared memory), the loads run along the input
    rows, and the sum is exact fp32. Not yet timed on a GPU: so the tuner screens it, and the
    seed stays the implicit GEMM."""
    loops, mask, depth = tap_loops(axes, "row_ok", 1, "BORDERS")
    pad = "    " * depth
    x_off = " + ".join(f"k{a} * (dil_{a} * sx{a})" for a in axes)
    w_off = " + ".join(f"k{a} * sw{a}" for a in axes)
    return ["for ci in range(0, C):",
            "    x_c = x_ptr + x_row + (g * C + ci) * sxc",
            "    w_c = w_ptr + (g * N + rn) * swo + ci * swc",
            *loops, f"{pad}xv = tl.load(x_c + {x_off}, mask={mask}, other=0.0).to(tl.float32)",
            f"{pad}wv = tl.load(w_c + {w_off}, mask=rn < N, other=0.0).to(tl.float32)",
            f"{pad}acc += xv[:, None] * wv[None, :]"]


def indent(lines: list[str], spaces: int) -> str:
    return "".join(f"{' ' * spaces}{line}\n" for line in lines)


def kernel(op: Conv) -> str:
    axes = AXES[op.dims]
    inner = list(reversed(axes))
    out_sizes = [f"O{a.upper()}" for a in inner]
    tap = "j" if op.transposed else "k"      # a transposed K runs over its phase's taps
    k_sizes = [f"{'T' if op.transposed else 'K'}{a.upper()}" for a in inner]
    if op.transposed:
        rows = _phase(axes)
        pixel = " + ".join(f"o{a}" + "".join(f" * O{b.upper()}" for b in axes[i + 1:]) for i, a in enumerate(axes))
    else:
        rows = [f"P = tl.multiple_of({' * '.join(out_sizes)}, RUN)",
                "if PER_IMAGE:      # one image's pixels a program: contiguous, whatever P is",
                "    tiles = tl.cdiv(P, BLOCK_M)",
                "    pixel = (tl.program_id(0) % tiles) * BLOCK_M + tl.arange(0, BLOCK_M)",
                "    nb = tl.program_id(0) // tiles + tl.zeros((BLOCK_M,), dtype=tl.int32)",
                "    row_ok = pixel < P",
                "else:",
                "    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)",
                "    nb = rm // P",
                "    pixel = rm % P",
                "    row_ok = rm < NB * P"]
        rows += unflatten("pixel", [f"o{a}" for a in inner], out_sizes, last=True)
        rows += [f"in_{a}0 = o{a} * stride_{a} - pad_{a}" for a in axes]
        pixel = "pixel"
    x_row, x_col = _address(op, axes)
    rows.append(x_row)
    k_inner = unflatten("kk", ["ci"] + [f"{tap}{a}" for a in inner], ["C", *k_sizes], last=True)
    k_outer = unflatten("kk", [f"{tap}{a}" for a in inner] + ["ci"], [*k_sizes, "C"], last=True)
    w_off = " + ".join(f"k{a}[:, None] * sw{a}" for a in axes)
    w_co, w_ci = ("rn", "(g * C + ci)") if op.transposed else ("(g * N + rn)", "ci")
    pixels = "P" if not op.transposed else " * ".join(out_sizes)
    w_mask = "".join(f" & (k{a}[:, None] < K{a.upper()})" for a in axes) if op.transposed else ""
    gemm = [
        "for k in range(0, tl.cdiv(K, BLOCK_K)):",
        "    kk = k * BLOCK_K + rk",
        "    if CHANNELS_INNER:", *(f"        {line}" for line in k_inner),
        "    else:", *(f"        {line}" for line in k_outer),
        f"    {x_col}",
        "    amask = row_ok[:, None] & (kk[None, :] < K)",
        *(f"    {line}" for line in _borders(op, axes)),
        "    a = tl.load(x_ptr + x_row[:, None] + x_col[None, :], mask=amask, other=0.0)",
        f"    b = tl.load(w_ptr + {w_co}[None, :] * swo + {w_ci}[:, None] * swc + {w_off},",
        f"                mask=(kk[:, None] < K) & (rn[None, :] < N){w_mask}, other=0.0)",
        f'    acc += _dot(a, b, "{op.precision}")']
    if _few(op):
        gemm = ["if DIRECT:", *(f"    {line}" for line in _direct(axes)), "else:", *(f"    {line}" for line in gemm)]
    loop = indent(gemm, 4)
    body = indent(op.epilogue.lines, 4)
    pixel_names, tap_names = ", ".join(f"o{a}" for a in axes), ", ".join(f"k{a}" for a in axes)
    borders = "" if op.transposed else ", BORDERS: tl.constexpr, RUN: tl.constexpr, PER_IMAGE: tl.constexpr"
    borders += ", DIRECT: tl.constexpr" if _few(op) else ""
    strides = ", ".join([*(f"sx{a}" for a in axes)])
    wstrides = ", ".join([*(f"sw{a}" for a in axes)])
    return f"""

@triton.jit
def {op.name}_kernel(x_ptr, w_ptr, b_ptr, y_ptr, sxn, sxc, {strides}, swo, swc, {wstrides}, sbn,
                  NB, C: tl.constexpr, N, G, {_params(axes, op.transposed)}{kernel_args(op)},
                  HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, CHANNELS_INNER: tl.constexpr{borders}):
    # GEMM view, one group a program column: rows are output pixels (n, {pixel_names}),
    # columns the group's output channels, K its input channels and taps: (ci, {tap_names}),
    # or (k..., ci) when the operands are channels-last (a K run is then contiguous memory)
{indent(_dense_strides(axes), 4)}    g = tl.program_id(2)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
{indent(rows, 4)}    K = C * {" * ".join(k_sizes)}
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
{loop}    co = g * N + rn
    if HAS_BIAS:
        acc += tl.load(b_ptr + co[None, :] * sbn, mask=rn[None, :] < N, other=0.0).to(tl.float32)
    cmask = row_ok[:, None] & (rn[None, :] < N)
    # contiguous N, C, spatial: out[n, co, pixel] at (n * G * N + co) * pixels + pixel
    out_idx = (nb[:, None] * (G * N) + co[None, :]) * ({pixels}) + ({pixel})[:, None]
{_loads(op)}{body}    tl.store(y_ptr + out_idx, {op.epilogue.result or "acc"}, mask=cmask)
"""


def forward(op: Conv, signature: str) -> str:
    """The launch; its locals are underscored so that no forward argument (a residual called
    ``y``, say) is shadowed before the epilogue operands are passed. Channels-last moves the
    input's channel dim, and the weight's input-channel dim (0 for a transposed convolution's
    ``(C_in, C_out / groups, k...)``), innermost in memory."""
    bias = op.bias or "_y"      # any tensor; never read without HAS_BIAS
    wc = 0 if op.transposed else 1
    extra = f", {op.output_padding}" if op.transposed else ""
    n = op.dims
    pad = "1" if op.transposed else f"{PAD_CHANNELS} if {op.groups} == 1 else 1"
    borders = "" if op.transposed else f", BORDERS=not _inside(_g, {n}), RUN=_run, PER_IMAGE=_per"
    borders += ", DIRECT=bool(DIRECT)" if _few(op) else ""
    rows_grid = (f"math.prod(_g[{4 + 3 * n}:{4 + 4 * n}]) * triton.cdiv(_g[0] * math.prod("
                 f"-(-o // s) for o, s in zip(_pix, _g[{4 + 3 * n}:{4 + 4 * n}])), BLOCK_M)"
                 if op.transposed else "_m")
    rows = "" if op.transposed else "\n    _m, _run, _per = _rows(_g[0], math.prod(_pix), BLOCK_M)"
    return f"""
def forward(self, {signature}):
    _x, _w = {op.x}, {op.weight}
    if CHANNELS_LAST:
        _pad = {pad}
        _x, _w = _channels_last(_x, 1, _pad), _channels_last(_w, {wc}, _pad)
    _g = _geometry(_x, _w, {op.stride}, {op.padding}, {op.dilation}, {op.groups}{extra})
    _pix = _g[4 + {op.dims}:4 + {2 * op.dims}]{rows}
    _y = torch.empty((_g[0], _g[2] * _g[3], *_pix), device=_x.device, dtype=_x.dtype)
    _bn, _bk = _tile(BLOCK_N, _g[2]), _tile(BLOCK_K, _g[1] * math.prod(_w.shape[2:]))
    _grid = ({rows_grid}, triton.cdiv(_g[2], _bn), _g[3])
    _sw = _w.stride()
    {op.name}_kernel[_grid](_x, _w, {bias}, _y, *_x.stride(), _sw[{1 - wc}], _sw[{wc}], *_sw[2:], {bias}.stride(0),
                         *_g{call_args(op)},
                         HAS_BIAS={op.bias is not None}, BLOCK_M=BLOCK_M, BLOCK_N=_bn,
                         BLOCK_K=_bk, CHANNELS_INNER=bool(CHANNELS_LAST){borders}, num_warps=num_warps,
                         num_stages=num_stages)
    return _y
"""


def render(op: Conv, signature: str, imports: list[str], init: str, what: str) -> tuple[str, str]:
    helper = common.OPERAND_HELPER if not all(op.channel) else ""
    source = (common.header(f"Template: {op.name} as an implicit GEMM ({what}) with the epilogue fused "
                            f"before the store; {op.precision} dots.", imports)
              + common.tunables(tune_values(op), seed(op), common.resources(RESOURCES, op.precision))
              + f"STARTS = {starts(op)!r}\n" + GEOMETRY_HELPER
              + ("" if op.transposed else INSIDE_HELPER + ROWS_HELPER)
              + common.TILE_HELPER + helper
              + common.DOT_HELPER + kernel(op) + common.model_class(init, forward(op, signature)))
    return source, f"template: {op.name} ({what}) as implicit GEMM with fused epilogue"
